"""`drift.parquet`: one row per echoed turn, with the tokens around its first divergence.

The HTML report's drift view reads only this table. The rows come from the same machinery as
`trace-tools explain` (`find_drift`, `TokenWindow`), with a longer window after the divergence so
that a filled-in argument (a `schema_default` drift) is visible on the re-rendered side.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa

from trace_tools.report.explain import TokenWindow

BEFORE, AFTER = 16, 40  # tokens of shared context before the divergence, and of each side after it

DRIFT_SCHEMA = pa.schema([
    ("session_id", pa.string()), ("turn_index", pa.int32()), ("echo_turn", pa.int32()),
    ("cause", pa.string()), ("causes", pa.list_(pa.string())), ("token_drift", pa.bool_()),
    ("divergence", pa.int32()), ("served_len", pa.int32()), ("prompt_len", pa.int32()),
    ("message_diff", pa.list_(pa.string())), ("window_start", pa.int32()),
    ("shared_ids", pa.list_(pa.int32())), ("served_ids", pa.list_(pa.int32())), ("rendered_ids", pa.list_(pa.int32())),
    ("shared_tokens", pa.list_(pa.string())), ("served_tokens", pa.list_(pa.string())),
    ("rendered_tokens", pa.list_(pa.string())),
])


def session_drift_rows(session, prepared: dict[int, Any], renderer) -> list[dict[str, Any]]:
    """Rows for every echoed turn of one session (`prepared`: turn_index → PreparedTurn)."""
    from trace_tools.report.drift import find_drift

    rows = []
    for finding in find_drift(session, prepared, renderer):
        window = _window(finding, prepared, session, renderer) if finding.token_drift else None
        rows.append(_row(session.session_id, finding, window))
    return rows


def drift_table(sessions: Iterable, context_for: Callable[[Any], Any]) -> pa.Table:
    """The drift table of many sessions; `context_for(session)` gives its ReplayContext.

    A session whose turns cannot be prepared is left out: replay has already quarantined it.
    """
    from trace_tools.strategies.prepare import prepare_turn

    rows: list[dict[str, Any]] = []
    for session in sessions:
        try:
            ctx = context_for(session)
            prepared = {t.turn_index: prepare_turn(t, ctx) for t in session.turns}
            rows += session_drift_rows(session, prepared, ctx.renderer)
        except Exception:  # quarantined (replay_error) by the engine, with its reason
            continue
    return pa.Table.from_pylist(rows, schema=DRIFT_SCHEMA)


def write_drift_table(table: pa.Table, run_dir: Path) -> Path:
    from trace_tools.io.write import write_parquet_atomic

    return write_parquet_atomic(table, Path(run_dir) / "drift.parquet")


def _window(finding, prepared: dict[int, Any], session, renderer) -> TokenWindow:
    turns = {t.turn_index: t for t in session.turns}
    served = list(prepared[finding.turn_index].prompt_ids) + list(turns[finding.turn_index].output_ids)
    rendered = list(prepared[finding.echo_turn].prompt_ids)
    at = finding.divergence or 0
    start = max(0, at - BEFORE)

    def labelled(ids: list[int]) -> list[tuple[int, str]]:
        return [(i, renderer.decode([i]) if renderer is not None else f"<{i}>") for i in ids]

    return TokenWindow(start, labelled(served[start:at]), labelled(served[at:at + AFTER]),
                       labelled(rendered[at:at + AFTER]))


def _row(session_id: str, finding, window: TokenWindow | None) -> dict[str, Any]:
    sides = {"shared": [], "served": [], "rendered": []} if window is None else {
        "shared": window.shared, "served": window.served, "rendered": window.rendered}
    row = {"session_id": session_id, "turn_index": finding.turn_index, "echo_turn": finding.echo_turn,
           "cause": finding.cause, "causes": list(finding.causes), "token_drift": finding.token_drift,
           "divergence": finding.divergence, "served_len": finding.served_len, "prompt_len": finding.prompt_len,
           "message_diff": list(finding.message_diff), "window_start": window.start if window else 0}
    for side, pairs in sides.items():
        row[f"{side}_ids"] = [i for i, _ in pairs]
        row[f"{side}_tokens"] = [t for _, t in pairs]
    return row
