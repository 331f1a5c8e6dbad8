"""A third party ships a backend as a plugin: built, installed, discovered."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from .conftest import find_dist, run_in, uv

pytestmark = [pytest.mark.packaging, pytest.mark.xdist_group("packaging")]


def _write_distribution(root: Path, name: str, module_body: str) -> Path:
    """Write a minimal hatchling distribution ``name`` with one `taskq` entry point."""
    package = name.replace("-", "_")
    project = root / name
    (project / "src" / package).mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [build-system]
            requires = ["hatchling"]
            build-backend = "hatchling.build"

            [project]
            name = "{name}"
            version = "1.2.3"
            dependencies = ["taskq-core"]

            [project.entry-points.taskq]
            {name.removeprefix("taskq-")} = "{package}._plugin"
            """
        )
    )
    (project / "src" / package / "__init__.py").write_text("")
    (project / "src" / package / "_plugin.py").write_text(textwrap.dedent(module_body))
    return project


THIRD_PARTY = """
    from taskq.backend.memory import InMemoryBackend
    from taskq.plugins import hookimpl


    class ThirdPartyBackend(InMemoryBackend):
        def __init__(self, url: str, **options: object) -> None:
            super().__init__()
            self.url = url
            self.options = options


    def strict(url: str) -> ThirdPartyBackend:  # names no option
        return ThirdPartyBackend(url)


    @hookimpl
    def taskq_backends():
        return {"thirdparty": ThirdPartyBackend, "strict": strict}
"""

BROKEN = """
    raise RuntimeError("this plugin is broken on purpose")
"""


def test_third_party_backend_is_discovered_and_a_broken_plugin_is_reported(
    tmp_path: Path, built_dists: Path, fresh_venv: Callable[..., Path]
) -> None:
    out = tmp_path / "dist"
    for name, body in [("taskq-thirdparty", THIRD_PARTY), ("taskq-broken", BROKEN)]:
        project = _write_distribution(tmp_path, name, body)
        uv("build", "--wheel", "--out-dir", str(out), str(project))
    venv = fresh_venv(find_dist(built_dists, "taskq-core", ".whl"), *sorted(out.glob("*.whl")))

    script = """
import json
import taskq
from taskq.plugins import plugin_failures, loaded_plugins
backend = taskq.open_backend("thirdparty://x", flavour="mint")
print(json.dumps({
    "type": type(backend).__name__,
    "url": backend.url,
    "options": backend.options,
    "is_backend": isinstance(backend, taskq.Backend),
    "failures": [[f.name, f.distribution, str(f)] for f in plugin_failures()],
    "plugins": [p.name for p in loaded_plugins()],
}))
"""
    proc = run_in(venv, "python", "-c", script)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["type"] == "ThirdPartyBackend"
    assert result["url"] == "thirdparty://x"
    assert result["options"] == {"flavour": "mint"}
    assert result["is_backend"] is True
    assert "thirdparty" in result["plugins"]
    [(name, dist, message)] = result["failures"]
    assert (name, dist) == ("broken", "taskq-broken")
    assert "this plugin is broken on purpose" in message

    listing = run_in(venv, "taskq", "plugins")
    assert listing.returncode == 1  # a failed plugin makes `taskq plugins` exit non-zero
    assert "thirdparty" in listing.stdout and "schemes: strict, thirdparty" in listing.stdout
    assert "FAILED broken (taskq-broken)" in listing.stdout
    # Logged in one line on each command, not with a traceback of 25 frames.
    [logged] = [line for line in listing.stderr.splitlines() if "plugin-load-failed" in line]
    assert "RuntimeError: this plugin is broken on purpose" in logged
    assert "Traceback" not in listing.stderr

    disabled = run_in(venv, "taskq", "plugins", "--json", env={"TASKQ_DISABLE_PLUGINS": "broken"})
    assert disabled.returncode == 0, disabled.stdout + disabled.stderr
    assert json.loads(disabled.stdout)["failures"] == []

    version = run_in(venv, "taskq", "--version")
    assert "taskq-thirdparty 1.2.3" in version.stdout.splitlines()

    # A worker on a factory that names no option: a worker offers every backend its
    # settings (command_timeout, ...), and such a factory failed on them.
    (tmp_path / "plugapp.py").write_text(
        "from taskq import TaskQ, actor\n\n"
        "@actor(name='noop')\nasync def noop(payload: dict) -> None: ...\n\n"
        "tq = TaskQ('strict://x', actors=[noop])\n"
    )
    worker = run_in(
        venv,
        "taskq-worker",
        "plugapp:tq",
        "--until-idle",
        env={"PYTHONPATH": str(tmp_path), "TASKQ_DISABLE_PLUGINS": "broken"},
    )
    assert worker.returncode == 0, worker.stderr
