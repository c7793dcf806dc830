"""Rich terminal tables for a run summary (the CLI prints them; the library builds them).

Kept narrow on purpose: eight strategies must fit an 80-column terminal.
"""
from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table


def headline_table(summary: dict[str, Any]) -> Table:
    table = Table(title=f"What each strategy would train ({_sessions(summary)} sessions)", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("strategy", no_wrap=True)
    for col in ("samples", "per session", "forks max", "coverage", "trained", "forwarded", "context"):
        table.add_column(col, justify="right")
    for name, s in summary["strategies"].items():
        per = s["samples"] / s["sessions"] if s["sessions"] else 0.0
        table.add_row(name, str(s["samples"]), f"{per:.2f}", str(s["forks"]["max"]), _pct(s["coverage"]),
                      _tokens(s["trained_tokens"]), _tokens(s["forwarded_tokens"]), _tokens(s["context_tokens"]))
    return table


def tool_table(summary: dict[str, Any]) -> Table:
    """Token coverage by tool: one row per tool, one column per strategy."""
    return _per_tool(summary, "Coverage by tool: trained / generated tokens",
                     lambda s, tool, tt: _pct(s["coverage_by_tool"][tool]))


def dropped_table(summary: dict[str, Any]) -> Table:
    """Share of a tool's turns with no trained token, per strategy."""
    return _per_tool(summary, "Dropped turns by tool: turns with no trained token",
                     lambda s, tool, tt: _pct(tt["dropped_turns"] / tt["turns"] if tt["turns"] else 0.0))


def _per_tool(summary: dict[str, Any], title: str, cell) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("tool", no_wrap=True)
    table.add_column("turns", justify="right")
    for name in summary["strategies"]:
        table.add_column(_short_name(name), justify="right")
    tools = sorted({t for s in summary["strategies"].values() for t in s["tool_turns"]})
    for tool in tools:
        turns = max((s["tool_turns"].get(tool) or {}).get("turns", 0) for s in summary["strategies"].values())
        cells = [cell(s, tool, s["tool_turns"][tool]) if tool in s["tool_turns"] else "–"
                 for s in summary["strategies"].values()]
        table.add_row(tool, str(turns), *cells)
    return table


SHORT_NAMES = {"echo-restore": "restore", "linear+restore": "lin+rest", "session-v1": "sess-v1",
               "session-v2": "sess-v2", "checkpoint-tree": "ckpt-tree"}


def _short_name(name: str) -> str:
    return SHORT_NAMES.get(name, name)


def _sessions(summary: dict[str, Any]) -> int:
    return summary.get("sessions_total", 0)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def _tokens(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 10_000 else str(n)
