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

from trace_tools.errors import TraceToolsError, UnknownName, UsageError
from trace_tools.render.harness_echo import HarnessEcho, load_profile
from trace_tools.render.normalize import parse_arguments
from trace_tools.simulate.formats import call_id

BEHAVIOURS: dict[str, str] = {
    "byte-exact": "The harness echoes every assistant message exactly as the gateway returned it.",
    "claude-code": "Echo as Claude Code 2.1.332 does, measured by trace-tools probe (the shipped harness profile): "
    "a leading `cd <working directory> && ` removed from Bash commands, Edit's replace_all filled in and its keys "
    "reordered, trailing whitespace (JavaScript's set) stripped per line from Edit new_string and Write content "
    "except in Markdown files, arguments sent back as objects (Anthropic protocol).",
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
ECHO_BEHAVIOURS = (
    "claude-code",
    "harness-profile",
    "json-reserialize",
    "reasoning-dropped",
    "reasoning-rekeyed",
    "streaming",
)
SESSION_BEHAVIOURS = ("retry", "subagent", "compaction", "truncation", "history-edit", "noncanonical-tokenization")
# One more echo behaviour, outside the default cycle because it needs a file: the harness profile
# given with --harness-profile (a profile.json measured by trace-tools probe, or a shipped name).
PROFILE_BEHAVIOUR = "harness-profile"
CONFLICTS = (("reasoning-dropped", "reasoning-rekeyed"), ("claude-code", PROFILE_BEHAVIOUR))
# The harness profile `claude-code` plays (shipped package data, `render/harness_profiles/`).
CLAUDE_CODE_PROFILE = "claude-code-2.1.332"

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
        if name not in BEHAVIOURS and name != PROFILE_BEHAVIOUR:
            raise UnknownName("behaviour", name, [*BEHAVIOURS, PROFILE_BEHAVIOUR])
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


def harness_echo(recipe: tuple[str, ...], profile: HarnessEcho | None) -> HarnessEcho | None:
    """The measured harness a recipe plays: Claude Code's shipped profile, or the one given."""
    if "claude-code" in recipe:
        return HarnessEcho(load_profile(CLAUDE_CODE_PROFILE))
    if PROFILE_BEHAVIOUR in recipe:
        if profile is None:
            raise UsageError("behaviour harness-profile needs a profile: pass --harness-profile FILE")
        return profile
    return None


class Echo:
    """The echo side of a recipe: turns the gateway's reply into what the harness sends back.

    `cwd` is the working directory the session's harness announced (profiles that remove a
    `cd {cwd} && ` prefix need it)."""

    def __init__(self, recipe: tuple[str, ...], rng: random.Random, profile: HarnessEcho | None = None):
        self.active = [name for name in ECHO_BEHAVIOURS if name in recipe]
        self.rng = rng
        self.harness = harness_echo(recipe, profile)
        self.cwd: str | None = None
        # A streaming client either drops the streaming-only `index` or renumbers it; one per session.
        self.index_mode = rng.choice(("drop", "renumber")) if "streaming" in recipe else None

    def __call__(self, response: dict[str, Any]) -> dict[str, Any]:
        message = copy.deepcopy(response)
        for name in self.active:
            message = getattr(self, "_" + name.replace("-", "_"))(message)
        return message

    def _claude_code(self, message: dict) -> dict:
        assert self.harness is not None, "claude-code plays its shipped profile"
        return self.harness.echo(message, self.cwd)

    _harness_profile = _claude_code

    def _json_reserialize(self, message: dict) -> dict:
        for call in message.get("tool_calls") or []:
            arguments = parse_arguments(call["function"]["arguments"])
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


def clear_old_tool_results(messages: list[dict], keep_last: int, placeholder: str) -> int:
    """Replace the content of all but the last `keep_last` tool messages, in place; returns how many."""
    positions = [i for i, m in enumerate(messages) if m.get("role") == "tool"]
    cleared = 0
    for i in positions[: max(len(positions) - keep_last, 0)]:
        if messages[i]["content"] != placeholder:
            messages[i]["content"] = placeholder
            cleared += 1
    return cleared
