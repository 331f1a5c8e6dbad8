"""``taskq jobs list|show|retry|cancel`` against a real Postgres schema."""

from __future__ import annotations

import asyncio
import json
import os
from datetime import timedelta
from uuid import uuid4

import pytest

from taskq import JobStatus, TaskQ
from tests.apps import basic
from tests.cli.cli_helpers import APP, Cli, clean_env, error_line, run

pytestmark = pytest.mark.postgres


def test_list_filters_and_formats(cli: Cli) -> None:
    first, later, other, cancelled = cli.seed(
        ("nap", {"tag": "first"}, {}),
        ("nap", {}, {"delay": 3600}),
        ("nap_sync", {}, {}),
        ("always_fails", {}, {}),
    )
    assert cli.on_backend(lambda b: b.write_cancel_request(cancelled.id, None))

    everything = cli.json("jobs", "list")
    assert [j["id"] for j in everything] == [str(j.id) for j in (cancelled, other, later, first)]
    assert everything[-1]["payload"] == {"seconds": 0.0, "tag": "first"}

    def ids(*args: str) -> set[str]:
        return {j["id"] for j in cli.json("jobs", "list", *args)}

    assert ids("--status", "scheduled", "cancelled") == {str(later.id), str(cancelled.id)}
    assert ids("--active", "--queue", "default") == {str(first.id), str(later.id)}
    assert ids("--finished") == {str(cancelled.id)}
    # Cut short: the newest, and a hint on stderr (stdout stays the JSON array).
    cut = cli.taskq("jobs", "list", "--actor", "nap", "--limit", "1", "--json")
    assert cut.returncode == 0, cut.stderr
    assert [j["id"] for j in json.loads(cut.stdout)] == [str(later.id)]
    assert cut.stderr.startswith("showing the newest 1; more jobs match"), cut.stderr
    assert cut.stderr.rstrip().endswith(f"see the next page with --before {later.id}")
    page = cli.taskq("jobs", "list", "--actor", "nap", "--limit", "1", "--before", str(later.id))
    assert page.returncode == 0 and page.stderr == "", page.stderr  # the last page
    assert [line.split()[0] for line in page.stdout.splitlines()[1:]] == [str(first.id)]
    gone = cli.taskq("jobs", "list", "--before", str(uuid4()))
    assert gone.returncode == 1 and "no job" in gone.stderr, gone.stderr
    assert ids("--actor", "nap", "--limit", "2") == {str(first.id), str(later.id)}

    # --dsn and --schema instead of the environment
    listed = run(
        "taskq", "jobs", "list", "--dsn", cli.pg.dsn, "--schema", cli.pg.name, env=clean_env()
    )
    assert listed.returncode == 0, listed.stderr
    header, *lines = listed.stdout.splitlines()
    assert header.split() == [
        "id", "actor", "queue", "status", "attempt", "created_at", "finished/scheduled"
    ]  # fmt: skip
    assert len(lines) == 4
    # aligned: every column starts where its header does
    starts = [header.index(name) for name in ("actor", "queue", "status", "attempt")]
    for line, job in zip(lines, (cancelled, other, later, first), strict=True):
        assert line.startswith(str(job.id))
        assert [line[s:].split()[0] for s in starts] == [
            job.actor, job.queue, "cancelled" if job is cancelled else job.status.value, "0/3"
        ]  # fmt: skip


def test_a_list_cut_short_at_the_maximum_limit_says_more_jobs_match(cli: Cli) -> None:
    # --limit 9999 said so; --limit 10000 (the maximum) asked for 10,000 rows, not one
    # more, and never did.
    async def seed() -> int:
        app = TaskQ(cli.pg.dsn, schema=cli.pg.name, actors=basic.tq.actors.values())
        async with app:
            items = [("nap", {"seconds": 0})] * 10_000 + [("nap_sync", {})]
            return await app.client.enqueue_batch_fast(items)

    assert asyncio.run(seed()) == 10_001
    cut = cli.taskq("jobs", "list", "--limit", "10000", "--json")
    assert cut.returncode == 0, cut.stderr
    assert len(json.loads(cut.stdout)) == 10_000
    assert cut.stderr.startswith("showing the newest 10000; more jobs match"), cut.stderr
    # Exactly the maximum matching: all shown, nothing more said.
    whole = cli.taskq("jobs", "list", "--actor", "nap", "--limit", "10000", "--json")
    assert whole.returncode == 0 and whole.stderr == "", whole.stderr
    assert len(json.loads(whole.stdout)) == 10_000
    # The maximum itself stays where it was.
    past = cli.taskq("jobs", "list", "--limit", "10001")
    assert past.returncode == 1
    assert "--limit: must be between 1 and 10000, got 10001" in past.stderr


def test_show_retry_and_refusals_after_a_worker_ran(cli: Cli) -> None:
    succeeded, failed = cli.seed(("nap", {}, {}), ("always_fails", {}, {}))
    cli.work_until_idle()

    text = cli.ok("jobs", "show", str(failed.id))
    assert "status:       failed" in text
    assert "error:        RuntimeError: boom" in text
    attempts = text.split("attempts:\n")[1].split("\n\n")[0].splitlines()[1:]
    assert [a.split()[:2] for a in attempts] == [["1", "failed"], ["2", "failed"], ["3", "failed"]]
    assert all(a.endswith("RuntimeError: boom") for a in attempts)
    events = text.split("events:\n")[1].splitlines()[1:]
    assert "from_state=running to_state=failed" in events[-1]
    # A dispatch's, with its worker id: the whole transition shows, uncut.
    assert "from_state=pending to_state=running worker_id=" in events[0]
    assert not events[0].endswith("...")

    shown = cli.json("jobs", "show", str(failed.id))
    assert set(shown) == {"job", "attempts", "events"}
    assert [a["error"]["message"] for a in shown["attempts"]] == ["boom"] * 3
    assert shown["events"][-1]["detail"]["to_state"] == "failed"

    assert cli.ok("jobs", "retry", str(failed.id)) == f"job {failed.id} is pending again\n"
    retried = cli.json("jobs", "show", str(failed.id))["job"]
    assert retried["status"] == "pending"
    # One more attempt, as its help says (it said nothing of how many).
    assert (retried["attempt"], retried["max_attempts"]) == (3, 4)
    assert "gets one more (not a new max_attempts)" in " ".join(
        cli.ok("jobs", "retry", "--help").split()
    )

    refused = error_line(cli.taskq("jobs", "retry", str(succeeded.id)))
    assert f"job {succeeded.id} cannot be retried: it is succeeded" in refused


def test_cancel_pending_running_and_finished_jobs(cli: Cli) -> None:
    waiting, running = cli.seed(("nap", {}, {}), ("nap_sync", {}, {}))

    # what a worker's dispatch does, without a worker that would finish the job
    [row] = cli.on_backend(lambda b: b.dispatch_batch(uuid4(), ["other"], 1, timedelta(minutes=5)))
    assert row.id == running.id

    said = cli.ok("jobs", "cancel", str(waiting.id), "--reason", "not needed")
    assert said == f"job {waiting.id} cancelled\n"
    job = cli.json("jobs", "show", str(waiting.id))["job"]
    assert (job["status"], job["cancel_reason"]) == ("cancelled", "not needed")

    said = cli.ok("jobs", "cancel", str(running.id))
    assert said.startswith(f"cancel requested for job {running.id} (running)")
    job = cli.json("jobs", "show", str(running.id))["job"]
    assert job["status"] == JobStatus.RUNNING and job["cancel_requested_at"] is not None

    refused = error_line(cli.taskq("jobs", "cancel", str(waiting.id)))
    assert "cannot be cancelled: it already finished (cancelled)" in refused


def test_a_malformed_before_id_is_said_before_connecting() -> None:
    # Read after connecting, it waited for a server (an embedded one's start, an
    # unreachable one's timeout) and then blamed the server, not the typo.
    nowhere = "postgresql://taskq@127.0.0.1:1/none"  # port 1: refused, were it tried
    result = run("taskq", "jobs", "list", "--before", "12345", "--dsn", nowhere, env=clean_env())
    assert "'12345' is not a job id" in error_line(result)


@pytest.mark.parametrize("action", ["show", "retry", "cancel"])
def test_unknown_and_malformed_ids(cli: Cli, action: str) -> None:
    unknown = str(uuid4())
    assert error_line(cli.taskq("jobs", action, unknown)) == (
        f"taskq: error: no job {unknown} (a finished job moves to the archive once its "
        f"status's retention, TASKQ_PRUNE_RETENTION_<STATUS>, has passed)"
    )
    malformed = error_line(cli.taskq("jobs", action, "12345"))
    assert "'12345' is not a job id" in malformed


def test_text_output_escapes_what_a_terminal_would_act_on(cli: Cli) -> None:
    # A queue name or a cancel reason is anyone's text: printed raw, '\x1b]0;...\x07'
    # retitled the operator's terminal and '\x1b[2J' cleared it.
    [row] = cli.seed(("nap", {}, {"queue": "q\x1b[31mred"}))
    cli.ok("jobs", "cancel", str(row.id), "--reason", "\x1b]0;PWNED\x07\x1b[2J\u202egnp.exe")
    listed = cli.ok("jobs", "list", "--queue", "q\x1b[31mred")
    shown = cli.ok("jobs", "show", str(row.id))
    for out in (listed, shown):
        assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "q\\x1b[31mred" in listed
    assert "\\x1b]0;PWNED\\x07\\x1b[2J\\u202egnp.exe" in shown
    assert cli.json("jobs", "show", str(row.id))["job"]["cancel_reason"].startswith("\x1b]0;")


def test_a_read_only_database_refusing_a_write_is_one_line_not_a_traceback(cli: Cli) -> None:
    # A standby (a read replica, a primary a failover demoted) or a role or database
    # with default_transaction_read_only: every write was the driver's traceback.
    [row] = cli.seed(("nap", {}, {}))
    separator = "&" if "?" in cli.pg.dsn else "?"
    read_only = f"{cli.pg.dsn}{separator}default_transaction_read_only=on"
    env = clean_env(TASKQ_DSN=read_only, TASKQ_SCHEMA=cli.pg.name)
    for action in (
        ("jobs", "cancel", str(row.id)),
        ("enqueue", APP, "nap", "{}"),
        ("schedules", "create", "nightly", "nap", "0 3 * * *"),
    ):
        line = error_line(run("taskq", *action, env=env))
        assert "refused a write: cannot execute " in line, (action, line)
        assert line.endswith("at the primary, or have the setting reset"), line
    # Reads still work there, and nothing was written.
    listed = run("taskq", "jobs", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert [(j["id"], j["status"]) for j in json.loads(listed.stdout)] == [(str(row.id), "pending")]
    assert cli.json("schedules", "list") == []


@pytest.mark.parametrize("action", [("jobs", "list"), ("jobs", "show", str(uuid4()))])
def test_a_statement_the_database_gives_up_on_is_one_line_not_a_traceback(
    cli: Cli, action: tuple[str, ...]
) -> None:
    # A role's lock_timeout (or statement_timeout) met after the command connected, or a
    # connection cut then: the driver's traceback came out of every `taskq` command.
    import psycopg
    from psycopg import sql

    separator = "&" if "?" in cli.pg.dsn else "?"
    bounded = f"{cli.pg.dsn}{separator}lock_timeout=100"
    with psycopg.connect(cli.pg.dsn) as holder:
        holder.execute(
            sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                sql.Identifier(cli.pg.name, "jobs")
            )
        )
        result = run("taskq", *action, env=clean_env(TASKQ_DSN=bounded, TASKQ_SCHEMA=cli.pg.name))
        holder.rollback()
    line = error_line(result)
    assert line.startswith(
        "taskq: error: the database failed the command (LockNotAvailableError: "
        "canceling statement due to lock timeout); check that it is reachable"
    ), line
    assert cli.json("jobs", "list") == []  # the lock gone, the same command works


def test_ctrl_c_mid_command_exits_1_saying_so(cli: Cli) -> None:
    # Interrupted, a command exited 1 in silence.
    import subprocess

    import psycopg
    from psycopg import sql

    from tests.cli.cli_helpers import BIN, REPO, interrupt_once_blocked

    with psycopg.connect(cli.pg.dsn) as holder:
        holder.execute(
            sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                sql.Identifier(cli.pg.name, "jobs")
            )
        )
        listing = subprocess.Popen(
            [str(BIN / "taskq"), "jobs", "list"],
            cwd=REPO,
            env=cli.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        out, err = interrupt_once_blocked(listing, cli.pg.dsn, holder.info.backend_pid)
        holder.rollback()
    assert listing.returncode == 1
    assert out == ""
    assert err.strip() == (
        "taskq: interrupted (a change the command was making may have been made: "
        "`taskq jobs list` shows)"
    )


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_output_that_cannot_be_written_is_not_blamed_on_the_database(cli: Cli) -> None:
    import subprocess

    from tests.cli.cli_helpers import BIN, REPO

    cli.seed(*[("nap", {}, {})] * 200)
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [str(BIN / "taskq"), "jobs", "list"],
            cwd=REPO,
            env=cli.env(),
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=90,
            check=False,
        )
    assert result.returncode != 0
    assert "the database failed" not in result.stderr
    assert "No space left on device" in result.stderr


def test_text_a_terminals_encoding_cannot_hold_is_escaped_not_a_traceback(cli: Cli) -> None:
    # On a latin-1 (or Windows cp1252) stdout, a queue name or payload in another script
    # raised UnicodeEncodeError: a traceback, and the list not shown.
    [row] = cli.seed(("nap", {"tag": "日本"}, {"queue": "キュー"}))
    env = cli.env(PYTHONIOENCODING="latin-1")
    for args in (("jobs", "list"), ("jobs", "show", str(row.id))):
        result = run("taskq", *args, env=env)
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
        assert "\\u30ad\\u30e5\\u30fc" in result.stdout  # キュー
        assert str(row.id) in result.stdout


def test_columns_stay_aligned_after_wide_and_combining_characters(cli: Cli) -> None:
    # Widths were counted in characters: a queue in CJK (two columns a character) or
    # with a combining accent (none) pushed the columns after it out of line. A
    # nonspacing mark of combining class 0 (Thai's vowel sign ี, Devanagari's anusvara
    # ं) takes none either: counted one, a Thai queue pushed them out again.
    import unicodedata

    def columns(text: str) -> int:
        return sum(
            0
            if unicodedata.category(c) in ("Mn", "Me")
            else 2
            if unicodedata.east_asian_width(c) in "WF"
            else 1
            for c in text
        )

    cli.seed(
        ("nap", {}, {"queue": "キュー"}),
        ("nap", {}, {"queue": "cafe\u0301"}),
        ("nap", {}, {"queue": "\u0e17\u0e35\u0e48"}),  # ที่: one column
    )
    header, *lines = cli.ok("jobs", "list", "--active").splitlines()
    assert len(lines) == 3
    for line in lines:
        before_status = line[: line.index("pending")]
        assert columns(before_status) == header.index("status"), line


def test_a_running_job_that_ends_as_its_cancel_is_requested_is_not_said_to_see_it(
    cli: Cli,
) -> None:
    # The request landed on a running job that then ended before the command read it
    # back: "cancel requested for job ... (succeeded): its actor sees ctx.cancel_event",
    # of an actor that had returned. A trigger ends the job right after the request.
    import psycopg
    from psycopg import sql

    [job] = cli.seed(("nap_sync", {}, {}))
    [row] = cli.on_backend(lambda b: b.dispatch_batch(uuid4(), ["other"], 1, timedelta(minutes=5)))
    assert row.id == job.id
    jobs = sql.Identifier(cli.pg.name, "jobs")
    with psycopg.connect(cli.pg.dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "UPDATE {jobs} SET status = 'succeeded', finished_at = clock_timestamp() "
                "WHERE id = NEW.id; RETURN NULL; END $$"
            ).format(fn=sql.Identifier(cli.pg.name, "end_on_request"), jobs=jobs)
        )
        conn.execute(
            sql.SQL(
                "CREATE TRIGGER end_on_request AFTER UPDATE OF cancel_requested_at ON {jobs} "
                "FOR EACH ROW WHEN (NEW.status = 'running') EXECUTE FUNCTION {fn}()"
            ).format(jobs=jobs, fn=sql.Identifier(cli.pg.name, "end_on_request"))
        )
    said = cli.ok("jobs", "cancel", str(job.id))
    assert said == f"cancel requested for job {job.id}, but it ended succeeded first\n"
    assert cli.json("jobs", "show", str(job.id))["job"]["status"] == "succeeded"
