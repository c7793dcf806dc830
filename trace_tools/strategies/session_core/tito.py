"""Token-in-token-out prompts (docs/upstream_session.md#request-preparation-and-the-tito-tokenizer):
request preparation as SGLang and miles do it, the TITO families (`--tito-model`) and the tokenizer
that extends a checkpoint with appended messages."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from trace_tools.errors import ReplayError, UnknownName
from trace_tools.families import TITO_FAMILIES, TitoFamily, tito_family_of
from trace_tools.memo import IdentityMemo
from trace_tools.render.base import RendererLike
from trace_tools.render.upstream import ArgumentFormError, render_failure_reason
from trace_tools.strategies.session_core.errors import (
    RequestRejected,
    ServerError,
)
from trace_tools.strategies.session_core.matchers import (
    common_prefix_messages,
    strict_match,
)

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
# TITO families and tokenizer
# ---------------------------------------------------------------------------------------------
# miles' `--tito-model` table, from the family records: `default` and each family's row.
FAMILIES: dict[str, TitoFamily] = TITO_FAMILIES


def family_for(renderer: Any, name: str | None = None) -> TitoFamily:
    """The explicit family `name`, else the one matching `renderer.family`, else `default`."""
    key = name or tito_family_of(getattr(renderer, "family", None) or "")
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


@dataclass
class _SessionState:
    """What a session's tokenizer shares with those derived for its requests (`for_request`)."""

    # Every request re-sends the history: each message and tool list is prepared once, and
    # keeps one identity for the render caches (entries hold their source, so ids stay unique).
    prepared: IdentityMemo[Any] = field(default_factory=IdentityMemo)
    dummy_refused: bool = False  # the template refused the dummy system alone


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
        self._shared = _SessionState()

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
        derived._boundary_id, derived._shared = self._boundary_id, self._shared
        return derived

    # -- renders ---------------------------------------------------------------------------------
    def full_render(self, messages: Sequence[dict], tools: Sequence[dict] | None) -> list[int]:
        """Prompt ids of a whole request with the generation prompt (first turn, empty state, new root)."""
        return list(self._render(self.renderer.render, messages, tools, True))

    def render_text(self, messages: Sequence[dict], tools: Sequence[dict] | None, add_generation_prompt: bool) -> str:
        return self._render(self.renderer.render_text, messages, tools, add_generation_prompt)

    def _render(self, fn: Callable, messages: Sequence[dict], tools: Sequence[dict] | None, generation: bool) -> Any:
        memo = self._shared.prepared
        prepared = [memo.get(message, _template_message) for message in messages]
        tool_defs = memo.get(tools, sglang_tools) if tools else None
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
        self._keep_dummy_system(base[:1], tools)
        before = self.render_text(base, tools, False)
        after = self.render_text(base + list(new[len(old) :]), tools, True)
        if not after.startswith(before):
            raise ServerError(
                f"rendered suffix diff failed: the {self.family.name} template does not render "
                f"base + appended as an extension of base"
            )
        return self.renderer.encode(after[len(before) :])

    def _keep_dummy_system(self, system: list[dict], tools: Sequence[dict] | None) -> None:
        """Render the dummy system alone, once per session (the renderer keeps it), so that the
        base renders as its extension (a window without the tools) instead of in full with every
        tool definition. Only a shortcut: a template that refuses the system alone (Llama 3.1
        puts the tools in the first user message, Qwen 3.5 wants a user query) leaves the base to
        render in full, as before, and is not asked again."""
        if self._shared.dummy_refused:
            return
        try:
            self.render_text(system, tools, False)
        except Exception:  # noqa: BLE001 - whatever it raised, the base's own render decides
            self._shared.dummy_refused = True

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
        token that opens the next message (GLM); identity otherwise. A new list."""
        return self.fix_boundary_in_place(list(ids))

    def fix_boundary_in_place(self, ids: list[int]) -> list[int]:
        """`fix_boundary` on a list of the caller's own, changed in place and returned."""
        boundary = self._boundary()
        if boundary is not None and ids and ids[-1] == boundary:
            ids += self.renderer.encode("\n")
        elif ids and ids[-1] in self._dropped():
            del ids[-1]
        return ids

    def _boundary(self) -> int | None:
        if self._boundary_id is False:
            token = self.family.boundary_token
            ids = self.renderer.encode(token) if token else []
            self._boundary_id = ids[0] if len(ids) == 1 else None
        return self._boundary_id

    def _dropped(self) -> set[int]:
        ids = (self.renderer.encode(token) for token in self.family.dropped_boundaries)
        return {token_ids[0] for token_ids in ids if len(token_ids) == 1}
