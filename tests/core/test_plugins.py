"""Plugin discovery and open_backend, in-process."""

from __future__ import annotations

import pytest

import taskq
from taskq.backend.memory import InMemoryBackend
from taskq.errors import (
    IncompatiblePluginError,
    PluginError,
    ProtocolKeywordMissing,
    ProtocolVersionMismatch,
    UnknownBackendError,
)
from taskq.plugins import backend_factories, get_plugin_manager
from tests.core.plugin_stubs import AddPlugin, InstallEntryPoints


def test_plugin_manager_is_loaded_once_per_process() -> None:
    assert get_plugin_manager() is get_plugin_manager()


def test_memory_scheme_is_registered_by_core() -> None:
    backend = taskq.open_backend("memory://")
    assert isinstance(backend, InMemoryBackend)
    assert backend_factories()["memory"][1] == "taskq-core"


def test_unknown_scheme_lists_installed_schemes() -> None:
    with pytest.raises(UnknownBackendError) as info:
        taskq.open_backend("nosuchthing://host/db")
    message = str(info.value)
    assert "'nosuchthing'" in message
    assert "memory" in message
    assert isinstance(info.value, ValueError)


def test_a_sqlalchemy_url_is_told_to_drop_its_driver() -> None:
    # An application's DATABASE_URL=postgresql+asyncpg://... was "no installed backend
    # handles 'postgresql+asyncpg'", postgresql listed among the installed ones.
    with pytest.raises(UnknownBackendError) as info:
        taskq.open_backend("memory+fast://x")
    message = str(info.value)
    assert "The +fast names a driver, as in a SQLAlchemy URL" in message
    assert "give the URL as memory://..." in message


def test_unknown_first_party_scheme_names_the_distribution_that_adds_it(
    add_plugin: AddPlugin,
) -> None:
    pm = get_plugin_manager()
    blocked = pm.get_plugin("postgres")
    if blocked is not None:  # its plugin is not registered: as if it had failed to load
        pm.unregister(name="postgres")
    try:
        with pytest.raises(UnknownBackendError, match="It comes with taskq-postgres, which is"):
            taskq.open_backend("postgresql://localhost/app")
    finally:
        if blocked is not None:
            pm.register(blocked, name="postgres")


def test_url_without_scheme_is_refused() -> None:
    with pytest.raises(ValueError, match="not a backend URL"):
        taskq.open_backend("localhost/app")


def test_a_third_party_claiming_memory_leaves_it_to_core(add_plugin: AddPlugin) -> None:
    class Impostor(InMemoryBackend):
        pass

    add_plugin("dupe", taskq_backends=lambda: {"memory": lambda url: Impostor()})
    backend = taskq.open_backend("memory://")
    assert type(backend) is InMemoryBackend
    assert backend_factories()["memory"][1] == "taskq-core"


def test_backend_with_another_protocol_version_is_refused(add_plugin: AddPlugin) -> None:
    class OldBackend(InMemoryBackend):
        BACKEND_PROTOCOL_VERSION = 2

    add_plugin("old", taskq_backends=lambda: {"old": lambda url: OldBackend()})
    with pytest.raises(ProtocolVersionMismatch, match="protocol 2.*speaks protocol 3"):
        taskq.open_backend("old://")


def test_object_missing_protocol_members_is_refused(add_plugin: AddPlugin) -> None:
    class Half:
        BACKEND_PROTOCOL_VERSION = 3

    add_plugin("half", taskq_backends=lambda: {"half": lambda url: Half()})
    with pytest.raises(IncompatiblePluginError, match="missing: .*dispatch_batch"):
        taskq.open_backend("half://")


def test_a_backend_written_against_a_draft_of_its_version_is_refused(
    add_plugin: AddPlugin,
) -> None:
    # Declaring protocol 3 but predating its batch_ends, it passed the loader and met a
    # TypeError in a worker's stop or its leader's sweep.
    class Draft(InMemoryBackend):
        async def cancel_where(self, filter: object, reason: str | None = None) -> object:  # type: ignore[override]
            raise AssertionError("never called")

    add_plugin("draft", taskq_backends=lambda: {"draft": lambda url: Draft()})
    with pytest.raises(
        ProtocolKeywordMissing, match=r"Draft from draft declares backend protocol 3 but lacks"
    ) as refused:
        taskq.open_backend("draft://")
    assert "cancel_where(*, batch_ends)" in str(refused.value)


def test_a_backend_without_simulation_or_transactions_is_refused(
    add_plugin: AddPlugin,
) -> None:
    class NoTransactions(InMemoryBackend):
        supports_transactional_simulation = False  # but no transaction(): sub-jobs unsafe

    add_plugin("notx", taskq_backends=lambda: {"notx": lambda url: NoTransactions()})
    with pytest.raises(IncompatiblePluginError, match="missing: transaction"):
        taskq.open_backend("notx://")


def test_a_failing_hook_does_not_hide_other_plugins(add_plugin: AddPlugin) -> None:
    def explode() -> dict[str, object]:
        raise RuntimeError("boom")

    add_plugin("exploding", taskq_backends=explode)
    assert isinstance(taskq.open_backend("memory://"), InMemoryBackend)


_GOOD = """
    from taskq.backend.memory import InMemoryBackend
    from taskq.plugins import hookimpl

    @hookimpl
    def taskq_backends():
        return {"good": lambda url: InMemoryBackend()}
"""


def test_a_plugin_with_a_misspelt_hook_is_reported_and_the_others_still_load(
    entry_points: InstallEntryPoints,
) -> None:
    misspelt = """
        from taskq.plugins import hookimpl

        @hookimpl
        def taskq_backend():
            return {}
    """
    entry_points(misspelt=misspelt, good=_GOOD)
    [failure] = taskq.plugins.plugin_failures()
    assert failure.name == "misspelt" and "taskq_backend" in str(failure)
    assert "misspelt" not in [p.name for p in taskq.plugins.loaded_plugins()]
    assert isinstance(taskq.open_backend("good://"), InMemoryBackend)


def test_a_backends_hook_returning_no_mapping_is_skipped(
    entry_points: InstallEntryPoints,
) -> None:
    entry_points(
        empty="""
            from taskq.plugins import hookimpl

            @hookimpl
            def taskq_backends():
                return None
        """,
        good=_GOOD,
    )
    assert isinstance(taskq.open_backend("good://"), InMemoryBackend)
    assert isinstance(taskq.open_backend("memory://"), InMemoryBackend)


def test_transient_errors_keep_only_exception_classes(add_plugin: AddPlugin) -> None:
    from taskq.worker._transient import transient_errors

    add_plugin("odd", taskq_transient_errors=lambda: (KeyError, "nope", None))
    transient_errors.cache_clear()
    try:
        kinds = transient_errors()
    finally:
        transient_errors.cache_clear()
    assert KeyError in kinds and OSError in kinds
    assert all(isinstance(k, type) and issubclass(k, BaseException) for k in kinds)


def test_transient_errors_leave_out_cancellation_and_exception_itself(
    add_plugin: AddPlugin,
) -> None:
    # Each was caught by every worker loop as a blip: a stop's CancelledError swallowed
    # (the stop hung until the watchdog), and every bug retried in silence.
    import asyncio

    from taskq.worker._transient import transient_errors

    add_plugin(
        "broad",
        taskq_transient_errors=lambda: (
            asyncio.CancelledError,
            KeyboardInterrupt,
            Exception,
            ConnectionResetError,
        ),
    )
    transient_errors.cache_clear()
    try:
        kinds = transient_errors()
    finally:
        transient_errors.cache_clear()
    assert ConnectionResetError in kinds
    assert not {asyncio.CancelledError, KeyboardInterrupt, Exception} & set(kinds)
    failures = [f for f in taskq.plugins.plugin_failures() if f.name == "broad"]
    assert len(failures) == 1 and "narrower than Exception" in str(failures[0])


def test_a_scheme_claimed_twice_names_the_entry_points_to_disable(
    entry_points: InstallEntryPoints,
) -> None:
    entry_points(first=_GOOD, second=_GOOD.replace("InMemoryBackend()", "InMemoryBackend() "))
    with pytest.raises(
        PluginError, match="TASKQ_DISABLE_PLUGINS=first or TASKQ_DISABLE_PLUGINS=second"
    ):
        taskq.open_backend("good://")


def test_a_factory_gets_the_worker_settings_it_names_or_all_with_options(
    add_plugin: AddPlugin,
) -> None:
    # A worker passes command_timeout (and TASKQ_POLL_ONLY, pool sizes, the schema) to
    # every backend: a third party's factory that did not name them failed to build.
    from datetime import timedelta

    from taskq.settings import WorkerSettings

    seen: dict[str, dict[str, object]] = {}

    def named(url: str, *, poll_only: bool = False, flavour: str = "plain") -> InMemoryBackend:
        seen["named"] = {"poll_only": poll_only, "flavour": flavour}
        return InMemoryBackend()

    def catch_all(url: str, **options: object) -> InMemoryBackend:
        seen["catch_all"] = options
        return InMemoryBackend()

    add_plugin("picky", taskq_backends=lambda: {"named": named, "catchall": catch_all})
    tuning = {**WorkerSettings.load({}).backend_options(), "poll_only": True}
    assert "command_timeout" in tuning
    assert isinstance(
        taskq.open_backend("named://", schema="s", flavour="mint", **tuning), InMemoryBackend
    )
    taskq.open_backend("catchall://", schema="s", **tuning)
    assert seen["named"] == {"poll_only": True, "flavour": "mint"}
    assert seen["catch_all"] == {"schema": "s", **tuning}
    assert tuning["command_timeout"] == timedelta(seconds=5)
    with pytest.raises(PluginError, match="flavor"):  # not a setting: still its error
        taskq.open_backend("named://", flavor="mint")


def test_a_scheme_is_found_whatever_its_case_and_one_no_url_can_have_is_reported(
    add_plugin: AddPlugin,
) -> None:
    # MyDB was listed among the installed schemes, and MyDB:// said it was unknown;
    # my_db was listed too, and my_db:// said it was no URL.
    add_plugin("cased", taskq_backends=lambda: {"MyDB": lambda url: InMemoryBackend()})
    add_plugin("underscored", taskq_backends=lambda: {"my_db": lambda url: InMemoryBackend()})
    assert isinstance(taskq.open_backend("MyDB://"), InMemoryBackend)
    assert isinstance(taskq.open_backend("mydb://"), InMemoryBackend)
    assert "my_db" not in taskq.plugins.backend_factories()
    [failure] = taskq.plugins.plugin_failures()
    assert failure.name == "underscored" and "a letter, then letters, digits" in str(failure)
