"""Reading ``EXPLAIN (ANALYZE, FORMAT JSON)`` plans in the dispatch tests."""

from __future__ import annotations

from typing import Any


def index_rows(node: dict[str, Any], index: str, *, filtered: bool = False) -> int:
    """Rows the plan's scans of ``index`` returned over all their loops (``filtered``:
    with the entries their filters dropped, so every entry the scans went through)."""
    own = 0
    if node.get("Index Name") == index:
        rows = node["Actual Rows"] + (node.get("Rows Removed by Filter", 0) if filtered else 0)
        own = rows * node["Actual Loops"]
    return own + sum(index_rows(child, index, filtered=filtered) for child in node.get("Plans", []))
