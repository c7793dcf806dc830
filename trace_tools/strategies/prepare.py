"""Per-turn inputs every strategy starts from: canonical messages, the response, the prompt ids.

This is the gateway adapter's `translate` step replayed offline (DESIGN §3): the harness's
messages and the recorded response go through the same canonicalization policy, and the prompt
ids are the recorded ones or a fresh render, per `ctx.prompt_source`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trace_tools.data import Session, Turn
from trace_tools.errors import ReplayError
from trace_tools.strategies.base import ReplayContext


@dataclass(slots=True)
class PreparedTurn:
    turn: Turn
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    response_message: dict[str, Any] | None
    prompt_ids: list[int]
    prompt_origin: str  # "recorded" | "rendered"
    ill_formed: bool = False


def prepare_turns(session: Session, ctx: ReplayContext) -> list[PreparedTurn]:
    return [prepare_turn(turn, ctx) for turn in session.turns]


def prepare_turn(turn: Turn, ctx: ReplayContext) -> PreparedTurn:
    from trace_tools.render.canonical import canonicalize_messages

    messages = canonicalize_messages(turn.messages, ctx.canonicalization)
    tools = turn.tools or None
    response, ill_formed = response_message(turn, ctx)
    prompt_ids, origin = prompt_for(turn, messages, tools, ctx)
    return PreparedTurn(turn, messages, tools, response, prompt_ids, origin, ill_formed)


def response_message(turn: Turn, ctx: ReplayContext) -> tuple[dict | None, bool]:
    """The recorded response canonicalized like the requests; parsed from output ids when absent."""
    from trace_tools.render.canonical import canonicalize_response

    if turn.response is not None:
        return canonicalize_response(turn.response, ctx.canonicalization), _has_raw_arguments(turn.response)
    if not turn.output_ids or ctx.renderer is None:
        return None, False
    parsed = ctx.renderer.parse_response(turn.output_ids, turn.tools)
    return canonicalize_response(parsed.message, ctx.canonicalization), parsed.ill_formed


def prompt_for(turn: Turn, messages: list[dict], tools: list[dict] | None,
               ctx: ReplayContext) -> tuple[list[int], str]:
    source = ctx.prompt_source
    if source == "recorded" and turn.prompt_ids is None:
        raise ReplayError(f"turn {turn.turn_index} has no recorded prompt_ids; use --prompt-source auto or rendered")
    if source in ("recorded", "auto") and turn.prompt_ids is not None:
        return list(turn.prompt_ids), "recorded"
    return render_prompt(ctx, messages, tools, turn), "rendered"


def render_prompt(ctx: ReplayContext, messages: list[dict], tools: list[dict] | None, turn: Turn | None) -> list[int]:
    if ctx.renderer is None:
        raise ReplayError("no renderer configured; pass --tokenizer (and --chat-template) to render prompts")
    kwargs = (turn.chat_template_kwargs or {}) if turn is not None else {}
    return ctx.renderer.render(messages, tools, True, **kwargs)


def _has_raw_arguments(message: dict) -> bool:
    """A recorded response whose tool-call arguments did not parse as a JSON object is ill-formed."""
    import json

    for call in message.get("tool_calls") or []:
        args = (call.get("function") or {}).get("arguments")
        if isinstance(args, str):
            try:
                if not isinstance(json.loads(args), dict):
                    return True
            except ValueError:
                return True
    return False
