"""What a trainer sample's tokens are, read with the model family's own template and tokenizer.

`TokenMarkers` derives everything the audit needs to know about a family from its renderer, never
from per-family literals: the generation prompt (the ids the template appends before an assistant
turn, e.g. a role header), the stop tokens (`families.ModelFamily.stop_tokens`), the empty
reasoning block a template writes into an assistant message that has none, and the tool-call
parser (`Renderer.parse_response`, keyed by the family's `tool_format`).

An *assistant region* of a sample is what follows one occurrence of the generation prompt, up to
and including the first stop token after it (to the end of the sample when none follows). Every
other token (system, user and tool messages, role headers, separators the template inserts) is
context that the trainer must never train.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

# A conversation the probes render; its words matter only in that they appear once.
_ASKED, _ANSWERED = "audit probe question", "audit probe answer"


@dataclass(frozen=True)
class Region:
    """An assistant region: `start` (first token after the generation prompt), `end` (one past its
    last token), `stop` (the position of its stop token, or None when it was cut off)."""

    header: int  # the position of the generation prompt's first token
    start: int
    end: int
    stop: int | None


class TokenMarkers:
    """The family facts the audit reads off a renderer (`render.renderer.Renderer`)."""

    def __init__(self, renderer: Any):
        self.renderer = renderer
        self.family = renderer.family
        self.stop_ids = np.array(sorted(set(renderer.stop_token_ids)), dtype=np.int64)
        asked = [{"role": "user", "content": _ASKED}]
        with_prompt = renderer.render(asked, add_generation_prompt=True)
        without = renderer.render(asked, add_generation_prompt=False)
        self.generation_prompt = np.array(with_prompt[len(without) :], dtype=np.int64)
        self.empty_reasoning = self._empty_reasoning(asked)

    def _empty_reasoning(self, asked: list[dict]) -> np.ndarray:
        """The ids the template writes between the generation prompt and the content of an
        assistant message without reasoning (Qwen3's `<think>\\n\\n</think>\\n\\n`), empty when it
        writes nothing there."""
        answered = [*asked, {"role": "assistant", "content": _ANSWERED}]
        try:
            text = self.renderer.render_text(answered, add_generation_prompt=False)
            prompt_text = self.renderer.decode(self.generation_prompt.tolist())
        except Exception:  # noqa: BLE001 - a template that cannot render it inserts nothing we can see
            return np.array([], dtype=np.int64)
        at = text.rfind(prompt_text)
        content = text.find(_ANSWERED, at)
        if at < 0 or content < 0:
            return np.array([], dtype=np.int64)
        inserted = text[at + len(prompt_text) : content]
        return np.array(self.renderer.encode(inserted) if inserted.strip() else [], dtype=np.int64)

    def regions(self, tokens: np.ndarray) -> list[Region]:
        """Every assistant region of `tokens`, in order."""
        prompt = self.generation_prompt
        if not len(prompt) or len(tokens) < len(prompt):
            return []
        starts = find_all(tokens, prompt)
        is_stop = np.isin(tokens, self.stop_ids)
        stops = np.flatnonzero(is_stop)
        out = []
        for i, header in enumerate(starts):
            start = int(header + len(prompt))
            limit = int(starts[i + 1]) if i + 1 < len(starts) else len(tokens)
            after = stops[np.searchsorted(stops, start) :]
            stop = int(after[0]) if len(after) and after[0] < limit else None
            out.append(Region(int(header), start, stop + 1 if stop is not None else limit, stop))
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


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n
