"""Explain one session's drift: the aligned token diff, the message-level difference and the cause."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_tools.errors import TraceToolsError
from trace_tools.report.drift import DriftFinding, find_drift


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

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {"session_id": self.session_id, "findings": [asdict(f) for f in self.findings],
                "focus": asdict(self.focus) if self.focus else None,
                "window": asdict(self.window) if self.window else None,
                "strategy": self.strategy, "strategy_turn": self.strategy_turn}


def explain(dump: str | Path, session_id: str, *, turn: int | None = None, strategy: str | None = None,
            tokenizer: str | None = None, chat_template: str | None = None, prompt_source: str = "auto",
            canonicalization: str = "slime", context: int = 8) -> Explanation:
    """Findings for every echoed turn of a session, focused on `turn` (default: the first drifted one)."""
    from trace_tools.render.renderer import Renderer
    from trace_tools.strategies.base import ReplayContext
    from trace_tools.strategies.prepare import prepare_turn

    session = _find_session(dump, session_id, tokenizer)
    renderer = Renderer.from_spec(tokenizer or session.meta.tokenizer, chat_template, dump_meta=session.meta)
    ctx = ReplayContext(renderer, canonicalization, prompt_source)
    prepared = {t.turn_index: prepare_turn(t, ctx) for t in session.turns}
    findings = find_drift(session, prepared, renderer)
    focus = _focus(findings, turn)
    window = _window(focus, prepared, session, renderer, context) if focus and focus.token_drift else None
    result = Explanation(session.session_id, findings, focus, window, strategy)
    if strategy and focus:
        result.strategy_turn = _strategy_view(strategy, session, ctx, focus.turn_index)
    return result


def _find_session(dump, session_id: str, tokenizer: str | None):
    """The session, read from its own file so it keeps that file's recording metadata."""
    from trace_tools.data import QuarantineEntry
    from trace_tools.io.load import find_files, iter_sessions

    seen: dict[str, None] = {}
    for file in find_files(dump):
        for item in iter_sessions(file, tokenizer=tokenizer):
            if item.session_id != session_id:
                seen[item.session_id] = None
                continue
            if isinstance(item, QuarantineEntry):
                raise TraceToolsError(f"session {session_id!r} is quarantined ({item.reason}: {item.detail}); "
                                      "run `trace-tools validate` for details")
            return item
    raise TraceToolsError(no_session_message(session_id, dump, [s for s in seen if s is not None]))


def no_session_message(session_id: str, dump, ids: list[str]) -> str:
    """Name the closest id and a few others, so the user can pick one without another command."""
    import difflib

    close = difflib.get_close_matches(session_id, ids, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    listed = ", ".join(ids[:5]) + (f", … ({len(ids)} in all)" if len(ids) > 5 else "")
    return f"no session {session_id!r} in {dump}; {hint}its sessions: {listed or 'none'}"


def _focus(findings: list[DriftFinding], turn: int | None) -> DriftFinding | None:
    if turn is not None:
        chosen = [f for f in findings if f.turn_index == turn]
        if not chosen:
            echoed = ", ".join(str(f.turn_index) for f in findings) or "none"
            raise TraceToolsError(f"turn {turn} is not echoed by a later request (echoed turns: {echoed})")
        return chosen[0]
    drifted = [f for f in findings if f.cause]
    return drifted[0] if drifted else (findings[0] if findings else None)


def _window(focus: DriftFinding, prepared, session, renderer, context: int) -> TokenWindow:
    turns = {t.turn_index: t for t in session.turns}
    served = list(prepared[focus.turn_index].prompt_ids) + list(turns[focus.turn_index].output_ids)
    rendered = list(prepared[focus.echo_turn].prompt_ids)
    at = focus.divergence or 0
    lo = max(0, at - context)

    def labelled(ids):
        return [(i, renderer.decode([i])) for i in ids]

    return TokenWindow(lo, labelled(served[lo:at]), labelled(served[at:at + context]),
                       labelled(rendered[at:at + context]))


def _strategy_view(name: str, session, ctx, turn_index: int) -> dict[str, Any]:
    """What `name` made of the focused turn: its event, prompt event and trained tokens."""
    from trace_tools.replay.turnrows import turn_rows
    from trace_tools.strategies.base import get_strategy

    result = get_strategy(name)(ctx).replay(session)
    rows = turn_rows(name, session, result, {}, {})
    row = next(r for r in rows if r["turn_index"] == turn_index)
    return {k: row[k] for k in ("event", "prompt_event", "generated_tokens", "trained_tokens")} | {
        "samples": len(result.samples)}
