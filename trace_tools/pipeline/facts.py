"""Per-turn facts of a prepared session that do not depend on any strategy.

* tool names of each turn's response (`tool` / `tool_names`, docs/metrics.md#per-turn);
* prompt lengths (the ids replay feeds);
* prompt fidelity: does the re-render of the canonical messages equal the recorded prompt ids,
  and where does it first differ;
* drift: which echoed turns no longer extend what was served, and why (`pipeline.drift`), with
  the aligned token window around each divergence that `explain` and `report.html` show.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trace_tools.pipeline.drift import DriftFinding, find_drift
from trace_tools.pipeline.prepared import PreparedSession, PreparedTurn
from trace_tools.pipeline.recorded import RecordedPrompts

WINDOW_BEFORE, WINDOW_AFTER = 16, 40  # tokens shown around a divergence (enough to show a filled-in argument)


@dataclass
class SessionFacts:
    tool_names: dict[int, list[str]]
    prompt_lengths: dict[int, int]
    fidelity: list[dict[str, Any]] = field(default_factory=list)
    drift: list[DriftFinding] = field(default_factory=list)

    @property
    def drift_causes(self) -> dict[int, str]:
        return {finding.turn_index: finding.cause for finding in self.drift if finding.cause}


def session_facts(prepared: PreparedSession, fidelity: bool = True, drift: bool = True) -> SessionFacts:
    facts = SessionFacts(
        {p.turn.turn_index: tool_names(p) for p in prepared.turns},
        {p.turn.turn_index: len(p.prompt_ids) for p in prepared.turns},
    )
    recorded = RecordedPrompts()
    if fidelity and prepared.renderer is not None:
        facts.fidelity = [fidelity_row(p, recorded) for p in prepared.turns if p.turn.prompt_ids is not None]
    recorded.materialize(prepared.turns)  # prompts read as arrays and not compared: lists from here on
    if drift:
        facts.drift = find_drift(prepared)
    return facts


def tool_names(prepared: PreparedTurn) -> list[str]:
    message = prepared.response_message or {}
    return [call.get("function", {}).get("name", "?") for call in message.get("tool_calls") or []]


def fidelity_row(prepared: PreparedTurn, recorded: RecordedPrompts | None = None) -> dict[str, Any]:
    """Whether the canonical messages re-render to exactly the recorded prompt ids. `recorded`:
    the session's turns before this one, compared in order (a recorded prompt read as an array
    becomes a list here: `pipeline.recorded`)."""
    ids, rendered = prepared.turn.prompt_ids, prepared.rendered_prompt_ids()
    assert ids is not None, "fidelity compares only turns that recorded their prompt ids"
    at = (recorded or RecordedPrompts()).compare(prepared, rendered)
    exact = at == len(ids) == len(rendered)
    return {
        "session_id": prepared.turn.session_id,
        "turn_index": prepared.turn.turn_index,
        "exact": exact,
        "first_divergence": None if exact else at,
    }


def drift_rows(prepared: PreparedSession, findings: list[DriftFinding]) -> list[dict[str, Any]]:
    """`drift.parquet` rows (`io.rundir.DRIFT_SCHEMA`): every echoed turn, with the token window
    around the first divergence where the ids drifted."""
    turns = {p.turn.turn_index: p for p in prepared.turns}
    rows = []
    for finding in findings:
        row = {
            "session_id": prepared.session_id,
            "turn_index": finding.turn_index,
            "echo_turn": finding.echo_turn,
            "cause": finding.cause,
            "causes": list(finding.causes),
            "token_drift": finding.token_drift,
            "divergence": finding.divergence,
            "served_len": finding.served_len,
            "prompt_len": finding.prompt_len,
            "message_diff": list(finding.message_diff),
        }
        if finding.token_drift:
            row.update(token_window(turns[finding.turn_index], turns[finding.echo_turn], finding, prepared.renderer))
        else:
            row.update(
                {
                    "window_start": 0,
                    **{f"{side}_{kind}": [] for side in ("shared", "served", "rendered") for kind in ("ids", "tokens")},
                }
            )
        rows.append(row)
    return rows


def token_window(
    earlier: PreparedTurn,
    later: PreparedTurn,
    finding: DriftFinding,
    renderer: Any,
    before: int = WINDOW_BEFORE,
    after: int = WINDOW_AFTER,
) -> dict[str, Any]:
    """The shared tokens before the first divergence, then each side's next tokens, ids and text."""
    served = list(earlier.prompt_ids)
    served += earlier.turn.output_ids  # in place: one copy of the prompt, not three
    at = finding.divergence if finding.divergence is not None else len(served)
    start = max(0, at - before)
    pieces = {
        "shared": served[start:at],
        "served": served[at : at + after],
        "rendered": later.prompt_ids[at : at + after],
    }
    row: dict[str, Any] = {"window_start": start}
    for name, ids in pieces.items():
        row[f"{name}_ids"] = list(ids)
        row[f"{name}_tokens"] = [renderer.decode([i]) for i in ids] if renderer is not None else []
    return row
