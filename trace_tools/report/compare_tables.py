"""Rich tables for compare and gate results."""
from __future__ import annotations

import pandas as pd
from rich.table import Table

KEY_METRICS = ("sessions", "samples", "forks.mean", "coverage", "trained_tokens", "forwarded_tokens",
               "context_tokens")


def comparison_tables(result) -> list[Table]:
    metrics = Table(title=f"Summary metrics: A = {result.label_a}, B = {result.label_b}", title_justify="left")
    for col in ("pair", "metric", "A", "B", "Δ (B − A)"):
        metrics.add_column(col, justify="left" if col in ("pair", "metric") else "right")
    frame = result.metrics
    changed = frame[(frame["delta"].fillna(1) != 0) | frame["metric"].isin(KEY_METRICS)]
    for row in changed.itertuples():
        metrics.add_row(row.pair, row.metric, _num(row.a), _num(row.b), _num(row.delta, signed=True))
    tools = Table(title="Coverage by tool, side by side (dropped turns)", title_justify="left")
    for col in ("pair", "tool", "turns", "A", "B"):
        tools.add_column(col, justify="left" if col in ("pair", "tool") else "right")
    for row in result.tools.itertuples():
        tools.add_row(row.pair, row.tool, str(row.turns), _cov(row.coverage_a, row.dropped_a), _cov(row.coverage_b, row.dropped_b))
    sessions = Table(title=f"Sessions whose outcome changed: {len(result.sessions)}", title_justify="left")
    for col in ("pair", "session", "samples A→B", "trained A→B", "forwarded A→B"):
        sessions.add_column(col)
    for row in result.sessions.head(30).itertuples():
        sessions.add_row(row.pair, str(row.session_id), f"{_num(row.samples_a)}→{_num(row.samples_b)}",
                         f"{_num(row.trained_tokens_a)}→{_num(row.trained_tokens_b)}",
                         f"{_num(row.forwarded_tokens_a)}→{_num(row.forwarded_tokens_b)}")
    return [metrics, tools, sessions]


def behaviour_table(frame: pd.DataFrame) -> Table:
    table = Table(title="Behaviour × strategy (ideal from simulator ground truth)", title_justify="left")
    for col in ("behaviour", "strategy", "sessions", "samples/session (ideal)", "genuine trained", "forwarded / ideal"):
        table.add_column(col, justify="left" if col in ("behaviour", "strategy") else "right")
    for row in frame.itertuples():
        table.add_row(row.behaviour, row.strategy, str(row.sessions),
                      f"{row.samples_per_session:.2f} ({row.ideal_samples_per_session:.2f})",
                      "n/a" if pd.isna(row.trained_share) else f"{100 * row.trained_share:.1f}%",
                      "n/a" if pd.isna(row.forwarded_vs_ideal) else f"{row.forwarded_vs_ideal:.2f}×")
    return table


def gate_table(results) -> Table:
    table = Table(title="Gate", title_justify="left")
    for col in ("", "rule", "actual", "expected", "note"):
        table.add_column(col)
    for r in results:
        mark = "[green]PASS[/]" if r.passed else "[red]FAIL[/]"
        table.add_row(mark, r.label, _num(r.actual), r.expected, r.message)
    return table


def _num(x, signed: bool = False) -> str:
    if x is None or (isinstance(x, float) and pd.isna(x)):
        return "–"
    if float(x).is_integer():
        return f"{int(x):+d}" if signed else f"{int(x)}"
    return f"{x:+.4g}" if signed else f"{x:.4g}"


def _cov(coverage, dropped) -> str:
    if coverage is None or pd.isna(coverage):
        return "–"
    return f"{100 * coverage:.1f}% ({int(dropped) if dropped is not None and not pd.isna(dropped) else '–'})"
