"""Prepared sessions: what every strategy and every analysis starts from (docs/architecture.md#the-pipeline).

Preparing a turn is the gateway adapter's `translate` step replayed offline: the harness's
messages and the recorded response go through the same canonicalization policy, and the prompt
ids are the recorded ones or a fresh render, per the prompt source. It happens once per session,
here; strategies receive the result and never prepare turns themselves.

A session's turns repeat their history, and the loader shares the message objects of that
history between turns, so canonicalization is memoised per message object: each message is
translated once per session, and equal histories stay the same objects downstream (which the
incremental renderer and list comparisons exploit). Messages are never mutated once built.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from trace_tools.data import Session, Turn
from trace_tools.errors import ReplayError
from trace_tools.render.canonical import canonicalize_response, freeze, message_translator

PROMPT_SOURCES = ("auto", "recorded", "rendered")


@dataclass(slots=True)
class PreparedTurn:
    """One turn as strategies see it.

    `prompt_ids` is what replay feeds the manager: the recorded ids (`prompt_origin`
    "recorded") or the render of `messages` ("rendered"), per the prompt source. The render of
    `messages` is available either way from `rendered_prompt_ids()`, computed on first use (and
    shared with every strategy that renders the same messages).
    """

    turn: Turn
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    response_message: dict[str, Any] | None
    prompt_ids: list[int]
    prompt_origin: str  # "recorded" | "rendered"
    ill_formed: bool = False
    renderer: Any = field(default=None, repr=False, compare=False)

    @property
    def template_kwargs(self) -> dict[str, Any]:
        return dict(self.turn.chat_template_kwargs or {})

    def rendered_prompt_ids(self) -> list[int]:
        """The render of this turn's canonical messages (a shared list: do not modify it)."""
        return render_prompt(self.renderer, self.messages, self.tools, self.turn, shared=True)


@dataclass
class PreparedSession:
    """A session's prepared turns, the renderer of its own recording, and its canonical views."""

    session: Session
    turns: list[PreparedTurn]
    renderer: Any
    canonicalization: str = "slime"
    prompt_source: str = "auto"
    _views: dict[str, list[list[dict]]] = field(default_factory=dict, repr=False)
    _translators: dict[str, "Canonicalizer"] = field(default_factory=dict, repr=False)

    @property
    def session_id(self) -> str:
        return self.session.session_id

    @property
    def reward(self) -> float:
        return self.session.reward

    @property
    def meta(self) -> Any:
        return self.session.meta

    def canonical(self, policy: str) -> list[list[dict]]:
        """Every turn's request under another canonicalization policy (memoised per message)."""
        if policy == self.canonicalization:
            return [prepared.messages for prepared in self.turns]
        if policy not in self._views:
            translate = self._translators.setdefault(policy, Canonicalizer(policy))
            self._views[policy] = [translate.messages(turn.messages) for turn in self.session.turns]
        return self._views[policy]


class Canonicalizer:
    """`canonicalize_messages` memoised per message object for the life of one session."""

    def __init__(self, policy: str):
        self.policy = policy
        self._convert: Callable[[Any], dict | None] = message_translator(policy)
        self._memo: dict[int, tuple[Any, dict | None]] = {}

    def messages(self, raw: list[Any]) -> list[dict]:
        out = []
        for message in raw:
            hit = self._memo.get(id(message))
            if hit is None or hit[0] is not message:
                hit = (message, freeze(self._convert(message)))
                self._memo[id(message)] = hit
            if hit[1] is not None:
                out.append(hit[1])
        return out


def prepare_session(
    session: Session,
    renderer: Any,
    canonicalization: str = "slime",
    prompt_source: str = "auto",
    responses: bool = True,
) -> PreparedSession:
    """Canonical messages, canonical response and prompt ids for every turn of a session.

    `responses=False` leaves every turn's response out (None), for a caller that compares prompts
    only (`reconstruct`): parsing each response from its output ids took 0.39 s of a 3.5 s
    profile of the benchmark's reconstruction."""
    if prompt_source not in PROMPT_SOURCES:
        raise ReplayError(f"--prompt-source must be auto, recorded or rendered, not {prompt_source!r}")
    translate = Canonicalizer(canonicalization)
    turns = [
        _prepare_turn(turn, translate, renderer, canonicalization, prompt_source, responses) for turn in session.turns
    ]
    return PreparedSession(
        session, turns, renderer, canonicalization, prompt_source, _translators={canonicalization: translate}
    )


def _prepare_turn(
    turn: Turn, translate: Canonicalizer, renderer: Any, policy: str, source: str, responses: bool
) -> PreparedTurn:
    messages = translate.messages(turn.messages)
    tools = turn.tools or None
    response, ill_formed = response_message(turn, renderer, policy) if responses else (None, False)
    prompt_ids, origin = prompt_for(turn, messages, tools, renderer, source)
    return PreparedTurn(turn, messages, tools, response, prompt_ids, origin, ill_formed, renderer)


def response_message(turn: Turn, renderer: Any, policy: str = "slime") -> tuple[dict | None, bool]:
    """The recorded response canonicalized like the requests; parsed from output ids when absent."""
    if turn.response is not None:
        return freeze(canonicalize_response(turn.response, policy)), _has_raw_arguments(turn.response)
    if not turn.output_ids or renderer is None:
        return None, False
    parsed = renderer.parse_response(turn.output_ids, turn.tools)
    return freeze(canonicalize_response(parsed.message, policy)), parsed.ill_formed


def prompt_for(
    turn: Turn, messages: list[dict], tools: list[dict] | None, renderer: Any, source: str = "auto"
) -> tuple[list[int], str]:
    """(prompt ids, origin) for `messages` sent as `turn`'s request: the recorded ids when the
    prompt source allows and the gateway recorded them, else a render."""
    if source == "recorded" and turn.prompt_ids is None:
        raise ReplayError(f"turn {turn.turn_index} has no recorded prompt_ids; use --prompt-source auto or rendered")
    if source != "rendered" and turn.prompt_ids is not None:
        return turn.prompt_ids, "recorded"
    return render_prompt(renderer, messages, tools, turn, shared=True), "rendered"


def render_prompt(
    renderer: Any, messages: list[dict], tools: list[dict] | None, turn: Turn | None, shared: bool = False
) -> list[int]:
    """The prompt a re-rendering gateway feeds for `messages` (with the turn's template kwargs).

    `shared=True` returns the renderer's cached list where it has one: callers must not modify it.
    """
    if renderer is None:
        raise ReplayError("no renderer configured; pass --tokenizer (and --chat-template) to render prompts")
    kwargs = (turn.chat_template_kwargs or {}) if turn is not None else {}
    render = getattr(renderer, "render_shared", None) if shared else None
    return (render or renderer.render)(messages, tools, True, **kwargs)


def _has_raw_arguments(message: dict) -> bool:
    """A recorded response whose tool-call arguments did not parse as a JSON object is ill-formed."""
    for call in message.get("tool_calls") or []:
        args = (call.get("function") or {}).get("arguments")
        if isinstance(args, str):
            try:
                if not isinstance(json.loads(args), dict):
                    return True
            except ValueError:
                return True
    return False
