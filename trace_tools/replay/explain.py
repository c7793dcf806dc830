"""Explain one session's drift: the aligned token diff, the message-level difference and the cause."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trace_tools.errors import TraceToolsError
from trace_tools.io.schema import COLUMNS
from trace_tools.pipeline import Pipeline
from trace_tools.pipeline.drift import DriftFinding, find_drift
from trace_tools.pipeline.facts import token_window


@dataclass
class TokenWindow:
    """Tokens around the first divergence: the shared context, then each side's next tokens."""

    start: int
    shared: list[tuple[int, str]]
    served: list[tuple[int, str]]
    rendered: list[tuple[int, str]]


@dataclass
class Explanation:
    session_id: str
    findings: list[DriftFinding]
    focus: DriftFinding | None
    window: TokenWindow | None
    strategy: str | None = None
    strategy_turn: dict[str, Any] = field(default_factory=dict)
    verify: dict[str, Any] | None = None  # with render_path="verify": `render.renderer.verify_summary`

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "findings": [asdict(f) for f in self.findings],
            "focus": asdict(self.focus) if self.focus else None,
            "window": asdict(self.window) if self.window else None,
            "strategy": self.strategy,
            "strategy_turn": self.strategy_turn,
            **({"verify": self.verify} if self.verify is not None else {}),
        }


# What explaining a turn reads (`metadata`, the simulator's ground truth, is not decoded).
EXPLAIN_COLUMNS = tuple(column.name for column in COLUMNS if column.name != "metadata")


def explain(
    dump: str | Path,
    session_id: str,
    *,
    turn: int | None = None,
    strategy: str | None = None,
    tokenizer: str | None = None,
    chat_template: str | None = None,
    prompt_source: str = "auto",
    canonicalization: str = "slime",
    context: int = 8,
    tool_format: str | None = None,
    render_path: str = "fast",
) -> Explanation:
    """Findings for every echoed turn of a session, focused on `turn` (default: the first drifted
    one), plus (with `strategy`) what that strategy made of the focused turn. `render_path`:
    fast | reference | verify (`render.spec.RENDER_PATHS`); with verify, `Explanation.verify`
    counts the renders checked and those that differed."""

    pipeline = Pipeline(
        dump,
        tokenizer=tokenizer,
        chat_template=chat_template,
        canonicalization=canonicalization,
        prompt_source=prompt_source,
        tool_format=tool_format,
        columns=EXPLAIN_COLUMNS,
        render_path=render_path,
    )
    prepared = pipeline.session(session_id)
    result = explain_prepared(prepared, turn=turn, context=context)
    if strategy and result.focus:
        from trace_tools.replay.session import strategy_turn_view
        from trace_tools.strategies.base import ReplayContext

        ctx = ReplayContext(prepared.renderer, canonicalization, prompt_source)
        result.strategy = strategy
        result.strategy_turn = strategy_turn_view(prepared, ctx, strategy, result.focus.turn_index)
    if render_path == "verify" and prepared.renderer is not None:
        from trace_tools.render.renderer import verify_summary

        result.verify = verify_summary(prepared.renderer.cache_info())
    return result


def explain_prepared(prepared: Any, *, turn: int | None = None, context: int = 8) -> Explanation:
    """`explain` for an already prepared session (`trace_tools.pipeline.PreparedSession`)."""

    findings = find_drift(prepared)
    focus = _focus(findings, turn)
    window = _window(focus, prepared, context) if focus and focus.token_drift else None
    return Explanation(prepared.session_id, findings, focus, window)


def _focus(findings: list[DriftFinding], turn: int | None) -> DriftFinding | None:
    if turn is not None:
        chosen = [f for f in findings if f.turn_index == turn]
        if not chosen:
            echoed = ", ".join(str(f.turn_index) for f in findings) or "none"
            raise TraceToolsError(f"turn {turn} is not echoed by a later request (echoed turns: {echoed})")
        return chosen[0]
    drifted = [f for f in findings if f.cause]
    return drifted[0] if drifted else (findings[0] if findings else None)


def _window(focus: DriftFinding, prepared: Any, context: int) -> TokenWindow:
    turns = {p.turn.turn_index: p for p in prepared.turns}
    window = token_window(
        turns[focus.turn_index], turns[focus.echo_turn], focus, prepared.renderer, before=context, after=context
    )

    def labelled(name: str) -> list[tuple[int, str]]:
        return list(zip(window[f"{name}_ids"], window[f"{name}_tokens"]))

    return TokenWindow(window["window_start"], labelled("shared"), labelled("served"), labelled("rendered"))
