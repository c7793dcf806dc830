"""uni-agent's adapter normalization (docs/upstream_chains.md#adapter-normalization) and the canonical
form and cumulative prefix hashes that pick a chain (docs/upstream_chains.md#canonical-form-and-prefix-hashes)."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Sequence

from trace_tools.memo import IdentityMemo
from trace_tools.render.canonical import canonicalize_messages, canonicalize_response
from trace_tools.strategies.chains_core.errors import RequestRejected

# Our own salts (the hashes never leave the process); the equivalences are uni-agent's.
_MESSAGE_SALT = b"trace-tools-chains-message\0"
_PREFIX_SALT = b"trace-tools-chains-prefix\0"
EMPTY_PREFIX = hashlib.sha256(_PREFIX_SALT + b"empty").hexdigest()


def normalize_request(messages: Any, tools: Any) -> tuple[list[dict], list | None]:
    """Check and lower an OpenAI chat request the way uni-agent's adapter does before hashing.

    What the adapter refuses (HTTP 400 upstream) raises RequestRejected; the lowering itself is
    the shared `uniagent` canonicalization policy (trace_tools.render.canonical).
    """
    if not isinstance(messages, list) or not messages:
        raise RequestRejected("messages must be a non-empty list")
    if tools is not None and not isinstance(tools, list):
        raise RequestRejected("tools must be a list or null")
    for message in messages:
        _check_message(message)
    return canonicalize_messages(messages, policy="uniagent"), tools


class Lowering:
    """`normalize_request` and `message_hash` once per message object. A replayed session re-sends
    its whole history every turn and the pipeline hands out the same (never mutated) message
    objects turn after turn, so lowering and hashing them again each turn would be quadratic."""

    def __init__(self) -> None:
        self._lowered: IdentityMemo[dict | None] = IdentityMemo()
        self._hashes: IdentityMemo[str] = IdentityMemo()

    def request(self, messages: Any, tools: Any) -> tuple[list[dict], list | None]:
        if not isinstance(messages, list) or not messages or (tools is not None and not isinstance(tools, list)):
            return normalize_request(messages, tools)  # the adapter's own refusal
        lowered = [self._lowered.get(message, _lower) for message in messages]
        return [m for m in lowered if m is not None], tools

    def message_hash(self, message: dict) -> str:
        return self._hashes.get(message, message_hash)


def _lower(message: Any) -> dict | None:
    """One request message as `normalize_request` lowers it (None when the adapter drops it)."""
    _check_message(message)
    kept = canonicalize_messages([message], policy="uniagent")
    return kept[0] if kept else None


def normalize_assistant(message: dict) -> dict:
    """The stored assistant: the recorded response lowered like a request message (no re-decode).

    Keeps role, content (None becomes ""), name, tool_calls (string arguments that parse as a
    JSON object become that object, ids and `index` stay), tool_call_id and reasoning_content.
    """
    stored = canonicalize_response(message, policy="uniagent")
    if stored is None:
        raise RequestRejected(f"the recorded response needs a non-empty string role, got {message.get('role')!r}")
    return stored


def _check_message(message: Any) -> None:
    if not isinstance(message, dict):
        raise RequestRejected(f"each message must be an object, got {type(message).__name__}")
    if not isinstance(message.get("role"), str) or not message["role"]:
        raise RequestRejected("each message needs a non-empty string role")
    if message.get("content") is not None and not isinstance(message["content"], (str, list, dict)):
        raise RequestRejected(
            f"message content must be a string, a list or an object, got {type(message['content']).__name__}"
        )
    if message.get("name") is not None and not isinstance(message["name"], str):
        raise RequestRejected("a message name must be a string")
    if message.get("reasoning_content") is not None and not isinstance(message["reasoning_content"], str):
        raise RequestRejected("reasoning_content must be a string or null")
    calls = message.get("tool_calls")
    if calls is not None and (
        not isinstance(calls, list)
        or not all(isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls)
    ):
        raise RequestRejected("tool_calls must be a list of objects, each with a `function` object")


# ---------------------------------------------------------------------------------------------
# Canonical form and cumulative prefix hashes (docs/upstream_chains.md#canonical-form-and-prefix-hashes)
# ---------------------------------------------------------------------------------------------


def canonical_message(message: dict) -> dict:
    """The form that is hashed: tool-call ids and `tool_call_id` removed, arguments tagged.

    Arguments become ["json", value] when they are (or parse as) JSON and ["raw", value]
    otherwise, so key order and string-vs-object spelling do not matter. Everything else —
    `index`, `type`, `name`, `reasoning_content`, `content` — takes part in the identity.
    """
    canon = {key: value for key, value in message.items() if key != "tool_call_id"}
    if isinstance(canon.get("tool_calls"), list):
        canon["tool_calls"] = [_canonical_call(call) for call in canon["tool_calls"]]
    return canon


def _canonical_call(call: Any) -> Any:
    if not isinstance(call, dict):
        return call
    canon = {key: value for key, value in call.items() if key != "id"}
    function = canon.get("function")
    if isinstance(function, dict) and "arguments" in function:
        canon["function"] = {**function, "arguments": _tagged_arguments(function["arguments"])}
    return canon


def _tagged_arguments(arguments: Any) -> list:
    if isinstance(arguments, (dict, list)):
        return ["json", arguments]
    if isinstance(arguments, str):
        try:
            return ["json", json.loads(arguments)]
        except ValueError:
            pass
    return ["raw", arguments]


def message_hash(message: dict) -> str:
    body = json.dumps(canonical_message(message), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(_MESSAGE_SALT + body.encode("utf-8")).hexdigest()


def extend_prefix_hash(previous: str | None, message: dict, hash_message: Callable[[dict], str] = message_hash) -> str:
    link = (previous or EMPTY_PREFIX).encode("ascii") + b"\0" + hash_message(message).encode("ascii")
    return hashlib.sha256(_PREFIX_SALT + link).hexdigest()


def prefix_hashes(messages: Sequence[dict], hash_message: Callable[[dict], str] = message_hash) -> list[str]:
    """H[i] identifies messages[:i + 1]; equal H[i] means equal canonical prefixes."""
    hashes: list[str] = []
    for message in messages:
        hashes.append(extend_prefix_hash(hashes[-1] if hashes else None, message, hash_message))
    return hashes
