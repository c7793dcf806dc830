"""The chains codec (docs/upstream_chains.md#codec): a new chain's full render, and the ids of messages appended after a
generation, rendered behind an anchor and cut at the template's separator."""

from __future__ import annotations

from typing import Sequence

from trace_tools.errors import ReplayError
from trace_tools.render.base import RendererLike
from trace_tools.render.upstream import render_failure_reason
from trace_tools.strategies.chains_core.errors import ChainsSetupError, ServerError

_ANCHOR = ({"role": "user", "content": ""},)


class ChainCodec:
    """Token encoding the way uni-agent's MessageCodec does it, over any RendererLike.

    `generation_prompt` and `turn_separator` are probed once from the template at construction.
    `eos_token_ids` defaults to the renderer's `stop_token_ids` (or `eos_token_id`).
    """

    def __init__(
        self, renderer: RendererLike, template_kwargs: dict | None = None, eos_token_ids: Sequence[int] | None = None
    ):
        self.renderer = renderer
        self.template_kwargs = dict(template_kwargs or {})
        self.eos_token_ids = frozenset(eos_token_ids if eos_token_ids is not None else _renderer_eos_ids(renderer))
        self.generation_prompt = self._probe_generation_prompt()
        self.turn_separator = self._probe_turn_separator()
        self.separator_text = renderer.decode(self.turn_separator) if self.turn_separator else ""

    def render_text(
        self, messages: Sequence[dict], tools: Sequence[dict] | None = None, add_generation_prompt: bool = True
    ) -> str:
        """Render text; if the template refuses (e.g. no user message), render behind an empty user.

        The fallback mirrors verl's `apply_chat_template`: the empty user's own rendering is cut off
        again, so the result covers `messages` only.
        """
        try:
            return self._render(messages, tools, add_generation_prompt)
        except Exception as first_error:
            try:
                anchored = self._render([*_ANCHOR, *messages], tools, add_generation_prompt)
                anchor = self._render(list(_ANCHOR), tools, False)
            except Exception:
                raise first_error from None
            if not anchored.startswith(anchor):
                raise first_error
            return anchored[len(anchor) :]

    def encode_full(self, messages: Sequence[dict], tools: Sequence[dict] | None) -> list[int]:
        """A new chain's prompt: the whole request rendered with the generation prompt.

        A template that refuses the request even behind the empty user fails it (HTTP 500)."""
        try:
            text = self.render_text(messages, tools, True)
        except ReplayError as exc:
            raise _render_failure("the chat template cannot render the request", exc) from exc
        return self.renderer.encode(text)

    def encode_incremental(self, messages: Sequence[dict]) -> list[int]:
        """Ids of `messages` appended after a generated assistant: separator + messages + GP.

        Rendered behind an anchored empty user whose own rendering (minus its trailing separator)
        must be a text prefix of the result; tools are not passed, as upstream.
        """
        if not messages:
            return []
        if any(m.get("role") == "assistant" for m in messages[1:]):
            raise ServerError("An incremental assistant message may only appear first")
        anchor_text = self.render_text(list(_ANCHOR), None, False)
        try:
            full_text = self.render_text([*_ANCHOR, *messages], None, True)
        except ReplayError as exc:  # e.g. gpt-oss refuses a tool message with no call before it: a 500 upstream
            raise _render_failure(
                "the chat template cannot render the appended messages behind the anchor", exc
            ) from exc
        if not anchor_text.endswith(self.separator_text):
            raise ServerError("The turn separator is not a suffix of the rendered anchor message")
        prefix = anchor_text[: len(anchor_text) - len(self.separator_text)]
        if not full_text.startswith(prefix):
            raise ServerError("Incremental chat template is not prefix-stable")
        return self.renderer.encode(full_text[len(prefix) :])

    def _render(self, messages: Sequence[dict], tools: Sequence[dict] | None, generation: bool) -> str:
        return self.renderer.render_text(list(messages), tools, generation, **self.template_kwargs)

    def _probe_generation_prompt(self) -> list[int]:
        without = self.renderer.encode(self.render_text(list(_ANCHOR), None, False))
        with_gp = self.renderer.encode(self.render_text(list(_ANCHOR), None, True))
        if with_gp[: len(without)] != without:
            raise ChainsSetupError(
                "the chat template's generation prompt is not a stable token suffix; "
                "the chains strategy needs a template whose prompt only appends it"
            )
        return with_gp[len(without) :]

    def _probe_turn_separator(self) -> list[int]:
        """verl's `initialize_turn_separator`: the common tail of two user turns after the last EOS."""
        for empty, filled in (("", "x"), ([{"type": "text", "text": ""}], [{"type": "text", "text": "x"}])):
            try:
                a = self.renderer.encode(self._render([{"role": "user", "content": empty}], None, False))
                b = self.renderer.encode(self._render([{"role": "user", "content": filled}], None, False))
            except Exception:
                continue
            return _separator_from_suffix(_common_suffix(a, b), self.eos_token_ids)
        return []


def _render_failure(what: str, exc: BaseException) -> ServerError:
    """The 500 of a render that raised (`render_failure_reason` says how it is counted)."""
    return ServerError(f"{what}: {exc}", render_failure_reason(what, exc))


def _renderer_eos_ids(renderer: RendererLike) -> list[int]:
    stops = getattr(renderer, "stop_token_ids", None)
    if stops:
        return list(stops)
    eos = getattr(renderer, "eos_token_id", None)
    return [eos] if eos is not None else []


def _common_suffix(a: list[int], b: list[int]) -> list[int]:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return a[len(a) - n :]


def _separator_from_suffix(suffix: list[int], eos_ids: frozenset[int]) -> list[int]:
    eos_positions = [i for i, token in enumerate(suffix) if token in eos_ids]
    if eos_positions:
        return suffix[eos_positions[-1] + 1 :]
    return suffix[1:]
