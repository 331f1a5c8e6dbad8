"""The README's quick example runs as written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_quick_example_runs() -> None:
    text = README.read_text()
    example = text.split("## Quick example", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    proc = subprocess.run(
        [sys.executable, "-c", example], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "{'ok': True}" in proc.stdout
    assert "state_change" in proc.stdout
