"""The Markdown report: one row per scenario, then the issue's targets checked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench._common import Result

_DETAIL_KEYS = ("p50_ms", "p95_ms", "p99_ms", "max_ms", "error", "skipped")


@dataclass(frozen=True)
class Target:
    """``scenario``'s throughput >= ``threshold`` x ``reference``'s; without a reference,
    ``scenario``'s p99 < ``threshold`` milliseconds."""

    label: str
    scenario: str
    reference: str | None
    threshold: float

    def check(self, results: dict[str, Result]) -> tuple[str, str]:
        """(measured, verdict); "n/a" when either side did not run or has no figure."""
        result = results.get(self.scenario)
        if self.reference is None:
            p99 = None if result is None else result.extra.get("p99_ms")
            if p99 is None:
                return "n/a", "n/a"
            return f"p99 {p99} ms", "met" if p99 < self.threshold else "missed"
        ratio = None if result is None else result.extra.get(f"vs_{self.reference}")
        if ratio is None:
            return "n/a", "n/a"
        return f"{ratio:.2f}x", "met" if ratio >= self.threshold else "missed"


def _cell(value: Any) -> str:
    return "" if value is None else str(value).replace("|", "\\|")


def markdown(header: str, results: list[Result], targets: list[Target]) -> str:
    """The whole report."""
    lines = [
        "# TaskQ benchmark",
        "",
        header,
        "",
        "| scenario | n | seconds | per second | compared (this / that) | details |",
        "|---|---:|---:|---:|---|---|",
    ]
    for result in results:
        line = result.line()
        ratios = ", ".join(
            f"{key.removeprefix('vs_')} {value:.2f}x"
            for key, value in line.items()
            if key.startswith("vs_")
        )
        details = ", ".join(f"{key} {line[key]}" for key in _DETAIL_KEYS if key in line)
        lines.append(
            f"| {result.scenario} | {result.n} | {_cell(line['seconds'])} | "
            f"{_cell(line['per_second'])} | {ratios} | {_cell(details)} |"
        )
    by_name = {r.scenario: r for r in results}
    lines += ["", "## Targets", "", "| target | measured | verdict |", "|---|---:|---|"]
    for target in targets:
        measured, verdict = target.check(by_name)
        lines.append(f"| {target.label} | {measured} | {verdict} |")
    return "\n".join(lines) + "\n"
