"""What a trainer sample's tokens are, read with the model family's own template and tokenizer.

`TokenMarkers` derives everything the audit needs to know about a family from its renderer, never
from per-family literals: the *turn openers* (the ids after which the model's output starts), the
stop tokens (`families.ModelFamily.stop_tokens`), the empty reasoning block a template writes into
an assistant message that has none, and the tool-call parser (`Renderer.parse_response`, keyed by
the family's `tool_format`).

A turn opener is the generation prompt the template appends after a user message and after a tool
message (a role header, with `<think>` where the template opens reasoning); where the template
appends none (DeepSeek V3 after tool outputs) it is the last token the template wrote (the tool
block's closer). An *assistant region* of a sample runs from the end of an opener to the first
stop token after it, inclusive (to the end of the sample when none follows); an opener inside a
region is the model's own writing (gpt-oss writes `<|start|>assistant` before each message of one
turn) and opens nothing. Every other token (system, user and tool messages, role headers,
separators the template inserts) is context that the trainer must never train. A turn cut off
without a stop token therefore runs on to the next stop token: the context between them is not
checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

# A conversation the probes render; its words matter only in that they appear once.
_ASKED, _ANSWERED, _REASONED = "audit probe question", "audit probe answer", "audit probe reasoning"
_TOOL = {"type": "function", "function": {"name": "probe", "description": "probe", "parameters": {"type": "object"}}}
_CALLED = {"type": "function", "function": {"name": "probe", "arguments": {}}}
_ASKED_CHAT = [{"role": "user", "content": _ASKED}]
_TOOL_CHAT = [
    *_ASKED_CHAT,
    {"role": "assistant", "content": "", "tool_calls": [_CALLED]},
    {"role": "tool", "content": "x"},
]


@dataclass(frozen=True)
class Region:
    """An assistant region: `header` (where its opener starts), `start` (first token after the
    opener), `end` (one past its last token), `stop` (its stop token's position, None when cut off)."""

    header: int
    start: int
    end: int
    stop: int | None


class TokenMarkers:
    """The family facts the audit reads off a renderer (`render.renderer.Renderer`)."""

    def __init__(self, renderer: Any):
        self.renderer = renderer
        self.family = renderer.family
        self.stop_ids = np.array(sorted(set(renderer.stop_token_ids)), dtype=np.int64)
        self.openers = _openers(renderer)
        self.generation_prompt = self.openers[0] if self.openers else np.array([], dtype=np.int64)
        self.empty_reasoning = self._empty_reasoning()

    def _empty_reasoning(self) -> np.ndarray:
        """The ids the template writes between the generation prompt and the content of an
        assistant message without reasoning (Qwen3's `<think>\n\n</think>\n\n`), when they are a
        reasoning block: the same message with reasoning has the reasoning there. Else empty."""
        try:
            prompt_text = self.renderer.decode(self.generation_prompt.tolist())
            bare = self._before_answer(prompt_text, {})
            reasoned = self._before_answer(prompt_text, {"reasoning_content": _REASONED})
        except Exception:  # noqa: BLE001 - a template that cannot render these inserts nothing we can see
            return np.array([], dtype=np.int64)
        if not bare or not bare.strip() or not reasoned or _REASONED not in reasoned:
            return np.array([], dtype=np.int64)
        if _squeeze(reasoned.replace(_REASONED, "")) != _squeeze(bare):
            return np.array([], dtype=np.int64)  # not where reasoning goes: e.g. gpt-oss's channel header
        return np.array(self.renderer.encode(bare), dtype=np.int64)

    def _before_answer(self, prompt_text: str, extra: dict[str, str]) -> str | None:
        """What the template writes between the generation prompt and an assistant answer's content."""
        answered = [*_ASKED_CHAT, {"role": "assistant", "content": _ANSWERED, **extra}]
        text = self.renderer.render_text(answered, add_generation_prompt=False)
        at = text.rfind(prompt_text, 0, text.find(_ANSWERED)) if prompt_text else -1
        return text[at + len(prompt_text) : text.find(_ANSWERED)] if at >= 0 else None

    def regions(self, tokens: np.ndarray) -> list[Region]:
        """Every assistant region of `tokens`, in order."""
        openers = sorted((at, len(opener)) for opener in self.openers for at in find_all(tokens, opener).tolist())
        stops = np.flatnonzero(np.isin(tokens, self.stop_ids))
        out: list[Region] = []
        for header, width in openers:
            if out and header < out[-1].end:
                continue  # inside the previous region: the model wrote it
            start = header + width
            after = stops[np.searchsorted(stops, start) :]
            stop = int(after[0]) if len(after) else None
            out.append(Region(header, start, stop + 1 if stop is not None else len(tokens), stop))
        return out

    def starts_with_empty_reasoning(self, tokens: np.ndarray, region: Region) -> bool:
        n = len(self.empty_reasoning)
        return (
            bool(n)
            and region.end - region.start >= n
            and bool(np.array_equal(tokens[region.start : region.start + n], self.empty_reasoning))
        )

    def parse(self, ids: Sequence[int]) -> tuple[str, list[str], bool]:
        """(first tool called or `text`, every tool called, ill-formed) of a trained span."""
        parsed = self.renderer.parse_response(list(ids))
        names = [call["function"]["name"] for call in parsed.message.get("tool_calls") or []]
        return (names[0] if names else "text"), names, parsed.ill_formed

    def is_stop(self, token: int) -> bool:
        return bool(np.isin(token, self.stop_ids))

    def decode(self, ids: Sequence[int]) -> str:
        return self.renderer.decode(list(ids))


def find_all(tokens: np.ndarray, pattern: np.ndarray) -> np.ndarray:
    """Start positions of non-overlapping occurrences of `pattern` in `tokens`."""
    n = len(pattern)
    candidates = np.flatnonzero(tokens[: len(tokens) - n + 1] == pattern[0])
    found, last_end = [], -1
    for at in candidates.tolist():
        if at >= last_end and np.array_equal(tokens[at : at + n], pattern):
            found.append(at)
            last_end = at + n
    return np.array(found, dtype=np.int64)


def spans(mask: np.ndarray) -> list[tuple[int, int]]:
    """The maximal runs of trained positions, as (start, end) pairs."""
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()))


def _openers(renderer: Any) -> list[np.ndarray]:
    """The ids after which the model writes: the generation prompt after a user message and after
    a tool message, or the last token the template wrote where it appends no prompt."""
    found: list[np.ndarray] = []
    for chat in (_ASKED_CHAT, _TOOL_CHAT):
        try:
            with_prompt = renderer.render(chat, [_TOOL], add_generation_prompt=True)
            without = renderer.render(chat, [_TOOL], add_generation_prompt=False)
        except Exception:  # noqa: BLE001 - a template without tool messages: the user probe decides
            continue
        opener = with_prompt[len(without) :] if with_prompt[: len(without)] == without else []
        opener = opener or without[-1:]
        if opener and not any(list(known) == opener for known in found):
            found.append(np.array(opener, dtype=np.int64))
    return found


def _squeeze(text: str) -> str:
    return "".join(text.split())
