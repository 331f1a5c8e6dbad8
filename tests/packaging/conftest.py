"""Build every distribution once per test session, the way a release does
(``uv build``: sdist first, then the wheel from the unpacked sdist)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def uv(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run uv through the running interpreter, failing loudly with its output."""
    proc = subprocess.run(
        [sys.executable, "-m", "uv", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**_env(), "UV_PYTHON_DOWNLOADS": "never"},
        check=False,
    )
    if proc.returncode != 0:
        raise AssertionError(f"uv {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def _env() -> dict[str, str]:
    import os

    # A workspace venv on PATH/VIRTUAL_ENV must not leak into the fresh ones.
    return {
        k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT"}
    }


@pytest.fixture(scope="session")
def built_dists(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    uv("build", "--all-packages", "--out-dir", str(out), cwd=REPO)
    return out


def find_dist(dist_dir: Path, distribution: str, suffix: str) -> Path:
    stem = distribution.replace("-", "_")
    matches = sorted(dist_dir.glob(f"{stem}-*{suffix}"))
    assert len(matches) == 1, f"expected one {stem}*{suffix} in {dist_dir}, got {matches}"
    return matches[0]


@pytest.fixture
def fresh_venv(tmp_path: Path) -> Callable[..., Path]:
    """Create a virtual environment and install the given requirements into it."""

    def make(*requirements: str | Path) -> Path:
        venv = tmp_path / "venv"
        uv("venv", "--quiet", "--python", sys.executable, str(venv))
        python = venv / "bin" / "python"
        uv("pip", "install", "--quiet", "--python", str(python), *map(str, requirements))
        return venv

    return make


def run_in(
    venv: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a program from the venv's bin directory; returns the finished process."""
    exe = args[0] if args[0].startswith("/") else str(venv / "bin" / args[0])
    return subprocess.run(
        [exe, *args[1:]],
        capture_output=True,
        text=True,
        env={**_env(), **(env or {})},
        check=False,
        timeout=120,
    )
