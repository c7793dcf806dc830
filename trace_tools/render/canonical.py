"""Canonicalization: the gateway adapter's `translate` step, replayed offline (docs/rendering.md#canonicalization).

What a gateway stores and renders is not the harness's raw request but a normalised copy, and
every upstream normalises differently; that choice decides whether an echoed assistant message
matches the stored one, hence fork counts. Policies:

* `slime` (default): slime's OpenAI `_translate_messages`:
  `developer`→`system`; system/user/tool become `{role, content}` with content flattened to text
  (the tool message's `tool_call_id` is dropped); an assistant keeps `reasoning_content` only when
  truthy and its tool calls as `{"type":"function","function":{"name","arguments": dict}}`, wire
  ids dropped, string arguments `json.loads`-ed, unparsable or non-object arguments kept as
  `{"_raw_arguments": original}`; unknown roles are dropped. One documented deviation: slime's
  translate keeps every tool call and so do we — "first call only" is slime's *reply* shaping,
  a property of the recording, not something replay imposes.
* `uniagent`: uni-agent's OpenAI adapter normalisation (docs/upstream_chains.md#adapter-normalization).
* `miles`: messages as sent (miles compares them with its own matchers later).
* `none`: messages as sent.

Every policy returns new objects; the input is never mutated. The pipeline then `freeze`s what a
policy returns: memos downstream (digests, template forms, window renders) key on a message's
identity, which is safe only because a canonical message never changes.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Callable, Sequence

from trace_tools.errors import UnknownName

_SLIME_ROLES = {"system", "user", "tool", "assistant"}
_UNIAGENT_KEYS = ("name", "tool_calls", "tool_call_id", "reasoning_content")


def flatten_content(content: Any) -> str:
    """Content as the chat template sees it under slime: text parts joined by newlines.

    Text-like parts (`text`, `input_text`, `output_text`) give their text, images a placeholder,
    nested `content` is flattened recursively; empty pieces are skipped. Non-list values become
    `str(value)`, None becomes "".
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return str(content)
    return "\n".join(piece for piece in map(_flatten_part, content) if piece)


def _flatten_part(part: Any) -> str:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        return str(part)
    kind = part.get("type")
    if kind in ("text", "input_text", "output_text"):
        return part.get("text") or ""
    if kind == "tool_result":
        return flatten_content(part.get("content"))
    if kind in ("image", "image_url", "input_image"):
        return "[image omitted]"
    if "content" in part:
        return flatten_content(part.get("content"))
    if "text" in part:
        return str(part.get("text") or "")
    return ""


def slime_arguments(arguments: Any) -> dict:
    """Tool-call arguments as a dict: JSON strings parsed, anything else that is not an object raw."""
    if arguments is None:
        return {}
    if isinstance(arguments, dict):
        return copy.deepcopy(arguments)
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return {"_raw_arguments": arguments}
        return parsed if isinstance(parsed, dict) else {"_raw_arguments": arguments}
    return {"_raw_arguments": copy.deepcopy(arguments)}


def _slime_tool_call(call: dict) -> dict:
    function = call.get("function")
    if not isinstance(function, dict):
        function = {}
    name = function.get("name", call.get("name"))
    arguments = function.get("arguments", call.get("arguments"))
    return {"type": "function", "function": {"name": name, "arguments": slime_arguments(arguments)}}


def _slime_message(message: Any) -> dict | None:
    if not isinstance(message, dict):
        return None
    role = message.get("role")
    role = "system" if role == "developer" else role
    if role not in _SLIME_ROLES:
        return None
    out: dict[str, Any] = {"role": role, "content": flatten_content(message.get("content"))}
    if role != "assistant":
        return out
    if message.get("reasoning_content"):
        out["reasoning_content"] = message["reasoning_content"]
    calls = message.get("tool_calls") or []
    if isinstance(calls, list) and calls:
        out["tool_calls"] = [_slime_tool_call(call) for call in calls if isinstance(call, dict)]
    return out


def _uniagent_arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return arguments
        return parsed if isinstance(parsed, dict) else arguments
    return copy.deepcopy(arguments)


def _uniagent_tool_call(call: Any) -> Any:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return copy.deepcopy(call)
    out = copy.deepcopy(call)  # id, type, index ... stay as sent
    if "arguments" in out["function"]:
        out["function"]["arguments"] = _uniagent_arguments(call["function"]["arguments"])
    return out


def _uniagent_message(message: Any) -> dict | None:
    """uni-agent keeps role, content (None → ""), name, tool_calls, tool_call_id, reasoning_content."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str) or not message["role"]:
        return None
    content = message.get("content")
    out: dict[str, Any] = {"role": message["role"], "content": "" if content is None else copy.deepcopy(content)}
    for key in _UNIAGENT_KEYS:
        if key not in message:
            continue
        value = message[key]
        if key == "tool_calls" and isinstance(value, list):
            value = [_uniagent_tool_call(call) for call in value]
        elif key == "tool_call_id" and value is not None:
            value = str(value)
        else:
            value = copy.deepcopy(value)
        out[key] = value
    return out


def _as_sent(message: Any) -> dict | None:
    return copy.deepcopy(message) if isinstance(message, dict) else None


_PER_MESSAGE: dict[str, Callable[[Any], dict | None]] = {
    "slime": _slime_message,
    "none": _as_sent,
    "uniagent": _uniagent_message,
    "miles": _as_sent,
}
POLICIES = tuple(_PER_MESSAGE)


def _policy(name: str | None) -> Callable[[Any], dict | None]:
    name = name or "slime"
    if name not in _PER_MESSAGE:
        raise UnknownName("canonicalization policy", name, POLICIES)
    return _PER_MESSAGE[name]


def message_translator(policy: str | None = "slime") -> Callable[[Any], dict | None]:
    """The per-message translate function of a policy (None drops the message)."""
    return _policy(policy)


def canonicalize_messages(messages: Sequence[Any], policy: str | None = "slime") -> list[dict]:
    """The request messages as the named gateway would store and render them."""
    convert = _policy(policy)
    return [m for m in (convert(message) for message in messages or ()) if m is not None]


class FrozenDict(dict):
    """A dict that refuses every change: a canonical message, or a mapping inside one. It is still
    a dict (JSON, templates, `==` and `{**message}` see no difference); a copy (`dict(m)`,
    `copy.copy`, `copy.deepcopy`, pickling) is a plain, changeable dict."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("canonical messages are immutable (memos key on their identity); copy one to change it")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse  # type: ignore[assignment]

    def __reduce_ex__(self, protocol: Any) -> Any:  # what copy, deepcopy and pickle rebuild
        return (dict, (dict(self),))


class FrozenList(list):
    """A list that refuses every change (the lists inside a canonical message)."""

    __slots__ = ()

    _refuse = FrozenDict._refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse  # type: ignore[assignment]
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse  # type: ignore[assignment]

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (list, (list(self),))


def freeze(value: Any) -> Any:
    """`value` with every dict and list in it made immutable (`FrozenDict`, `FrozenList`)."""
    kind = type(value)
    if kind is dict:
        return FrozenDict({key: freeze(item) for key, item in value.items()})
    if kind is list:
        return FrozenList([freeze(item) for item in value])
    return value


def canonicalize_response(message: dict | None, policy: str | None = "slime") -> dict | None:
    """The recorded response message under the same policy (a missing or null role reads as
    assistant: row validation accepts both in a response)."""
    if message is None:
        return None
    if isinstance(message, dict) and message.get("role") is None:
        message = {"role": "assistant", **{key: value for key, value in message.items() if key != "role"}}
    return _policy(policy)(message)
