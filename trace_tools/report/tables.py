"""Rich terminal tables for a run summary (the CLI prints them; the library builds them)."""
from __future__ import annotations

from typing import Any

from rich.table import Table


def headline_table(summary: dict[str, Any]) -> Table:
    table = Table(title="What each strategy would train", title_justify="left")
    for col in ("strategy", "sessions", "samples", "samples/session", "forks mean", "coverage", "trained",
                "forwarded", "context"):
        table.add_column(col, justify="left" if col == "strategy" else "right")
    for name, s in summary["strategies"].items():
        per = s["samples"] / s["sessions"] if s["sessions"] else 0.0
        table.add_row(name, str(s["sessions"]), str(s["samples"]), f"{per:.2f}", f"{s['forks']['mean']:.2f}",
                      _pct(s["coverage"]), f"{s['trained_tokens']:,}", f"{s['forwarded_tokens']:,}",
                      f"{s['context_tokens']:,}")
    return table


def tool_table(summary: dict[str, Any]) -> Table:
    """Coverage by tool: token coverage % with dropped-turn % beneath, one column per strategy."""
    table = Table(title="Coverage by tool: token coverage (dropped turns %)", title_justify="left")
    table.add_column("tool")
    table.add_column("turns", justify="right")
    for name in summary["strategies"]:
        table.add_column(name, justify="right")
    tools = sorted({t for s in summary["strategies"].values() for t in s["tool_turns"]})
    for tool in tools:
        cells, turns = [], 0
        for s in summary["strategies"].values():
            tt = s["tool_turns"].get(tool)
            if not tt:
                cells.append("–")
                continue
            turns = max(turns, tt["turns"])
            dropped = tt["dropped_turns"] / tt["turns"] if tt["turns"] else 0.0
            cells.append(f"{_pct(s['coverage_by_tool'][tool])} ({_pct(dropped)})")
        table.add_row(tool, str(turns), *cells)
    return table


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"
