"""The Markdown report: one row per scenario, then the issue's targets checked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench._common import FIGURES, Result

_DETAIL_KEYS = (*FIGURES, "error", "skipped", "failed_runs")
_UNITS = {"ms": "ms", "mb": "MB", "pct": "%"}


@dataclass(frozen=True)
class Target:
    """``scenario``'s throughput >= ``threshold`` x ``reference``'s; without a reference,
    ``scenario``'s ``metric`` (``<name>_<unit>`` in its extra figures) < ``threshold``."""

    label: str
    scenario: str
    reference: str | None
    threshold: float
    metric: str = "p99_ms"

    def check(self, results: dict[str, Result]) -> tuple[str, str]:
        """(measured, verdict); "n/a" when either side did not run or has no figure."""
        result = results.get(self.scenario)
        if self.reference is None:
            value = None if result is None else result.extra.get(self.metric)
            if value is None:
                return "n/a", "n/a"
            name, _, unit = self.metric.rpartition("_")
            verdict = "met" if value < self.threshold else "missed"
            return f"{name} {value} {_UNITS[unit]}", verdict
        ratio = None if result is None else result.extra.get(f"vs_{self.reference}")
        if ratio is None:
            return "n/a", "n/a"
        return f"{ratio:.2f}x", "met" if ratio >= self.threshold else "missed"


def _cell(value: Any) -> str:
    return "" if value is None else str(value).replace("|", "\\|")


def _with_runs(line: dict[str, Any], key: str) -> str:
    """``line[key]``, followed by every run's value when ``--repeat`` gave several."""
    runs = line.get(f"{key}_runs")
    value = _cell(line[key])
    return value if runs is None else f"{value} (runs: {', '.join(map(str, runs))})"


def _ratio(line: dict[str, Any], key: str) -> str:
    """A ratio, followed by each round's when ``--repeat`` gave several."""
    rounds = line.get(f"{key}_runs")
    text = f"{line[key]:.2f}x"
    return text if rounds is None else f"{text} (rounds: {', '.join(f'{r:.2f}' for r in rounds)})"


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
            f"{key.removeprefix('vs_')} {_ratio(line, key)}"
            for key in line
            if key.startswith("vs_") and not key.endswith("_runs")
        )
        details = ", ".join(f"{key} {_with_runs(line, key)}" for key in _DETAIL_KEYS if key in line)
        lines.append(
            f"| {result.scenario} | {result.n} | {_cell(line['seconds'])} | "
            f"{_with_runs(line, 'per_second')} | {ratios} | {details} |"
        )
    by_name = {r.scenario: r for r in results}
    lines += ["", "## Targets", "", "| target | measured | verdict |", "|---|---:|---|"]
    for target in targets:
        measured, verdict = target.check(by_name)
        lines.append(f"| {target.label} | {measured} | {verdict} |")
    return "\n".join(lines) + "\n"
