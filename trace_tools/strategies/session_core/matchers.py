"""Message matchers (docs/upstream_session.md#matchers): how a request's history is compared with
the stored messages, under miles' contract (anything but a bool, or an exception, is a 500)."""

from __future__ import annotations

import json
import math
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Sequence

from trace_tools.errors import UnknownName
from trace_tools.strategies.session_core.errors import (
    ServerError,
)

Matcher = Callable[[dict, dict], bool]
TEMPLATE_KEYS = ("role", "content", "reasoning_content", "tool_calls")
_WIRE_ONLY_CALL_KEYS = ("index",)


def collapse_empty(value: Any) -> Any:
    """N(): None, "" and [] read alike (Jinja renders them alike); whitespace is NOT empty."""
    if value is None or value == "" or value == []:
        return None
    return value


def without_wire_keys(calls: Any) -> Any:
    """TC(): a shallow copy of each dict call minus `index`; null-valued keys stay (final upstream rule)."""
    if not isinstance(calls, list):
        return calls
    return [{k: v for k, v in c.items() if k not in _WIRE_ONLY_CALL_KEYS} if isinstance(c, dict) else c for c in calls]


def strict_match(stored: dict, new: dict) -> bool:
    """miles' default matcher: role, content, reasoning_content and tool_calls under N(), plain equality.

    Tool-call `id` and raw `arguments` are compared as they are; only `index` is ignored.
    """
    if stored is new:  # the same message object (replayed history shares them): equal by definition
        return True
    for key in TEMPLATE_KEYS:
        left, right = collapse_empty(stored.get(key)), collapse_empty(new.get(key))
        if key == "tool_calls":
            left, right = without_wire_keys(left), without_wire_keys(right)
        if left != right:
            return False
    return True


def role_content_only_match(stored: dict, new: dict) -> bool:
    """Only role and content (under N()); reasoning and tool calls are ignored."""
    return all(collapse_empty(stored.get(k)) == collapse_empty(new.get(k)) for k in ("role", "content"))


def loose_tool_call_match(stored: dict, new: dict) -> bool:
    """strict, plus JSON-object equivalence of `tool_calls[].function.arguments`.

    Everything else a call carries (id, type, name, extension keys, order) is still compared.
    """
    try:
        if strict_match(stored, new):
            return True
    except RecursionError:
        pass
    if not all(
        collapse_empty(stored.get(k)) == collapse_empty(new.get(k)) for k in ("role", "content", "reasoning_content")
    ):
        return False
    left, right = collapse_empty(stored.get("tool_calls")), collapse_empty(new.get("tool_calls"))
    if not isinstance(left, list) or not isinstance(right, list):
        return same_structure(left, right)
    return len(left) == len(right) and all(map(_calls_match, left, right))


def _calls_match(left: Any, right: Any) -> bool:
    if not isinstance(left, dict) or not isinstance(right, dict):
        return same_structure(left, right)
    left, right = without_wire_keys([left])[0], without_wire_keys([right])[0]
    if left.keys() != right.keys():
        return False
    return all(_functions_match(left[k], right[k]) if k == "function" else left[k] == right[k] for k in left)


def _functions_match(left: Any, right: Any) -> bool:
    if not isinstance(left, dict) or not isinstance(right, dict):
        return same_structure(left, right)
    if left.keys() != right.keys():
        return False
    return all(_arguments_match(left[k], right[k]) if k == "arguments" else left[k] == right[k] for k in left)


def _arguments_match(left: Any, right: Any) -> bool:
    tree_left, tree_right = json_object_tree(left), json_object_tree(right)
    if tree_left is INVALID_JSON_OBJECT or tree_right is INVALID_JSON_OBJECT:
        return same_structure(left, right)
    return tree_left == tree_right


def same_structure(left: Any, right: Any) -> bool:
    """Type-sensitive structural equality (True != 1, 1 != 1.0), the loose matcher's fallback."""
    try:
        if type(left) is not type(right):
            return False
        if isinstance(left, list):
            return len(left) == len(right) and all(map(same_structure, left, right))
        if isinstance(left, dict):
            return left.keys() == right.keys() and all(same_structure(left[k], right[k]) for k in left)
        return left == right
    except RecursionError:
        return False


INVALID_JSON_OBJECT = object()


def json_object_tree(value: Any) -> Any:
    """Arguments as a type-tagged canonical tree, or INVALID_JSON_OBJECT.

    None and "" are the empty object; a string must parse as a JSON object (no duplicate keys, no
    NaN/Infinity); a dict must be JSON-compatible. Numbers become exact Decimals (1 == 1.0), tags
    keep booleans, strings and numbers apart, object keys are sorted, arrays keep their order.
    """
    if value is None or value == "":
        return ("object", ())
    parsed = value
    if type(value) is str:
        try:
            parsed = json.loads(
                value,
                object_pairs_hook=_no_duplicate_keys,
                parse_int=Decimal,
                parse_float=_finite_decimal,
                parse_constant=_no_constant,
            )
        except (OverflowError, RecursionError, TypeError, ValueError):
            return INVALID_JSON_OBJECT
    if type(parsed) is not dict:
        return INVALID_JSON_OBJECT
    try:
        return _tagged(parsed, decimals_allowed=type(value) is str)
    except (RecursionError, TypeError, ValueError):
        return INVALID_JSON_OBJECT


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate key in a JSON object")
    return dict(pairs)


def _finite_decimal(text: str) -> Decimal:
    try:
        number = Decimal(text)
    except InvalidOperation as exc:
        raise ValueError(f"not a JSON number: {text!r}") from exc
    if not number.is_finite():
        raise ValueError(f"not a finite JSON number: {text!r}")
    return number


def _no_constant(text: str) -> Any:
    raise ValueError(f"non-standard JSON constant {text!r}")


def _tagged(value: Any, *, decimals_allowed: bool) -> tuple:
    kind = type(value)
    if value is None:
        return ("null",)
    if kind is bool:
        return ("boolean", value)
    if kind is str:
        return ("string", value)
    if kind is int:
        return ("number", Decimal(value))
    if kind is float:
        if not math.isfinite(value):
            raise ValueError("non-finite number")
        return ("number", Decimal(str(value)))
    if kind is Decimal and decimals_allowed and value.is_finite():
        return ("number", value)
    if kind is list:
        return ("array", tuple(_tagged(v, decimals_allowed=decimals_allowed) for v in value))
    if kind is dict:
        if any(type(k) is not str for k in value):
            raise ValueError("object keys must be strings")
        return ("object", tuple(sorted((k, _tagged(v, decimals_allowed=decimals_allowed)) for k, v in value.items())))
    raise ValueError(f"{kind.__name__} is not JSON-compatible")


MATCHERS: dict[str, Matcher] = {
    "strict": strict_match,
    "loose_tool_call": loose_tool_call_match,
    "role_content_only": role_content_only_match,
}


def resolve_matcher(name: str | None) -> Matcher:
    """The matcher registered under `name` (default `strict`)."""
    try:
        return MATCHERS[name or "strict"]
    except KeyError:
        raise UnknownName("session matcher", str(name), sorted(MATCHERS)) from None


def matches(match: Matcher, stored: Any, new: Any) -> bool:
    """Call a matcher under miles' contract: anything but a bool, or an exception, is a 500."""
    try:
        result = match(stored, new)
    except Exception as exc:  # noqa: BLE001 - the contract maps every matcher failure to a 500
        raise ServerError(f"session message matcher failed: {exc!r}") from exc
    if type(result) is not bool:
        raise ServerError(f"session message matcher returned {type(result).__name__}, not bool")
    return result


def remembered(match: Matcher) -> Matcher:
    """`match` with its verdicts memoised per (stored, request) message pair, for one session.

    Every request re-sends the whole history, which the server compares against its stored
    messages again; messages are never mutated, so a pair's verdict does not change. A matcher
    that raises is asked again next time (its exception is not remembered)."""
    verdicts: dict[tuple[int, int], tuple[Any, Any, Any]] = {}

    def memoised(stored: Any, new: Any) -> Any:
        hit = verdicts.get((id(stored), id(new)))
        if hit is None or hit[0] is not stored or hit[1] is not new:
            hit = verdicts[id(stored), id(new)] = (stored, new, match(stored, new))
        return hit[2]

    return memoised


def common_prefix_messages(stored: Sequence[dict], request: Sequence[dict], match: Matcher) -> int:
    """Length of the pairwise common prefix under `match` (stops at the first mismatch)."""
    count = 0
    for old, new in zip(stored, request):
        if not matches(match, old, new):
            break
        count += 1
    return count
