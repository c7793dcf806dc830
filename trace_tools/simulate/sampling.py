"""The token side of a generation: output ids, non-canonical splits, truncation, logprobs.

A model does not tokenize its output; it samples ids one at a time, and nothing stops it from
sampling two tokens whose text the tokenizer would have merged into one (Qwen's tokenizer
encodes "\\n\\n" as one token, 271 in Qwen3, but "\\n","\\n" (198, 198) decodes to the same
text). Such an output parses to the same message, yet re-tokenizing the re-rendered history gives
different ids: the tokenizer-boundary drift cause. `split_merged_tokens` produces it on purpose.
"""

from __future__ import annotations

import random
from typing import Any

DOUBLE_NEWLINE = "\n\n"


def split_merged_tokens(tokenizer: Any, ids: list[int], rng: random.Random, count: int) -> tuple[list[int], list[int]]:
    """`ids` with up to `count` tokens replaced by two tokens of the same text; also the positions split.

    Prefers "\\n\\n" tokens (the common case in practice), then any other token whose text
    splits into two vocabulary entries. Added/special tokens are never split.
    """
    special = set(tokenizer.backend.get_added_tokens_decoder())
    options = [i for i, t in enumerate(ids) if t not in special and _is_double_newline(tokenizer, t)]
    if len(options) < count:
        options += [i for i, t in enumerate(ids) if t not in special and i not in options and _split(tokenizer, t)]
    chosen = sorted(rng.sample(options, min(count, len(options))))
    out: list[int] = []
    positions: list[int] = []
    for i, token in enumerate(ids):
        if chosen and i == chosen[0]:
            chosen.pop(0)
            positions.append(len(out))
            out.extend(_split(tokenizer, token))
        else:
            out.append(token)
    return out, positions


def _is_double_newline(tokenizer: Any, token: int) -> bool:
    return tokenizer.decode([token]) == DOUBLE_NEWLINE


def _split(tokenizer: Any, token: int) -> list[int]:
    """Two ids whose byte-level pieces concatenate to `token`'s, or [] when there are none."""
    piece = tokenizer.id_to_token(token) or ""
    for cut in range(1, len(piece)):
        left, right = tokenizer.token_to_id(piece[:cut]), tokenizer.token_to_id(piece[cut:])
        if left is not None and right is not None:
            return [left, right]
    return []


def truncation_point(
    tokenizer: Any, ids: list[int], rng: random.Random, call_opener: str | None = "<tool_call>"
) -> int:
    """Where an output-token limit cuts `ids`: inside the first tool call (after `call_opener`) when there is one."""
    opener = tokenizer.token_to_id(call_opener) if call_opener else None
    start = ids.index(opener) + 1 if opener is not None and opener in ids else len(ids) // 3
    end = len(ids) - 1  # the stop token always falls beyond the limit
    return min(max(start + 1, start + int((end - start) * rng.uniform(0.3, 0.7))), end)


def logprobs(rng: random.Random, ids: list[int], special: set[int], unlikely: set[int]) -> list[float]:
    """Seeded sampling logprobs with the shape real ones have.

    Most tokens are near-certain, a minority carry real entropy (word choice in prose, names in
    code), a few are long shots. Special tokens are near 0; the first piece of a non-canonical
    split (`unlikely`) is a long shot, since a model rarely prefers the unmerged form.
    """
    out = []
    for position, token in enumerate(ids):
        if token in special:
            value = -rng.expovariate(1 / 2e-5)
        elif position in unlikely:
            value = -rng.uniform(2.0, 7.0)
        else:
            draw = rng.random()
            scale = 0.004 if draw < 0.62 else 0.18 if draw < 0.92 else 1.7
            value = -rng.expovariate(1 / scale)
        out.append(max(value, -30.0))
    return out
