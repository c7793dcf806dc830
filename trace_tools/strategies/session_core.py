"""miles' session server replayed offline: matchers, TITO tokenizer, v1 trajectory, v2 forest, assembly.

The algorithms are those of reference/miles_uniagent.md §2 (miles HEAD 31f1ca96). Everything here
is pure and deterministic: no HTTP, no clocks. Where the live server answers a request with a
non-200 status, this module raises the matching exception and stores nothing:

* `RequestRejected` — a 400 (append-only violation, disallowed role, rollback deeper than one
  generation, conflicting fixed template kwarg) or, as `TruncatedExtension`, the v2 409;
* `ServerError` — a 500 (prefix check at commit, template failure, unparsable tool-call
  arguments, suffix render that is not a prefix extension, v2 node cap, matcher contract);
* `AssemblyError` — a 422 from the samples op.

Replay differs from the server in one place only: instead of calling the engine, a request
commits the generation that was recorded for it (`Generation`). The prompt the TITO tokenizer
builds may differ from the recorded prompt ids; the strategies report that (counterfactual
replay, DESIGN §3).
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Iterable, Sequence

from trace_tools.data import Sample
from trace_tools.errors import ReplayError, UnknownName
from trace_tools.ids import common_prefix_len, starts_with
from trace_tools.memo import IdentityMemo
from trace_tools.render.base import RendererLike
from trace_tools.render.upstream import ArgumentFormError, render_failure_reason, took_lenient
from trace_tools.strategies.base import failure_reason


# ---------------------------------------------------------------------------------------------
# HTTP outcomes
# ---------------------------------------------------------------------------------------------
class SessionHTTPError(Exception):
    """A request the live session server answers with a non-200 status (nothing is stored).

    `reason`: how the failure is counted, where the message alone does not say it well."""

    status = 0

    def __init__(self, message: str = "", reason: str | None = None):
        super().__init__(message)
        self.reason = reason


class RequestRejected(SessionHTTPError):
    """HTTP 400: the request is refused before the engine is called. Counted as `rejected_requests`."""

    status = 400


class TruncatedExtension(RequestRejected):
    """HTTP 409 (v2): the request extends a generation that stopped on `length`."""

    status = 409


class ServerError(SessionHTTPError):
    """HTTP 500 (or an uncaught ValueError upstream). Counted as `server_errors`."""

    status = 500


class AssemblyError(Exception):
    """HTTP 422 from `POST /sessions/{id}/samples`: the whole samples op fails."""

    status = 422


# ---------------------------------------------------------------------------------------------
# Matchers (§2.3)
# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# Request preparation (§2.2, §2.4.1)
# ---------------------------------------------------------------------------------------------
_BOOL_WORDS = {
    "true": True,
    "1": True,
    "yes": True,
    "y": True,
    "on": True,
    "t": True,
    "false": False,
    "0": False,
    "no": False,
    "n": False,
    "off": False,
    "f": False,
}


def sglang_tools(tools: Sequence[Any] | None) -> list[dict] | None:
    """Tools as SGLang v0.5.16's `Tool.model_dump()` gives them: the shape every miles render sees.

    A bare function dict is wrapped as {"type": "function", "function": ...}. The function keeps
    exactly the model's fields in its order — description, name, parameters, strict (default
    False, so the rendered tool JSON gains `"strict": false` and its keys are reordered) — plus
    `defer_loading` only when set (the model's serializer drops it when None); unknown keys are
    dropped. The tool itself always carries `"defer_loading"` (null unless set), and a set tool
    flag is copied into a function that has none. A schema the model refuses is a 500.
    """
    if not tools:
        return None
    return [_sglang_tool(tool) for tool in tools]


def _sglang_tool(tool: Any) -> dict:
    wrapped = tool if isinstance(tool, dict) and "function" in tool else {"type": "function", "function": tool}
    function, kind = wrapped.get("function"), wrapped.get("type", "function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not isinstance(kind, str):
        raise ServerError(f"tool schema refused by SGLang's Tool model: {str(tool)[:200]}")
    name = function["name"]
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise ServerError(f"tool {name!r}: description must be a string")
    tool_defer = _optional_model_bool(wrapped.get("defer_loading"), name)
    function_defer = _optional_model_bool(function.get("defer_loading"), name)
    dumped = {
        "description": description,
        "name": name,
        "parameters": function.get("parameters"),
        "strict": _model_bool(function.get("strict", False), name),
    }
    if function_defer is None:
        function_defer = tool_defer  # the model's after-validator propagates the tool-level flag
    if function_defer is not None:
        dumped["defer_loading"] = function_defer
    return {"type": kind, "function": dumped, "defer_loading": tool_defer}


def _optional_model_bool(value: Any, name: str) -> bool | None:
    return None if value is None else _model_bool(value, name)


def _model_bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _BOOL_WORDS:
        return _BOOL_WORDS[value.strip().lower()]
    raise ServerError(f"tool {name!r}: strict and defer_loading must be booleans, got {value!r}")


def template_messages(messages: Sequence[dict]) -> list[dict]:
    """The messages prepared for the template: assistant content None → "", string arguments
    parsed. Upstream deep-copies the request; only the messages this changes are copied here (the
    others are never mutated), which keeps their identity for the render caches.

    An argument string that is not JSON raises (a 500 upstream: nothing on the chat path catches it).
    """
    return [_template_message(message) for message in messages]


def _template_message(message: Any) -> Any:
    if not (isinstance(message, dict) and message.get("role") == "assistant"):
        return message
    if message.get("content") is not None and not _has_string_arguments(message.get("tool_calls")):
        return message
    prepared = copy.deepcopy(message)
    if prepared.get("content") is None:
        prepared["content"] = ""
    _parse_arguments(prepared.get("tool_calls"))
    return prepared


def _has_string_arguments(calls: Any) -> bool:
    return isinstance(calls, list) and any(
        isinstance(call, dict)
        and isinstance(call.get("function"), dict)
        and isinstance(call["function"].get("arguments"), str)
        for call in calls
    )


def _parse_arguments(calls: Any) -> None:
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            try:
                function["arguments"] = json.loads(function["arguments"])
            except ValueError as exc:
                raise ServerError(f"tool-call arguments are not JSON: {function['arguments'][:120]!r}") from exc


# ---------------------------------------------------------------------------------------------
# TITO families and tokenizer (§2.4)
# ---------------------------------------------------------------------------------------------
ALL_ROLES = frozenset({"tool", "user", "system", "assistant"})


@dataclass(frozen=True)
class TitoFamily:
    """One row of miles' `--tito-model` table.

    `boundary_token`: when a checkpoint ends with it, `fix_boundary` appends "\\n" (the Qwen stop
    token is followed by a newline the model never generates). `dropped_boundaries`: stop tokens
    that double as the next message's opener (GLM's `<|observation|>`, `<|user|>`): a checkpoint
    ending with one loses it, the appended messages render it again, and the turn's sample gives
    it up (`max_trim_tokens`). `extra_kwargs` are the preserve-think constants merged into every
    render; a request may not override them.
    """

    name: str
    boundary_token: str | None = None
    max_trim_tokens: int = 0
    extra_kwargs: tuple[tuple[str, Any], ...] = ()
    allowed_append_roles: frozenset[str] = ALL_ROLES
    dropped_boundaries: tuple[str, ...] = ()


FAMILIES: dict[str, TitoFamily] = {
    "default": TitoFamily("default"),
    "qwen3": TitoFamily("qwen3", "<|im_end|>", 0, (("clear_thinking", False),)),
    "qwen35": TitoFamily(
        "qwen35", "<|im_end|>", 0, (("clear_thinking", False),), frozenset({"tool", "user", "assistant"})
    ),
    "glm47": TitoFamily(
        "glm47", None, 1, (("clear_thinking", False),), dropped_boundaries=("<|observation|>", "<|user|>")
    ),
}
# Renderer.family -> miles family. miles has no V3, gpt-oss or Llama family: those use `default`.
_RENDERER_FAMILIES = {"qwen3": "qwen3", "qwen3.5": "qwen35", "glm4.5": "glm47"}


def family_for(renderer: Any, name: str | None = None) -> TitoFamily:
    """The explicit family `name`, else the one matching `renderer.family`, else `default`."""
    key = name or _RENDERER_FAMILIES.get(getattr(renderer, "family", None) or "", "default")
    try:
        return FAMILIES[key]
    except KeyError:
        raise UnknownName("TITO family", key, sorted(FAMILIES)) from None


def _template_errors() -> tuple[type[BaseException], ...]:
    from jinja2 import TemplateError

    # Renderer wraps jinja's TemplateError in ReplayError; a fake renderer may raise either.
    return (TemplateError, ReplayError)


def _template_failure(what: str, exc: BaseException) -> ServerError:
    """The 500 of a render that raised (`render_failure_reason` says how it is counted)."""
    return ServerError(f"{what}: {exc}", render_failure_reason(what, exc))


class TitoTokenizer:
    """Token-in-token-out prompt construction over any `RendererLike`.

    `full_render` renders a whole request; `merge_tokens` extends a checkpoint with only the
    appended messages, tokenized from a text diff against a dummy base conversation.
    """

    DUMMY_SYSTEM = {"role": "system", "content": "dummy system"}

    def __init__(self, renderer: RendererLike, family: TitoFamily, template_kwargs: dict | None = None):
        self.renderer, self.family = renderer, family
        self.template_kwargs = {**dict(family.extra_kwargs), **(template_kwargs or {})}
        self._boundary_id: int | None | bool = False  # False = not looked up yet
        # Every request re-sends the history: each message and tool list is prepared once, and
        # keeps one identity for the render caches (entries hold their source, so ids stay unique).
        self._prepared: IdentityMemo[Any] = IdentityMemo()

    def for_request(self, request_kwargs: Any) -> "TitoTokenizer":
        """The tokenizer one request renders with: its chat_template_kwargs merged over the family's.

        A non-object value, or a value for a family constant that differs from it, is a 400.
        """
        if request_kwargs is None:
            return self
        if not isinstance(request_kwargs, dict):
            raise RequestRejected("chat_template_kwargs must be a JSON object")
        if not request_kwargs:
            return self
        for key, fixed in self.family.extra_kwargs:
            if key in request_kwargs and request_kwargs[key] != fixed:
                raise RequestRejected(
                    f"chat_template_kwargs[{key!r}]={request_kwargs[key]!r} conflicts with the "
                    f"{self.family.name} fixed template value {fixed!r}"
                )
        derived = TitoTokenizer(self.renderer, self.family, {**self.template_kwargs, **request_kwargs})
        derived._boundary_id, derived._prepared = self._boundary_id, self._prepared
        return derived

    # -- renders ---------------------------------------------------------------------------------
    def full_render(self, messages: Sequence[dict], tools: Sequence[dict] | None) -> list[int]:
        """Prompt ids of a whole request with the generation prompt (first turn, empty state, new root)."""
        return list(self._render(self.renderer.render, messages, tools, True))

    def render_text(self, messages: Sequence[dict], tools: Sequence[dict] | None, add_generation_prompt: bool) -> str:
        return self._render(self.renderer.render_text, messages, tools, add_generation_prompt)

    def _render(self, fn: Callable, messages: Sequence[dict], tools: Sequence[dict] | None, generation: bool) -> Any:
        prepared = [self._prepared.get(message, _template_message) for message in messages]
        tool_defs = self._prepared.get(tools, sglang_tools) if tools else None
        errors = _template_errors()
        try:
            return fn(prepared, tool_defs, generation, **self.template_kwargs)
        except ArgumentFormError as exc:  # a TypeError upstream: not a TemplateError, so no retry
            raise _template_failure("chat template rendering failed", exc) from exc
        except errors as exc:
            if tool_defs is None:
                raise _template_failure("chat template rendering failed", exc) from exc
        try:  # miles retries once with bare function dicts
            return fn(prepared, [t["function"] for t in tool_defs], generation, **self.template_kwargs)
        except errors as exc:
            raise _template_failure("chat template rendering failed (tool format fallback)", exc) from exc

    # -- incremental path --------------------------------------------------------------------------
    def tokenize_additional(self, old: Sequence[dict], new: Sequence[dict], tools: Sequence[dict] | None) -> list[int]:
        """Ids of `new[len(old):]` plus the generation prompt, from a diff over a dummy base.

        The base (dummy system + an empty assistant carrying the last stored message's tool
        calls) stands in for the real history, whose ids are the checkpoint. A template whose
        render of base + appended does not extend its render of base fails the request.
        """
        self._check_append_only(old, new)
        last_calls = (old[-1].get("tool_calls") if old else None) or []
        base: list[dict] = [
            dict(self.DUMMY_SYSTEM),
            {"role": "assistant", "content": "", "reasoning_content": " ", "tool_calls": last_calls},
        ]
        before = self.render_text(base, tools, False)
        after = self.render_text(base + list(new[len(old) :]), tools, True)
        if not after.startswith(before):
            raise ServerError(
                f"rendered suffix diff failed: the {self.family.name} template does not render "
                f"base + appended as an extension of base"
            )
        return self.renderer.encode(after[len(before) :])

    def _check_append_only(self, old: Sequence[dict], new: Sequence[dict]) -> None:
        # Always passes when called from the session paths (they pass the stored objects as the
        # prefix and gate roles first); kept because a violation here would be silent corruption.
        if len(new) < len(old) or common_prefix_messages(old, new, strict_match) < len(old):
            raise ServerError("tokenize_additional_messages: new messages do not extend the stored ones")
        for message in new[len(old) :]:
            if message.get("role") not in self.family.allowed_append_roles:
                raise ServerError(f"tokenize_additional_messages: role {message.get('role')!r} cannot be appended")

    def merge_tokens(
        self, old: Sequence[dict], new: Sequence[dict], prefix_ids: Sequence[int], tools: Sequence[dict] | None
    ) -> list[int]:
        """The next prompt: the checkpoint (boundary-fixed) followed by the appended messages' ids."""
        ids = self.fix_boundary(prefix_ids)  # a new list, so extending it copies nothing else
        ids += self.tokenize_additional(old, new, tools)
        return ids

    def fix_boundary(self, ids: Sequence[int]) -> list[int]:
        """Append "\\n" after a trailing boundary token (Qwen's `<|im_end|>`), drop a trailing stop
        token that opens the next message (GLM); identity otherwise."""
        boundary = self._boundary()
        if boundary is not None and ids and ids[-1] == boundary:
            return [*ids, *self.renderer.encode("\n")]
        if ids and ids[-1] in self._dropped():
            return list(ids[:-1])
        return list(ids)

    def _boundary(self) -> int | None:
        if self._boundary_id is False:
            token = self.family.boundary_token
            ids = self.renderer.encode(token) if token else []
            self._boundary_id = ids[0] if len(ids) == 1 else None
        return self._boundary_id

    def _dropped(self) -> set[int]:
        ids = (self.renderer.encode(token) for token in self.family.dropped_boundaries)
        return {token_ids[0] for token_ids in ids if len(token_ids) == 1}


# ---------------------------------------------------------------------------------------------
# Requests, generations, records
# ---------------------------------------------------------------------------------------------
@dataclass(slots=True)
class Generation:
    """What the engine returned for one request; replay takes it from the recording."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    message: dict[str, Any]  # the assistant message miles stores: the response as returned
    response_id: str = ""


@dataclass(slots=True)
class SessionRequest:
    """One recorded chat request as the session server receives it."""

    turn_index: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    generation: Generation
    chat_template_kwargs: dict[str, Any] | None = None


@dataclass(slots=True)
class Record:
    """One committed generation: the prompt miles fed the engine and what came back."""

    turn_index: int
    prompt_ids: list[int]
    generation: Generation
    # producing turn per token of all_ids; filled lazily by chain_provenance
    provenance: list[int] | None = field(default=None, repr=False, compare=False)
    _all_ids: list[int] | None = field(default=None, repr=False, compare=False)

    @property
    def output_ids(self) -> list[int]:
        return self.generation.output_ids

    @property
    def all_ids(self) -> list[int]:
        """Prompt then output: one shared list (callers must not modify it)."""
        if self._all_ids is None:
            self._all_ids = self.prompt_ids + self.generation.output_ids
        return self._all_ids


@dataclass
class TurnOutcome:
    """What the server did with one request.

    `status`: ok | rejected (400/409) | failed (500). `placement` says where the prompt came
    from: v1 `full_render` / `extend`; v2 `root` / `new_root` / `child` / `sibling`.
    `rolled_back` lists the turns whose generations this request's rollback discarded (v1).
    """

    turn_index: int
    status: str = "ok"
    detail: str = ""
    reason: str = ""  # how a rejected or failed request is counted (`strategies.base.failure_reason`)
    lenient: bool = False  # rendered in the lenient text form where miles' render fails (`lenient_render`)
    prompt_ids: list[int] | None = None
    placement: str = ""
    rolled_back: list[int] = field(default_factory=list)
    dropped_tokens: int = 0


def check_prefix(previous: Sequence[int], all_ids: Sequence[int], max_trim: int) -> None:
    """Commit-time check that the new snapshot extends the old one (all but `max_trim` tokens)."""
    keep = len(previous) - max_trim
    if keep > 0 and (first := common_prefix_len(all_ids, previous)) < keep:
        raise ServerError(
            f"TokenizationError: pretokenized prefix mismatch at token {first} "
            f"(checkpoint has {len(previous)} tokens, new snapshot {len(all_ids)})"
        )


def _serve(outcome: TurnOutcome, action: Callable[[], None]) -> TurnOutcome:
    """Run one request; map the HTTP-shaped exceptions onto the outcome."""
    try:
        action()
    except RequestRejected as exc:
        outcome.status, outcome.detail, outcome.reason = "rejected", str(exc), failure_reason(exc)
    except ServerError as exc:
        outcome.status, outcome.detail, outcome.reason = "failed", str(exc), failure_reason(exc)
    return outcome


# ---------------------------------------------------------------------------------------------
# v1: LinearTrajectory (§2.5)
# ---------------------------------------------------------------------------------------------
MAX_ASSISTANT_ROLLBACK_STEPS = 1
_ROLE_GATE_SUFFIX = "; the selected TITO fixed template does not support appending this role"


@dataclass
class LinearTrajectory:
    """v1 session state: committed messages (stored spellings) and one checkpoint per generation."""

    messages: list[dict] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    checkpoints: list[list[int]] = field(default_factory=list)
    message_ends: list[int] = field(default_factory=list)  # per checkpoint: len(request) + 1

    @property
    def num_assistant(self) -> int:
        return len(self.message_ends)

    @property
    def token_ids(self) -> list[int]:
        return self.checkpoints[-1] if self.checkpoints else []

    def rollback_if_needed(self, request: Sequence[dict], match: Matcher) -> list[Record]:
        """Cut back to the last checkpoint the request still agrees with; return the discarded records.

        Discarding more than MAX_ASSISTANT_ROLLBACK_STEPS generations is a 400 and changes nothing.
        A rollback is applied before every later check and persists even if the request then fails.
        """
        if not self.messages or not self.checkpoints:
            return []
        agreed = common_prefix_messages(self.messages, request, match)
        if agreed >= len(self.messages):
            return []
        keep = max((i for i, end in enumerate(self.message_ends) if end <= agreed), default=-1)
        discard = self.num_assistant - (keep + 1)
        if discard > MAX_ASSISTANT_ROLLBACK_STEPS:
            raise RequestRejected(
                f"rollback failed: discard_count={discard} exceeds max_assistant_rollback_steps="
                f"{MAX_ASSISTANT_ROLLBACK_STEPS} (stored has {len(self.messages)} messages, "
                f"request has {len(request)} messages)"
            )
        dropped = self.records[keep + 1 :]
        self.messages = self.messages[: self.message_ends[keep] if keep >= 0 else 0]
        del self.records[keep + 1 :], self.checkpoints[keep + 1 :], self.message_ends[keep + 1 :]
        return dropped

    def prompt_for(
        self, request: list[dict], tools: list[dict] | None, tito: TitoTokenizer, match: Matcher
    ) -> tuple[list[int], str]:
        """The TITO prompt of a request (after any rollback) and how it was built."""
        if not self.token_ids:
            return tito.full_render(request, tools), "full_render"
        check_append_only(self.messages, request, match, tito.family.allowed_append_roles)
        effective = self.messages + request[len(self.messages) :]  # stored spellings win inside the prefix
        return tito.merge_tokens(self.messages, effective, self.token_ids, tools), "extend"

    def commit(
        self, request: list[dict], prompt_ids: list[int], turn_index: int, generation: Generation, max_trim: int
    ) -> None:
        record = Record(turn_index, prompt_ids, generation)
        check_prefix(self.token_ids, record.all_ids, max_trim)
        self.messages = self.messages + request[len(self.messages) :] + [generation.message]
        self.records.append(record)
        self.checkpoints.append(record.all_ids)
        self.message_ends.append(len(request) + 1)


def check_append_only(
    stored: Sequence[dict], request: Sequence[dict], match: Matcher, allowed_roles: Iterable[str]
) -> None:
    """400 unless `request` extends `stored` under `match` with only allowed roles appended."""
    if len(request) < len(stored):
        raise RequestRejected(
            f"new messages ({len(request)}) are fewer than stored messages ({len(stored)})" + _ROLE_GATE_SUFFIX
        )
    agreed = common_prefix_messages(stored, request, match)
    if agreed < len(stored):
        raise RequestRejected(f"message mismatch at index {agreed}" + _ROLE_GATE_SUFFIX)
    gate_roles(request, len(stored), allowed_roles)


def serve_v1(state: LinearTrajectory, request: SessionRequest, tito: TitoTokenizer, match: Matcher) -> TurnOutcome:
    """One chat request against a v1 session (§2.5.2), with the recorded generation as the engine reply."""
    outcome = TurnOutcome(request.turn_index)

    def run() -> None:
        request_tito = tito.for_request(request.chat_template_kwargs)
        dropped = state.rollback_if_needed(request.messages, match)
        outcome.rolled_back = [r.turn_index for r in dropped]
        outcome.dropped_tokens = sum(len(r.output_ids) for r in dropped)
        outcome.prompt_ids, outcome.placement = state.prompt_for(request.messages, request.tools, request_tito, match)
        state.commit(
            request.messages,
            outcome.prompt_ids,
            request.turn_index,
            request.generation,
            request_tito.family.max_trim_tokens,
        )

    return _serve(outcome, run)


def replay_v1(
    requests: Sequence[SessionRequest], tito: TitoTokenizer, match: Matcher = strict_match
) -> tuple[LinearTrajectory, list[TurnOutcome]]:
    """Serve every request in arrival order; a refused request stores nothing and replay goes on."""
    state, match = LinearTrajectory(), remembered(match)
    return state, [_noting_lenient(serve_v1(state, request, tito, match), tito) for request in requests]


def assemble_v1(
    state: LinearTrajectory, max_trim: int, max_seq_len: int | None = None, reward: float = 0.0
) -> list[Sample]:
    """The samples op of v1: at most one sample (none for `no_records` / `all_truncated`)."""
    if not state.records:
        return []
    merged = assemble_records(state.records, state.token_ids, max_trim, max_seq_len)
    return [] if merged is None else [merged.to_sample(reward)]


# ---------------------------------------------------------------------------------------------
# Sample assembly (§2.6)
# ---------------------------------------------------------------------------------------------
COMPLETED, TRUNCATED, ABORTED, PENDING = "completed", "truncated", "aborted", "pending"


def sample_status(finish_reason: str | None) -> str:
    """Sample status from finish_reason. A dump without one (null) reads as COMPLETED — see docs."""
    if finish_reason in (None, "stop", "tool_calls"):
        return COMPLETED
    return {"length": TRUNCATED, "abort": ABORTED}.get(finish_reason, PENDING)


@dataclass
class TurnSample:
    """A per-turn sample, then the merged one: full tokens, response arrays over the last part."""

    tokens: list[int]
    response_length: int
    loss_mask: list[int]
    logprobs: list[float]
    status: str
    records: list[Record]  # the records whose outputs this sample covers, in order

    def to_sample(self, reward: float = 0.0, metadata: dict | None = None) -> Sample:
        source = chain_provenance(self.records)[: len(self.tokens)]
        return Sample(
            token_ids=list(self.tokens),
            response_length=self.response_length,
            loss_mask=list(self.loss_mask),
            logprobs=list(self.logprobs),
            source_turn=source,
            reward=reward,
            metadata={"status": self.status, **(metadata or {})},
        )


def chain_provenance(records: Sequence[Record]) -> list[int]:
    """Producing turn per token of the last record's snapshot; -1 for anything not generated
    (the record's own list: copy it before changing it).

    Each record's prompt inherits its predecessor's provenance as far as the two agree token for
    token; the rest of the prompt (boundary fix, rendered suffix) is context. Results are cached
    on the records, which is sound because a record always follows the same predecessor (v1's
    chain is linear after rollbacks; a v2 node has one parent).
    """
    start = len(records)
    while start > 0 and records[start - 1].provenance is None:
        start -= 1
    for i in range(start, len(records)):
        record = records[i]
        previous, inherited = (records[i - 1].all_ids, records[i - 1].provenance) if i else ([], [])
        assert inherited is not None, "the records before `start` have provenance, and this loop fills the rest"
        kept = common_prefix_len(previous, record.prompt_ids)
        provenance = inherited[:kept]  # extended in place: `a + b + c` would copy a three times
        provenance += [-1] * (len(record.prompt_ids) - kept)
        provenance += [record.turn_index] * len(record.output_ids)
        record.provenance = provenance
    last = records[-1].provenance if records else []
    assert last is not None, "the loop above filled every record's provenance"
    return last


def compute_turn_samples(records: Sequence[Record], acc: Sequence[int], max_trim: int) -> list[TurnSample]:
    """Align each record's output with the final snapshot `acc`; trim what the snapshot replaced.

    Only a non-last record may lose trailing tokens, at most `max_trim`; the cursor must end at
    len(acc). Violations are the samples op's 422.
    """
    samples, cursor = [], 0
    for i, record in enumerate(records):
        last = i == len(records) - 1
        cursor = len(record.prompt_ids)
        matched = _matched_output(record.output_ids, acc, cursor)
        trim = len(record.output_ids) - matched
        if trim > (0 if last else max_trim):
            raise AssemblyError(
                f"turn {record.turn_index}: {trim} trailing output tokens are not in the "
                f"final token history (allowed {0 if last else max_trim})"
            )
        cursor += matched
        samples.append(per_turn_sample(record, trim, list(records[: i + 1])))
    if cursor != len(acc):
        raise AssemblyError(f"records cover {cursor} tokens but the token history has {len(acc)}")
    return samples


def _matched_output(output: Sequence[int], acc: Sequence[int], start: int) -> int:
    if acc[start : start + len(output)] == output:  # the usual case: all of it, compared at C speed
        return len(output)
    matched = 0
    for token, expected in zip(output, acc[start:]):
        if token != expected:
            break
        matched += 1
    return matched


def per_turn_sample(record: Record, trim: int, records: list[Record]) -> TurnSample:
    kept = len(record.output_ids) - trim
    generation = record.generation
    return TurnSample(
        tokens=record.prompt_ids + generation.output_ids[:kept],
        response_length=kept,
        loss_mask=[1] * kept,
        logprobs=list(generation.logprobs[:kept]),
        status=sample_status(generation.finish_reason),
        records=records,
    )


def truncate_turn_samples(samples: Sequence[TurnSample], max_len: int) -> list[TurnSample]:
    """Keep turns while they fit in `max_len`; cut the first that overflows (TRUNCATED) and stop.

    A turn that would keep no response token is dropped together with every later turn.
    """
    kept = []
    for sample in samples:
        if len(sample.tokens) <= max_len:
            kept.append(sample)
            continue
        over = len(sample.tokens) - max_len
        length = sample.response_length - over
        if length > 0:
            kept.append(
                TurnSample(
                    sample.tokens[:-over],
                    length,
                    sample.loss_mask[:length],
                    sample.logprobs[:length],
                    TRUNCATED,
                    sample.records,
                )
            )
        break
    return kept


def merge_turn_samples(samples: Sequence[TurnSample]) -> TurnSample:
    """Fold per-turn samples into one (`merge_pair` left to right); a non-COMPLETED turn ends the
    trajectory. The masks grow in place: pairwise copies would be quadratic in a long session."""
    merged = samples[0]
    loss_mask, logprobs = list(merged.loss_mask), list(merged.logprobs)
    for sample in samples[1:]:
        if merged.status != COMPLETED:
            break
        between = _observation_length(merged, sample)
        loss_mask += [0] * between
        loss_mask += sample.loss_mask
        logprobs += [0.0] * between
        logprobs += sample.logprobs
        length = merged.response_length + between + sample.response_length
        merged = TurnSample(sample.tokens, length, loss_mask, logprobs, sample.status, sample.records)
    return merged


def merge_pair(a: TurnSample, b: TurnSample) -> TurnSample:
    """b extends a: a's response, the context between them (mask 0, logprob 0.0), b's response."""
    between = _observation_length(a, b)
    return TurnSample(
        tokens=b.tokens,
        response_length=a.response_length + between + b.response_length,
        loss_mask=a.loss_mask + [0] * between + b.loss_mask,
        logprobs=a.logprobs + [0.0] * between + b.logprobs,
        status=b.status,
        records=b.records,
    )


def _observation_length(a: TurnSample, b: TurnSample) -> int:
    """Tokens between a's end and b's response; raises unless b extends a COMPLETED a."""
    between = len(b.tokens) - len(a.tokens) - b.response_length
    if not starts_with(b.tokens, a.tokens):
        raise AssemblyError("merge: the later turn's tokens do not extend the earlier turn's")
    if between <= 0:
        raise AssemblyError(f"merge: observation length {between} must be positive")
    if a.status != COMPLETED:
        raise AssemblyError("merge: the earlier turn is not COMPLETED")
    return between


def assemble_records(
    records: Sequence[Record], acc: Sequence[int], max_trim: int, max_seq_len: int | None = None
) -> TurnSample | None:
    """compute → truncate → merge for one chain of records; None when truncation leaves nothing."""
    samples = compute_turn_samples(records, acc, max_trim)
    if max_seq_len:
        samples = truncate_turn_samples(samples, max_seq_len)
    return merge_turn_samples(samples) if samples else None


# ---------------------------------------------------------------------------------------------
# v2: trajectory forest (§2.7)
# ---------------------------------------------------------------------------------------------
MAX_NODES = 1024


@dataclass(eq=False)
class TrajectoryNode:
    """One generation in the forest: the messages it added and the full root→node snapshot."""

    seq: int
    delta_messages: list[dict]
    token_ids: list[int]
    completion_span: tuple[int, int]
    record: Record
    parent: "TrajectoryNode | None" = None
    children: list["TrajectoryNode"] = field(default_factory=list)

    @property
    def finish_reason(self) -> str:
        return self.record.generation.finish_reason or ""

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    def path_nodes(self) -> list["TrajectoryNode"]:
        path: list[TrajectoryNode] = []
        node: TrajectoryNode | None = self
        while node is not None:
            path.append(node)
            node = node.parent
        return path[::-1]

    def path_messages(self) -> list[dict]:
        return [m for node in self.path_nodes() for m in node.delta_messages]


class SessionTree:
    """Roots and nodes in creation order; `seq` is the creation index and the only ordering key."""

    def __init__(self, max_nodes: int = MAX_NODES):
        self.roots: list[TrajectoryNode] = []
        self.nodes: list[TrajectoryNode] = []
        self.max_nodes = max_nodes
        self.branches = 0  # §4.3 forks: nodes created beside an existing sibling, plus roots − 1

    def leaves(self) -> list[TrajectoryNode]:
        return [node for node in self.nodes if not node.children]

    def create_node(
        self,
        parent: TrajectoryNode | None,
        delta: list[dict],
        token_ids: list[int],
        span: tuple[int, int],
        record: Record,
    ) -> TrajectoryNode:
        if len(self.nodes) >= self.max_nodes:
            raise ValueError(f"session tree is full ({self.max_nodes} nodes)")
        node = TrajectoryNode(len(self.nodes), delta, token_ids, span, record, parent)
        siblings = parent.children if parent is not None else self.roots
        self.branches += bool(siblings)
        siblings.append(node)
        self.nodes.append(node)
        return node


@dataclass(slots=True)
class AttachPoint:
    node: TrajectoryNode | None  # None = a new root
    matched: int  # request messages the node's path consumes
    overlap: int  # deepest partial agreement seen (diagnostics)


def find_attach_point(tree: SessionTree, request: Sequence[dict], match: Matcher) -> AttachPoint:
    """The node whose whole path the request repeats, consuming the most request messages.

    A node whose delta the request only partly repeats is never a candidate, nor is anything
    below it; ties go to the latest node. Pure: the tree is not touched.
    """
    best, best_matched, overlap = None, -1, 0
    stack = [(root, 0) for root in reversed(tree.roots)]
    while stack:
        node, offset = stack.pop()
        agreed = _delta_agreement(node.delta_messages, request, offset, match)
        overlap = max(overlap, offset + agreed)
        if agreed < len(node.delta_messages):
            continue
        matched = offset + agreed
        if matched > best_matched or (matched == best_matched and best is not None and node.seq > best.seq):
            best, best_matched = node, matched
        stack.extend((child, matched) for child in reversed(node.children))
    return AttachPoint(best, best_matched if best is not None else 0, overlap)


def _delta_agreement(delta: Sequence[dict], request: Sequence[dict], offset: int, match: Matcher) -> int:
    agreed = 0
    while agreed < len(delta) and offset + agreed < len(request):
        if not matches(match, delta[agreed], request[offset + agreed]):
            break
        agreed += 1
    return agreed


class SessionForest:
    """v2 session state: the tree plus the active leaf (the view GET and tokenization follow)."""

    def __init__(self, max_nodes: int = MAX_NODES):
        self.tree = SessionTree(max_nodes)
        self.active_leaf: TrajectoryNode | None = None

    def prompt_for(
        self, request: list[dict], tools: list[dict] | None, tito: TitoTokenizer, match: Matcher
    ) -> tuple[list[int], str]:
        attach = find_attach_point(self.tree, request, match)
        node = attach.node
        if node is not None and node.truncated:
            raise TruncatedExtension(f"truncated generation cannot be extended (node {node.seq} stopped on length)")
        self.active_leaf = node  # the view moves before generation, even if a later check fails
        if node is None:
            return tito.full_render(request, tools), "new_root" if self.tree.roots else "root"
        stored = node.path_messages()
        gate_roles(request, len(stored), tito.family.allowed_append_roles)
        ids = tito.merge_tokens(stored, stored + request[len(stored) :], node.token_ids, tools)
        return ids, "sibling" if node.children else "child"

    def commit(
        self, request: list[dict], prompt_ids: list[int], turn_index: int, generation: Generation, max_trim: int
    ) -> TrajectoryNode:
        parent = self.active_leaf
        record = Record(turn_index, prompt_ids, generation)
        all_ids = record.all_ids
        check_prefix(parent.token_ids if parent else [], all_ids, max_trim)
        consumed = len(parent.path_messages()) if parent else 0
        try:
            node = self.tree.create_node(
                parent, request[consumed:] + [generation.message], all_ids, (len(prompt_ids), len(all_ids)), record
            )
        except ValueError as exc:  # upstream: not a SessionError, so a 500
            raise ServerError(str(exc)) from exc
        self.active_leaf = node
        return node


def gate_roles(request: Sequence[dict], stored_count: int, allowed_roles: Iterable[str]) -> None:
    allowed = sorted(allowed_roles)
    for index in range(stored_count, len(request)):
        role = request[index].get("role")
        if role not in allowed:
            raise RequestRejected(
                f"appended message at index {index} has role={role!r}, allowed={allowed}" + _ROLE_GATE_SUFFIX
            )


def serve_v2(state: SessionForest, request: SessionRequest, tito: TitoTokenizer, match: Matcher) -> TurnOutcome:
    """One chat request against a v2 session (§2.7.3) with the recorded generation as the reply."""
    outcome = TurnOutcome(request.turn_index)

    def run() -> None:
        request_tito = tito.for_request(request.chat_template_kwargs)
        outcome.prompt_ids, outcome.placement = state.prompt_for(request.messages, request.tools, request_tito, match)
        state.commit(
            request.messages,
            outcome.prompt_ids,
            request.turn_index,
            request.generation,
            request_tito.family.max_trim_tokens,
        )

    return _serve(outcome, run)


def replay_v2(
    requests: Sequence[SessionRequest], tito: TitoTokenizer, match: Matcher = strict_match, max_nodes: int = MAX_NODES
) -> tuple[SessionForest, list[TurnOutcome]]:
    state, match = SessionForest(max_nodes), remembered(match)
    return state, [_noting_lenient(serve_v2(state, request, tito, match), tito) for request in requests]


def _noting_lenient(outcome: TurnOutcome, tito: TitoTokenizer) -> TurnOutcome:
    outcome.lenient = took_lenient(tito.renderer)
    return outcome


@dataclass
class LeafSample:
    """One leaf's merged sample plus the path it came from (for picking and exactly-once masking)."""

    leaf: TrajectoryNode
    path: list[TrajectoryNode]
    sample: Sample


def collect_v2(tree: SessionTree, max_trim: int, max_seq_len: int | None = None) -> list[LeafSample]:
    """compute → truncate → merge per leaf, in seq order; a leaf truncated to nothing is dropped."""
    material = []
    for leaf in tree.leaves():
        path = leaf.path_nodes()
        merged = assemble_records([n.record for n in path], leaf.token_ids, max_trim, max_seq_len)
        if merged is None:
            continue
        metadata = {
            "leaf": {
                "node_id": leaf.seq,
                "parent": leaf.parent.seq if leaf.parent else None,
                "path_node_ids": [n.seq for n in path],
                "response_id": leaf.record.generation.response_id,
            }
        }
        material.append(LeafSample(leaf, path, merged.to_sample(metadata=metadata)))
    return material


def drop_retries(samples: Sequence[LeafSample]) -> tuple[list[LeafSample], list[LeafSample]]:
    """HEAD's default picker: a leaf with a later sibling was retried and is trimmed.

    Roots and leaves without a later sibling survive (an abandoned deep branch included).
    Survivors come deepest first, then latest first. Returns (kept, trimmed).
    """
    kept: list[LeafSample] = []
    trimmed: list[LeafSample] = []
    for item in samples:
        parent = item.leaf.parent
        later = parent is not None and any(c.seq > item.leaf.seq for c in parent.children)
        (trimmed if later else kept).append(item)
    kept.sort(key=lambda s: (len(s.path), s.leaf.seq), reverse=True)
    return kept, trimmed


def default_postprocess(samples: Sequence[LeafSample], reward: float | None) -> None:
    """Exactly-once masking: each node's completion trains only in the earliest kept leaf holding it.

    Only `loss_mask` is zeroed on a shared span; logprobs stay as they were (upstream). A scalar
    reward, when given, is broadcast to every sample.
    """
    owner: dict[int, int] = {}
    for item in samples:
        for node in item.path:
            owner[node.seq] = min(owner.get(node.seq, item.leaf.seq), item.leaf.seq)
    for item in samples:
        _mask_unowned(item, owner)
        if reward is not None:
            item.sample.reward = reward


def _mask_unowned(item: LeafSample, owner: dict[int, int]) -> None:
    sample = item.sample
    response_start = len(sample.token_ids) - sample.response_length
    for node in item.path:
        if owner[node.seq] == item.leaf.seq:
            continue
        lo, hi = node.completion_span
        a, b = max(lo - response_start, 0), min(hi - response_start, sample.response_length)
        if b > a:
            sample.loss_mask[a:b] = [0] * (b - a)


def samples_v2(
    tree: SessionTree, max_trim: int, max_seq_len: int | None = None, reward: float | None = None
) -> tuple[list[LeafSample], list[LeafSample]]:
    """The v2 samples op with the default hooks: (emitted, trimmed)."""
    kept, trimmed = drop_retries(collect_v2(tree, max_trim, max_seq_len))
    default_postprocess(kept, reward)
    return kept, trimmed


# ---------------------------------------------------------------------------------------------
# From a recorded session to requests, and from outcomes to a ReplayResult
# ---------------------------------------------------------------------------------------------
def session_requests(prepared: Any) -> list[SessionRequest]:
    """One request per recorded turn of a `PreparedSession`: the RAW messages and tools (miles
    normalizes only through its matchers and template preparation) and the recorded generation
    as the engine's reply."""
    return [request_from_turn(p.turn, p.response_message) for p in prepared.turns]


def request_from_turn(turn: Any, parsed_response: dict | None = None) -> SessionRequest:
    logprobs = list(turn.output_logprobs) if turn.output_logprobs is not None else [0.0] * len(turn.output_ids)
    generation = Generation(
        list(turn.output_ids),
        logprobs,
        turn.finish_reason,
        stored_response(turn.response, parsed_response),
        turn.request_id or "",
    )
    return SessionRequest(
        turn.turn_index, list(turn.messages), turn.tools or None, generation, turn.chat_template_kwargs
    )


def stored_response(recorded: dict | None, parsed: dict | None) -> dict:
    """The assistant message miles stores: the response as returned, content "" when None.

    A dump without `response` falls back to the message parsed from the output ids.
    """
    message = copy.deepcopy(recorded if recorded is not None else parsed) or {"role": "assistant"}
    message.setdefault("role", "assistant")
    if message.get("content") is None:
        message["content"] = ""
    return message


def tito_from_context(ctx: Any, family: str | None = None, renderer: Any = None) -> TitoTokenizer:
    """The TITO tokenizer over `renderer` (default: the context's), family from the context's renderer."""
    if ctx.renderer is None:
        raise ReplayError("session strategies need a renderer; pass --tokenizer (and --chat-template)")
    return TitoTokenizer(renderer or ctx.renderer, family_for(ctx.renderer, family))


def _same_ids(recorded: Sequence[int], ids: Sequence[int] | None) -> bool:
    return (recorded if isinstance(recorded, list) else list(recorded)) == ids  # no copy of a list


def prompt_event(outcome: TurnOutcome, differs_from_recording: bool) -> str:
    """How the turn's prompt was obtained (DESIGN §5 vocabulary, plus rejected/failed: none was)."""
    if outcome.rolled_back:
        return "rolled_back"
    if outcome.status != "ok":
        return outcome.status  # "rejected" or "failed": no prompt reached the engine
    if outcome.placement in ("new_root", "sibling"):
        return "new_root" if outcome.placement == "new_root" else "forked"
    return "rendered" if differs_from_recording else "clean"


def record_outcomes(result: Any, outcomes: Sequence[TurnOutcome], recorded: dict[int, Sequence[int] | None]) -> None:
    """Turn events, prompt events, drift positions and the request counters of a replay."""
    for name in ("rejected_requests", "server_errors"):
        result.counters[name] += 0
    drift: int | None = None  # a session's prompts tend to drift at the same position turn after turn
    for outcome in outcomes:
        index = outcome.turn_index
        if outcome.status == "rejected":
            result.turn_events[index] = "rejected"
            result.counters["rejected_requests"] += 1
        elif outcome.status == "failed":
            result.turn_events[index] = "failed"
            result.counters["server_errors"] += 1
        if outcome.status != "ok":
            result.failures[index] = outcome.reason
        if outcome.lenient:
            result.counters["lenient_renders"] += 1
        prompt = recorded.get(index)
        differs = prompt is not None and not _same_ids(prompt, outcome.prompt_ids)
        result.prompt_events[index] = prompt_event(outcome, differs)
        if differs and prompt is not None and outcome.prompt_ids is not None:
            drift = result.drift_positions[index] = common_prefix_len(prompt, outcome.prompt_ids, drift)
