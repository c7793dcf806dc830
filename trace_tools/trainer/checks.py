"""The checks every reader applies to one sample before it becomes a `TrainerSample`.

A sample that fails one is *refused* (`Refused`, a reason from `SAMPLE_REASONS` and a one-line
detail) and counted in the read's quarantine (`trace_tools.trainer.read.ReadReport`); the read
goes on. Values may be Python lists or tensors (a `.pt` dump stores either): a tensor is turned
into a list here, once, so no reader needs torch for anything but loading.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trace_tools.trainer.records import TrainerSample

SAMPLE_REASONS = (
    "bad_json",  # a JSON line that does not parse
    "missing_field",  # a field the source requires is absent or null
    "wrong_type",  # a field of the wrong type (strings where token ids belong, a non-integer length)
    "length_mismatch",  # response_length outside the tokens, or a loss mask of another length
    "bad_mask",  # a loss-mask value other than 0/1
    "logprobs_length",  # rollout or trainer logprobs of another length than the response
    "bad_logprob",  # a NaN, infinite or positive logprob
    "out_of_vocab",  # a token id outside the tokenizer's vocabulary (or the int32 range without one)
    "train_mismatch",  # the train-side record of a sample holds other tokens than its rollout record
)

# A logprob may exceed 0 by float rounding (log-softmax of a near-certain token); more is a fault.
LOGPROB_SLACK = 1e-4
INT32_BOUND = 2**31


class Refused(Exception):
    """A sample that cannot become a `TrainerSample`; `reason` is one of SAMPLE_REASONS."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def plain(value: Any) -> Any:
    """A tensor or numpy array as a nested list; anything else unchanged."""
    tolist = getattr(value, "tolist", None)
    return tolist() if callable(tolist) and not isinstance(value, (str, bytes)) else value


def required(record: dict, name: str) -> Any:
    value = record.get(name)
    if value is None:
        raise Refused("missing_field", f"{name} is missing")
    return value


def integer(value: Any, label: str) -> int:
    value = plain(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise Refused("wrong_type", f"{label} is {_shown(value)}, expected an integer")
    return value


def token_ids(value: Any, label: str, vocab_size: int | None) -> list[int]:
    """Token ids: integers in [0, vocab_size) (the int32 range when no vocabulary is known)."""
    ids = _flat_list(value, label, "token ids")
    if not all(type(item) is int for item in ids):  # bool is a subclass of int, so `type(...) is int`
        position, item = next((i, x) for i, x in enumerate(ids) if type(x) is not int)
        raise Refused("wrong_type", f"{label}[{position}] is {_shown(item)}, not a token id")
    bound = vocab_size if vocab_size is not None else INT32_BOUND
    if ids and (min(ids) < 0 or max(ids) >= bound):
        position, item = next((i, x) for i, x in enumerate(ids) if not 0 <= x < bound)
        limit = f"vocabulary size {vocab_size}" if vocab_size is not None else "int32 range"
        raise Refused("out_of_vocab", f"{label}[{position}] = {item} is outside [0, {bound}) ({limit})")
    return ids


def loss_mask(value: Any, label: str, response_length: int) -> list[int]:
    """One 0/1 per response token (booleans, as prime-rl writes them, count as 0/1)."""
    mask = [int(item) if isinstance(item, bool) else item for item in _flat_list(value, label, "0/1 values")]
    if len(mask) != response_length:
        raise Refused("length_mismatch", f"{label} has {len(mask)} values for response_length {response_length}")
    if not all(type(item) is int and (item == 0 or item == 1) for item in mask):
        position, item = next((i, x) for i, x in enumerate(mask) if type(x) is not int or x not in (0, 1))
        raise Refused("bad_mask", f"{label}[{position}] is {_shown(item)}, not 0 or 1")
    return mask


def logprobs(value: Any, label: str, response_length: int) -> list[float]:
    """Logprobs, finite and <= 0 (within LOGPROB_SLACK), one per response token; a null is a NaN."""
    values = _flat_list(value, label, "numbers")
    if len(values) != response_length:
        raise Refused("logprobs_length", f"{label} has {len(values)} values for response_length {response_length}")
    # The common case in one pass (a NaN fails both comparisons); the loop below names the fault.
    if all(type(item) is float and -math.inf < item <= LOGPROB_SLACK for item in values):
        return values
    for position, item in enumerate(values):
        if item is None:
            raise Refused("bad_logprob", f"{label}[{position}] is null (a non-finite logprob the writer dropped)")
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            raise Refused("wrong_type", f"{label}[{position}] is {_shown(item)}, not a number")
        if not math.isfinite(item) or item > LOGPROB_SLACK:
            raise Refused("bad_logprob", f"{label}[{position}] = {item} is not a finite logprob <= 0")
    return [float(item) for item in values]


def response_length(value: Any, tokens: list[int]) -> int:
    length = integer(value, "response_length")
    if not 0 <= length <= len(tokens):
        raise Refused("length_mismatch", f"response_length {length} is outside the sample's {len(tokens)} tokens")
    return length


def _flat_list(value: Any, label: str, what: str) -> list:
    value = plain(value)
    if not isinstance(value, list):
        raise Refused("wrong_type", f"{label} is {_shown(value)}, expected a list of {what}")
    if value and isinstance(value[0], list):
        raise Refused("wrong_type", f"{label} is nested (a list of lists), expected a flat list of {what}")
    return value


def _shown(value: Any) -> str:
    return f"{reprlib.repr(value)} ({type(value).__name__})"


def checked_sample(
    source: str,
    *,
    tokens: Any,
    response_len: Any,
    mask: Any,
    vocab_size: int | None,
    rollout_logprobs: Any = None,
    trainer_logprobs: Any = None,
    **fields: Any,
) -> TrainerSample:
    """A TrainerSample from raw values, every check applied; a null `mask` trains the whole response
    (slime's default for a sample whose generator set no mask)."""
    ids = token_ids(tokens, "tokens", vocab_size)
    length = response_length(response_len, ids)
    return TrainerSample(
        source=source,
        tokens=ids,
        response_length=length,
        loss_mask=[1] * length if mask is None else loss_mask(mask, "loss_mask", length),
        rollout_logprobs=None if rollout_logprobs is None else logprobs(rollout_logprobs, "rollout logprobs", length),
        trainer_logprobs=None if trainer_logprobs is None else logprobs(trainer_logprobs, "trainer logprobs", length),
        **fields,
    )


# -- what a reader yields besides samples ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Quarantined:
    """A sample a reader refused: where it was, the reason (SAMPLE_REASONS) and a one-line detail."""

    source: str
    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class Note:
    """Something about the files, not one sample, worth a line (a train file with no rollout file)."""

    text: str


@dataclass(frozen=True, slots=True)
class ReadOptions:
    vocab_size: int | None = None
    max_pickle_bytes: int = 128 * 2**20


Item = TrainerSample | Quarantined | Note


def attempt(source: str, build: Callable[[], TrainerSample]) -> TrainerSample | Quarantined:
    """`build()`'s sample, or the quarantine entry saying why it was refused."""
    try:
        return build()
    except Refused as refused:
        return Quarantined(source, refused.reason, refused.detail)
