"""Harness behaviours: named, documented ways a harness replays history to the gateway.

Two kinds:

* **echo behaviours** change how a generated assistant message comes back in later requests
  (`echo` applies them, in a fixed order, to the message the gateway returned);
* **session behaviours** change the shape of the session (a retried request, a subagent, a
  compaction, a truncated turn, an edit of earlier history, non-canonical output tokens); the
  session builder (`trace_tools.simulate.session`) reads them.

A *recipe* is the set of behaviours one session uses. `--behaviour a+b` combines two in one
session; repeating `--behaviour` makes sessions cycle through the recipes given.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any, Iterable

from trace_tools.errors import TraceToolsError, UnknownName
from trace_tools.simulate.formats import call_id
from trace_tools.simulate.tools import HARNESS_FILLED_DEFAULTS, UNTOUCHED_BY_CLAUDE_CODE

BEHAVIOURS: dict[str, str] = {
    "byte-exact": "The harness echoes every assistant message exactly as the gateway returned it.",
    "claude-code": "Echo fills the defaults that harness fills (Edit replace_all=false) and right-strips every line "
    "of string arguments, except for Bash and Read calls, which pass through untouched.",
    "json-reserialize": "Echo re-serializes tool-call arguments with sorted keys and compact separators "
    "(equal as dicts, different as text).",
    "reasoning-dropped": "Echo leaves out reasoning_content.",
    "reasoning-rekeyed": "Echo carries the reasoning under `reasoning` instead of `reasoning_content`.",
    "streaming": "Echo is rebuilt from a stream: tool-call `index` dropped or renumbered 0..n-1 and tool-call ids "
    "regenerated (the tool results answer the new ids).",
    "retry": "One request is re-issued unchanged after a client timeout; the first generation is superseded.",
    "subagent": "A Task call runs a subagent conversation (own system prompt and tools) inside the same session.",
    "compaction": "The harness asks for a summary, then replaces the history with it and continues.",
    "truncation": "One turn stops at the output-token limit (finish_reason=length, no stop token); the harness "
    "echoes the partial reply, asks to continue, and the turn is generated again.",
    "history-edit": "The harness clears the content of old tool results in place (a genuine edit of earlier "
    "history) and continues.",
    "noncanonical-tokenization": "The model emits splits the tokenizer would merge (two '\\n' tokens where the "
    "tokenizer has one '\\n\\n'); text and messages are unchanged.",
}
ECHO_BEHAVIOURS = ("claude-code", "json-reserialize", "reasoning-dropped", "reasoning-rekeyed", "streaming")
SESSION_BEHAVIOURS = ("retry", "subagent", "compaction", "truncation", "history-edit", "noncanonical-tokenization")
CONFLICTS = (("reasoning-dropped", "reasoning-rekeyed"),)

# With no --behaviour: every behaviour alone, then mixes that exercise several causes at once.
DEFAULT_MIXES = (
    ("claude-code", "retry"),
    ("streaming", "subagent", "noncanonical-tokenization"),
    ("json-reserialize", "compaction"),
    ("reasoning-dropped", "truncation", "history-edit"),
)


class BehaviourConflict(TraceToolsError):
    """Two behaviours that cannot share a session."""


def parse_recipes(specs: Iterable[str] | None) -> list[tuple[str, ...]]:
    """Recipes from `--behaviour` values (`a+b` combines); the default cycle when none are given."""
    if not specs:
        return [(name,) for name in BEHAVIOURS] + [tuple(sorted(mix)) for mix in DEFAULT_MIXES]
    return [_recipe(spec) for spec in specs]


def _recipe(spec: str) -> tuple[str, ...]:
    names = tuple(sorted({part.strip() for part in spec.split("+") if part.strip()}))
    for name in names:
        if name not in BEHAVIOURS:
            raise UnknownName("behaviour", name, list(BEHAVIOURS))
    if not names:
        raise UnknownName("behaviour", spec, list(BEHAVIOURS))
    if "byte-exact" in names and len(set(names) & set(ECHO_BEHAVIOURS)):
        raise BehaviourConflict(f"behaviour recipe {spec!r} combines byte-exact with an echo rewrite; drop one of them")
    for a, b in CONFLICTS:
        if a in names and b in names:
            raise BehaviourConflict(
                f"behaviours {a} and {b} cannot share a session; give them as separate --behaviour values"
            )
    return names


class Echo:
    """The echo side of a recipe: turns the gateway's reply into what the harness sends back."""

    def __init__(self, recipe: tuple[str, ...], rng: random.Random):
        self.active = [name for name in ECHO_BEHAVIOURS if name in recipe]
        self.rng = rng
        # A streaming client either drops the streaming-only `index` or renumbers it; one per session.
        self.index_mode = rng.choice(("drop", "renumber")) if "streaming" in recipe else None

    def __call__(self, response: dict[str, Any]) -> dict[str, Any]:
        message = copy.deepcopy(response)
        for name in self.active:
            message = getattr(self, "_" + name.replace("-", "_"))(message)
        return message

    def _claude_code(self, message: dict) -> dict:
        for call in message.get("tool_calls") or []:
            function = call["function"]
            if function["name"] in UNTOUCHED_BY_CLAUDE_CODE:
                continue
            arguments = rstrip_lines(json.loads(function["arguments"]))
            for key, default in HARNESS_FILLED_DEFAULTS.get(function["name"], {}).items():
                arguments.setdefault(key, default)
            # The harness serializes like JSON.stringify: compact separators.
            function["arguments"] = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
        return message

    def _json_reserialize(self, message: dict) -> dict:
        for call in message.get("tool_calls") or []:
            arguments = json.loads(call["function"]["arguments"])
            call["function"]["arguments"] = json.dumps(
                arguments, ensure_ascii=False, sort_keys=True, separators=(",", ":")
            )
        return message

    def _reasoning_dropped(self, message: dict) -> dict:
        message.pop("reasoning_content", None)
        return message

    def _reasoning_rekeyed(self, message: dict) -> dict:
        if "reasoning_content" in message:
            message["reasoning"] = message.pop("reasoning_content")
        return message

    def _streaming(self, message: dict) -> dict:
        rebuilt = []
        for position, call in enumerate(message.get("tool_calls") or []):
            call = {key: value for key, value in call.items() if key != "index"}
            if self.index_mode == "renumber":
                call = {"index": position, **call}
            call["id"] = call_id(self.rng)
            rebuilt.append(call)
        if rebuilt:
            message["tool_calls"] = rebuilt
        return message


def rstrip_lines(value: Any) -> Any:
    """Every string inside `value` with each line right-stripped (dicts and lists recursively)."""
    if isinstance(value, str):
        return "\n".join(line.rstrip() for line in value.split("\n"))
    if isinstance(value, dict):
        return {key: rstrip_lines(item) for key, item in value.items()}
    if isinstance(value, list):
        return [rstrip_lines(item) for item in value]
    return value


def clear_old_tool_results(messages: list[dict], keep_last: int, placeholder: str) -> int:
    """Replace the content of all but the last `keep_last` tool messages, in place; returns how many."""
    positions = [i for i, m in enumerate(messages) if m.get("role") == "tool"]
    cleared = 0
    for i in positions[: max(len(positions) - keep_last, 0)]:
        if messages[i]["content"] != placeholder:
            messages[i]["content"] = placeholder
            cleared += 1
    return cleared
