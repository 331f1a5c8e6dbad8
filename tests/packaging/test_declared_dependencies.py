"""What each distribution's metadata says: every third-party module its code imports is
declared (one it only got through another's dependencies breaks when that other one
drops it), and its license is the repository's."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

PACKAGES = Path(__file__).resolve().parents[2] / "packages"
# An import name whose distribution is named otherwise.
_DISTRIBUTION_OF = {"pydantic_core": "pydantic-core", "taskq": "taskq-core"}


def _imported(source: Path) -> set[str]:
    """The top-level modules a package's code imports (relative imports left out)."""
    found: set[str] = set()
    for path in source.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found


def _declared(pyproject: Path) -> set[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        requirements.extend(extra)
    return {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in requirements}


@pytest.mark.parametrize("package", sorted(p.name for p in PACKAGES.iterdir() if p.is_dir()))
def test_a_distribution_declares_what_it_imports(package: str) -> None:
    root = PACKAGES / package
    # Packages only: taskq-core's src also holds a module (_taskq_entry) and, once it
    # was imported from there, its __pycache__.
    [own] = [p.name for p in (root / "src").iterdir() if (p / "__init__.py").is_file()]
    third_party = {
        name
        for name in _imported(root / "src")
        if name != own and name not in sys.stdlib_module_names and name != "__future__"
    }
    needed = {_DISTRIBUTION_OF.get(name, name).replace("_", "-") for name in third_party}
    assert needed <= _declared(root / "pyproject.toml"), f"{package} imports undeclared"


@pytest.mark.parametrize("package", sorted(p.name for p in PACKAGES.iterdir() if p.is_dir()))
def test_a_distributions_license_is_the_repositorys(package: str) -> None:
    # A copy each (an sdist may not hold a link out of its own directory): kept the same.
    license_text = (PACKAGES.parent / "LICENSE").read_text()
    assert (PACKAGES / package / "LICENSE").read_text() == license_text
    project = tomllib.loads((PACKAGES / package / "pyproject.toml").read_text())["project"]
    assert project["license-files"] == ["LICENSE"]
