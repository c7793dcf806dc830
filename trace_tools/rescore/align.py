"""Trainer logprobs from a trainer's own files, aligned to a run's samples by token identity.

A trainer sample (`trace_tools.trainer.read_samples`: slime / miles `train_data/*.pt`, prime-rl
token exports, ...) aligns to every run sample whose token ids equal its own, position by position:
the trainer's logprob of a token depends only on the sequence before it, so one trainer sample
serves every strategy that emitted the same sequence. Its logprobs cover its own response region
(the last `response_length` tokens); they are placed by absolute position into each run sample's
response region, NaN where the trainer's region does not reach (counted as `not_compared`).

A trainer sample that aligns to nothing is counted by reason (`REASONS`), with its first examples.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trace_tools.trainer.records import TrainerSample

NO_TRAINER_LOGPROBS = "no_trainer_logprobs"  # the sample carries none (a rollout file without train data)
LENGTH_MISMATCH = "length_mismatch"  # its tokens are a prefix of a run sample's, or the other way round
NO_SAMPLE = "no_sample_with_these_tokens"  # no run sample has these token ids
AMBIGUOUS = "ambiguous"  # several trainer samples have these token ids, with different logprobs
REASONS = (NO_TRAINER_LOGPROBS, LENGTH_MISMATCH, NO_SAMPLE, AMBIGUOUS)
SAME_LOGPROBS = 1e-6  # duplicates (a GRPO group's identical samples) agreeing this closely are one
MAX_EXAMPLES = 10


@dataclass
class Alignment:
    """Per row of the run's samples, the trainer's logprobs over its response region (NaN where
    none aligned), and the accounting."""

    logprobs: list[np.ndarray]
    trainer_samples: int = 0
    aligned: int = 0  # trainer samples aligned to at least one run sample
    by_reason: dict[str, int] = field(default_factory=dict)
    examples: list[dict[str, str]] = field(default_factory=list)
    read: dict[str, Any] = field(default_factory=dict)  # the reader's ReadReport (refused samples, notes)

    def as_dict(self) -> dict[str, Any]:
        covered = sum(bool(np.isfinite(v).any()) for v in self.logprobs)
        return {
            "trainer_samples": self.trainer_samples,
            "aligned": self.aligned,
            "not_aligned": self.trainer_samples - self.aligned,
            "by_reason": dict(self.by_reason),
            "examples": self.examples,
            "run_samples": len(self.logprobs),
            "run_samples_with_trainer_logprobs": covered,
            "read": self.read,
        }

    def refuse(self, sample: TrainerSample, reason: str, detail: str) -> None:
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append({"source": sample.source, "reason": reason, "detail": detail})


def align(samples: pd.DataFrame, trainer_samples: Iterable[TrainerSample]) -> Alignment:
    """Align `trainer_samples` to the rows of `samples` (`load_samples`' columns) by token identity."""
    rows_of: dict[tuple[int, ...], list[int]] = {}
    for row, ids in enumerate(samples["token_ids"]):
        rows_of.setdefault(tuple(int(i) for i in ids), []).append(row)
    ordered = sorted(rows_of)  # for the nearest run sample of a trainer sample that aligns to none
    result = Alignment([np.full(int(n), np.nan) for n in samples["response_length"]])
    matched: dict[tuple[int, ...], list[TrainerSample]] = {}
    for sample in trainer_samples:
        result.trainer_samples += 1
        key = tuple(sample.tokens)
        if sample.trainer_logprobs is None:
            result.refuse(sample, NO_TRAINER_LOGPROBS, "the sample carries no trainer logprobs; pass train data")
        elif key in rows_of:
            matched.setdefault(key, []).append(sample)
        else:
            result.refuse(sample, *_nearest(key, ordered))
    for key, found in matched.items():
        if not all(_same(found[0], other) for other in found[1:]):
            for sample in found:  # which of them trained the run's sample cannot be told
                result.refuse(sample, AMBIGUOUS, f"{len(found)} trainer samples have these tokens, with other logprobs")
            continue
        result.aligned += len(found)  # duplicates (the same sequence trained twice) agree: any one will do
        for row in rows_of[key]:
            result.logprobs[row] = _placed(found[0], int(samples.at[row, "response_length"]))
    return result


def _same(a: TrainerSample, b: TrainerSample) -> bool:
    return a.response_length == b.response_length and bool(
        np.allclose(a.trainer_logprobs or [], b.trainer_logprobs or [], rtol=0, atol=SAME_LOGPROBS)
    )


def _placed(sample: TrainerSample, response_length: int) -> np.ndarray:
    """The trainer's logprobs at the run sample's response positions (same tokens, so same positions)."""
    values = np.asarray(sample.trainer_logprobs, dtype=np.float64)
    out = np.full(response_length, np.nan)
    shift = sample.response_length - response_length  # trainer index of the run's response position 0
    begin, end = max(0, -shift), min(response_length, sample.response_length - shift)
    out[begin:end] = values[begin + shift : end + shift]
    return out


def _nearest(key: tuple[int, ...], ordered: list[tuple[int, ...]]) -> tuple[str, str]:
    """Why no run sample has `key`'s tokens: one is a prefix of the other (a truncated or extended
    sequence), else where the nearest run sample (its sorted neighbour) first differs."""
    at = bisect.bisect_left(ordered, key)
    best, common = None, -1
    for neighbour in ordered[max(0, at - 1) : at + 1]:
        shared = _common_prefix(key, neighbour)
        if shared > common:
            best, common = neighbour, shared
    if best is not None and common == min(len(key), len(best)):
        return LENGTH_MISMATCH, f"{len(key)} tokens, a run sample has {len(best)} with the same start"
    if best is None:
        return NO_SAMPLE, "the run has no samples"
    return NO_SAMPLE, f"the nearest run sample first differs at token {common} of {len(key)}"


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    left, right = np.asarray(a[:n]), np.asarray(b[:n])
    differ = np.flatnonzero(left != right)
    return int(differ[0]) if differ.size else n


def read_and_align(samples: pd.DataFrame, paths: Sequence[str | os.PathLike], fmt: str | None = None) -> Alignment:
    """Read a trainer dump (`trace_tools.trainer.read_samples`) and align it to `samples`."""
    from trace_tools.trainer.read import ReadReport, read_samples

    report = ReadReport()
    result = align(samples, read_samples([Path(p) for p in paths], fmt=fmt, report=report))
    result.read = report.to_dict()
    return result
