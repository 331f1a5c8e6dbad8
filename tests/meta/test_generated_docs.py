"""Generated documentation stays current."""

from __future__ import annotations

from pathlib import Path

from taskq.backend.statemachine import to_mermaid

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_state_machine_diagram_is_current() -> None:
    text = (DOCS / "state_machine.md").read_text()
    block = text.split("```mermaid\n", 1)[1].split("```", 1)[0]
    assert block == to_mermaid(), "regenerate docs/state_machine.md (see its header)"
