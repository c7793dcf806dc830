"""Terminal views of compare and gate results, fitted to the console by `layout.fit`."""

from __future__ import annotations

from typing import Any

import pandas as pd
from rich.text import Text

from trace_tools.report.layout import ABSENT, Column, fit, label, legend, middle
from trace_tools.strategies.declarations import in_column_order

KEY_METRICS = ("sessions", "samples", "forks.mean", "coverage", "trained_tokens", "forwarded_tokens", "context_tokens")
SESSIONS_SHOWN = 30
BEHAVIOUR_LINE = 26  # behaviour recipes longer than this break after a `+`


def comparison_view(result: Any, width: int) -> list[Any]:
    """Per compared pair: metric deltas, coverage by tool side by side, and the sessions that changed."""
    out: list[Any] = [Text(f"A = {result.label_a}, B = {result.label_b}", style="bold")]
    for side, names in (("A", result.only_a), ("B", result.only_b)):
        if names:
            out.append(Text(f"not compared, only in {side}: {', '.join(names)}", style="yellow"))
    for pair in result.metrics["pair"].drop_duplicates():
        metrics = _metrics(result.metrics, pair, width)
        if metrics:
            out += [Text(""), Text(f"Summary metrics: {pair}", style="bold"), *metrics]
        tools = result.tools[result.tools["pair"] == pair] if len(result.tools) else result.tools
        if len(tools):
            out += [Text(""), Text(f"Coverage by tool (dropped turns): {pair}", style="bold"), *_tools(tools, width)]
        sessions = result.sessions[result.sessions["pair"] == pair] if len(result.sessions) else result.sessions
        if len(sessions):
            out += [
                Text(""),
                Text(f"Sessions whose outcome changed: {len(sessions)} ({pair})", style="bold"),
                *_sessions(sessions.head(SESSIONS_SHOWN), width),
            ]
    return out


def _metrics(frame: pd.DataFrame, pair: str, width: int) -> list[Any]:
    rows = frame[(frame["pair"] == pair) & ((frame["delta"].fillna(1) != 0) | frame["metric"].isin(KEY_METRICS))]
    if not len(rows):
        return []
    return fit(
        [Column("metric", list(rows["metric"]), justify="left")],
        [
            Column("A", [_num(v) for v in rows["a"]]),
            Column("B", [_num(v) for v in rows["b"]]),
            Column("Δ (B − A)", [_num(v, signed=True) for v in rows["delta"]]),
        ],
        width,
    )


def _tools(frame: pd.DataFrame, width: int) -> list[Any]:
    return fit(
        [Column("tool", list(frame["tool"]), justify="left"), Column("turns", [str(n) for n in frame["turns"]])],
        [
            Column("A", [_cov(c, d) for c, d in zip(frame["coverage_a"], frame["dropped_a"])]),
            Column("B", [_cov(c, d) for c, d in zip(frame["coverage_b"], frame["dropped_b"])]),
        ],
        width,
    )


def _sessions(frame: pd.DataFrame, width: int) -> list[Any]:
    def change(column: str) -> list[str]:
        return [f"{_num(a)} → {_num(b)}" for a, b in zip(frame[f"{column}_a"], frame[f"{column}_b"])]

    return fit(
        [Column("session", [middle(str(s)) for s in frame["session_id"]], justify="left")],
        [
            Column("samples", change("samples")),
            Column("trained", change("trained_tokens")),
            Column("forwarded", change("forwarded_tokens")),
        ],
        width,
    )


def step_view(result: Any, width: int) -> list[Any]:
    """Per compared pair, one row per step: coverage of A and B, the deltas of coverage and forks
    per session, and the tool whose coverage differs most; headed by the first step they diverge."""
    out: list[Any] = [Text(f"A = {result.label_a}, B = {result.label_b}", style="bold")]
    frame = result.steps
    for pair in frame["pair"].drop_duplicates():
        wide = frame[frame["pair"] == pair].pivot_table(index="step", columns="metric", values=["a", "b", "delta"])
        steps = list(wide.index)
        out += [Text(""), Text(f"Per step: {pair}", style="bold"), Text(_divergence(wide))]
        shown = steps[:STEPS_SHOWN]
        rows = wide.loc[shown]
        out += fit(
            [Column("step", [str(step) for step in shown])],
            [
                Column("sessions", [_num(v) for v in _cell(rows, "a", "sessions")]),
                Column("cov A", [_pct(v) for v in _cell(rows, "a", "coverage")]),
                Column("cov B", [_pct(v) for v in _cell(rows, "b", "coverage")]),
                Column("Δ cov (pts)", [_pct(v, signed=True) for v in _cell(rows, "delta", "coverage")]),
                Column("Δ forks/sess", [_num(v, signed=True) for v in _cell(rows, "delta", "forks.mean")]),
                Column("widest tool Δ", [_tool_gap(rows.loc[step]) for step in shown], justify="left"),
            ],
            width,
        )
        if len(steps) > len(shown):
            out.append(Text(f"{len(steps) - len(shown)} more steps: --json prints every step"))
    return out


STEPS_SHOWN = 60


def _divergence(wide: pd.DataFrame) -> str:
    """`first differ at step K; widest at step M (coverage Δ x)`, or that they never differ."""
    if "delta" not in wide:
        return "no step measured on both sides"
    deltas = wide["delta"].drop(columns=["sessions"], errors="ignore").fillna(0)
    differs = deltas.abs().sum(axis=1) > 1e-12
    if not differs.any():
        return "A and B agree at every step"
    first = differs.idxmax()
    coverage = wide["delta"]["coverage"].abs() if "coverage" in wide["delta"] else None
    widest = "" if coverage is None or coverage.isna().all() else f"; widest coverage gap at step {coverage.idxmax()}"
    return f"A and B first differ at step {first}{widest}"


def _cell(rows: pd.DataFrame, side: str, metric: str) -> list[Any]:
    return list(rows[side][metric]) if side in rows and metric in rows[side] else [None] * len(rows)


def _tool_gap(row: pd.Series) -> str:
    gaps = {
        metric.split(".", 1)[1]: value
        for (side, metric), value in row.items()
        if side == "delta" and metric.startswith("coverage_by_tool.") and not pd.isna(value) and value
    }
    if not gaps:
        return ABSENT
    tool = max(gaps, key=lambda name: abs(gaps[name]))
    return f"{tool} {_pct(gaps[tool], signed=True)}"


def _pct(x: Any, signed: bool = False) -> str:
    if x is None or pd.isna(x):
        return ABSENT
    return f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}%"


def behaviour_view(frame: pd.DataFrame, width: int) -> list[Any]:
    """Behaviour × strategy: % of genuine generated tokens trained / forwarded tokens ÷ ideal."""
    strategies = in_column_order(dict.fromkeys(frame["strategy"]))
    behaviours = list(dict.fromkeys(frame["behaviour"]))
    cells = {(r.behaviour, r.strategy): r for r in frame.itertuples()}
    sessions = [str(max(cells[b, s].sessions for s in strategies if (b, s) in cells)) for b in behaviours]
    key = [Column("behaviour", [_break_at_plus(b) for b in behaviours], justify="left"), Column("sessions", sessions)]
    values = [Column(label(s), [_behaviour_cell(cells.get((b, s))) for b in behaviours]) for s in strategies]
    note = (
        "each cell: % of genuine generated tokens trained / forwarded tokens ÷ ideal (the ideal forwards "
        "each genuine branch once; simulator ground truth)"
    )
    out: list[Any] = [Text("Behaviour × strategy", style="bold"), *fit(key, values, width), Text(note)]
    key_text = legend(strategies)
    return out + ([Text(key_text)] if key_text else [])


def _behaviour_cell(row: Any) -> str:
    if row is None:
        return ABSENT
    trained = ABSENT if pd.isna(row.trained_share) else f"{100 * row.trained_share:.0f}"
    forwarded = ABSENT if pd.isna(row.forwarded_vs_ideal) else f"{row.forwarded_vs_ideal:.2f}"
    return f"{trained} / {forwarded}"


def _break_at_plus(text: str) -> str:
    """A long `a+b+c` recipe over several lines, each but the last ending in `+`, the others indented."""
    lines: list[str] = []
    for part in text.split("+"):
        if lines and len(lines[-1]) + 1 + len(part) <= BEHAVIOUR_LINE:
            lines[-1] += f"+{part}"
        else:
            lines.append(part)
    return "+\n  ".join(lines)


def gate_view(results: list[Any], width: int) -> list[Any]:
    """One row per evaluated rule: PASS/FAIL, the rule, actual and expected values, a note."""
    rules = [r.rule.name or (f"{label(r.strategy)}." if r.strategy else "") + r.rule.metric for r in results]
    key = [
        Column("", ["PASS" if r.passed else "FAIL" for r in results], justify="left"),
        Column("rule", rules, justify="left"),
    ]
    values = [
        Column("actual", [_num(r.actual) for r in results]),
        Column("expected", [r.expected for r in results]),
        Column("note", [r.message for r in results], justify="left", wrap=True),
    ]
    out: list[Any] = [Text("Gate", style="bold"), *fit(key, values, width)]
    key_text = legend(dict.fromkeys(r.strategy for r in results if r.strategy))
    return out + ([Text(key_text)] if key_text else [])


def _num(x: Any, signed: bool = False) -> str:
    if x is None or (isinstance(x, float) and pd.isna(x)):
        return ABSENT
    if float(x).is_integer():
        return f"{int(x):+,d}" if signed else f"{int(x):,d}"
    return f"{x:+.4g}" if signed else f"{x:.4g}"


def _cov(coverage: Any, dropped: Any) -> str:
    if coverage is None or pd.isna(coverage):
        return ABSENT
    return f"{100 * coverage:.1f}% ({ABSENT if dropped is None or pd.isna(dropped) else int(dropped)})"
