"""The samples op (docs/upstream_session.md#the-samples-op): per-turn samples aligned with the final
snapshot, truncated, merged into one sample per chain of records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from trace_tools.data import Sample
from trace_tools.ids import common_prefix_len, starts_with
from trace_tools.strategies.session_core.errors import (
    AssemblyError,
)
from trace_tools.strategies.session_core.records import (
    Record,
)

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
