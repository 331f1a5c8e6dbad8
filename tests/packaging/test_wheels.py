"""The built wheels install piece by piece, as users install them."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from .conftest import find_dist, run_in

pytestmark = [pytest.mark.packaging, pytest.mark.xdist_group("packaging")]

DISTRIBUTIONS = [
    "taskq-core",
    "taskq-postgres",
    "taskq-ratelimit-redis",
    "taskq-admin",
    "taskq-otel",
    "taskq-testing",
]
FORBIDDEN_IN_CORE = ["asyncpg", "psycopg", "redis", "fastapi", "opentelemetry"]


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_every_distribution_builds_an_sdist_and_a_typed_wheel(
    built_dists: Path, distribution: str
) -> None:
    find_dist(built_dists, distribution, ".tar.gz")
    wheel = find_dist(built_dists, distribution, ".whl")
    names = zipfile.ZipFile(wheel).namelist()
    package = "taskq" if distribution == "taskq-core" else distribution.replace("-", "_")
    assert f"{package}/__init__.py" in names
    assert f"{package}/py.typed" in names
    # The license text travels with every distribution, not only its name.
    [license_file] = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    assert "MIT License" in zipfile.ZipFile(wheel).read(license_file).decode()


def test_migrations_ship_inside_the_postgres_wheel(built_dists: Path) -> None:
    wheel = find_dist(built_dists, "taskq-postgres", ".whl")
    sql = [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".sql")]
    repo_sql = sorted(p.name for p in (Path(__file__).parents[2] / "migrations").glob("*.sql"))
    assert repo_sql, "the repository has no migrations"
    assert sorted(Path(n).name for n in sql) == repo_sql
    assert all(n.startswith("taskq_postgres/migrations/") for n in sql)


def test_core_and_postgres_install_alone_and_core_imports_no_driver(
    built_dists: Path, fresh_venv: Callable[..., Path]
) -> None:
    venv = fresh_venv(
        find_dist(built_dists, "taskq-core", ".whl"),
        find_dist(built_dists, "taskq-postgres", ".whl"),
    )
    script = f"""
import importlib, pkgutil, sys, json
import taskq, taskq_postgres
for mod in pkgutil.walk_packages(taskq.__path__, "taskq."):
    if not mod.name.endswith("__main__"):
        importlib.import_module(mod.name)
leaked = sorted({{m.split(".")[0] for m in sys.modules}} & set({FORBIDDEN_IN_CORE!r}))
others = sorted(m for m in sys.modules if m.startswith(("taskq_admin", "taskq_otel", "taskq_testing", "taskq_ratelimit")))
print(json.dumps({{"leaked": leaked, "others": others}}))
"""
    proc = run_in(venv, "python", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == '{"leaked": [], "others": []}'
    # the drivers are there (installed by taskq-postgres), so the check above is real
    proc = run_in(venv, "python", "-c", "import asyncpg, psycopg")
    assert proc.returncode == 0, proc.stderr

    migrations = run_in(
        venv,
        "python",
        "-c",
        "import importlib.resources as r; "
        "print(sorted(p.name for p in (r.files('taskq_postgres') / 'migrations').iterdir()))",
    )
    assert migrations.returncode == 0, migrations.stderr
    assert ".sql" in migrations.stdout

    help_ = run_in(venv, "taskq", "--help")
    assert help_.returncode == 0, help_.stderr
    assert "usage: taskq" in help_.stdout

    worker_help = run_in(venv, "taskq-worker", "--help")
    assert worker_help.returncode == 0, worker_help.stderr
    assert "usage: taskq-worker" in worker_help.stdout

    version = run_in(venv, "taskq", "--version")
    assert version.returncode == 0, version.stderr
    lines = version.stdout.splitlines()
    assert "taskq-core 0.1.0" in lines
    assert "taskq-postgres 0.1.0" in lines
    assert not any(line.startswith("taskq-admin") for line in lines)
