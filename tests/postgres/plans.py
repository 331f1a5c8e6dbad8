"""Reading ``EXPLAIN (ANALYZE, FORMAT JSON)`` plans in the plan tests."""

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


def rows_handled(node: dict[str, Any]) -> int:
    """Rows every node of the plan produced or dropped (filters, join filters), over
    all its loops: the work a nested loop that compares every pair shows as a square."""
    removed = node.get("Rows Removed by Filter", 0) + node.get("Rows Removed by Join Filter", 0)
    own: int = (node["Actual Rows"] + removed) * node["Actual Loops"]
    return own + sum(rows_handled(child) for child in node.get("Plans", []))


def seq_scan_rows(node: dict[str, Any], relation: str) -> int:
    """Rows the plan's sequential scans of ``relation`` read over all their loops."""
    own = 0
    if node["Node Type"] == "Seq Scan" and node.get("Relation Name") == relation:
        own = (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * node["Actual Loops"]
    return own + sum(seq_scan_rows(child, relation) for child in node.get("Plans", []))
