"""Turn one strategy's ReplayResult into the rows of docs/run_directory.md#what-the-files-hold: per
turn, per session, per sample."""

from __future__ import annotations

import json
from collections import Counter
from itertools import compress
from typing import Any

from trace_tools.data import COUNTERS, ReplayResult, Sample, Session, behaviour_label
from trace_tools.errors import ReplayError


class TrainedTwice(ReplayError):
    """A strategy's samples give one generated token loss 1 more than once (docs/metrics.md#invariants)."""


def trained_by_turn(result: ReplayResult) -> Counter:
    """Loss-1 tokens per producing turn, counted by provenance over every emitted sample."""
    return _summed(_trained_per_sample(result))


def _trained_per_sample(result: ReplayResult) -> list[Counter]:
    """Each sample's loss-1 tokens per producing turn (C-level counting: samples run to 50k tokens)."""
    return [Counter(compress(*_trained_region(sample))) for sample in result.samples]


def _summed(by_sample: list[Counter]) -> Counter:
    """Per-sample counts of trained tokens by producing turn, added up; context (-1) left out."""
    trained: Counter = Counter()
    for counts in by_sample:
        trained.update(counts)
    for source in [source for source in trained if source < 0]:
        del trained[source]
    return trained


def check_trained_once(session: Session, result: ReplayResult) -> Counter:
    """Raise `TrainedTwice` unless every generated token carries loss 1 in at most one sample;
    return the counts it checked, `trained_by_turn(result)`, so the rows need not count again.

    The per-turn metrics count trained tokens by provenance, so they rely on this (docs/metrics.md#invariants).
    Samples name only a token's producing turn, not its position in that turn's output, so a
    turn is checked by counts: it trains no more tokens than it generated, and, when more than one
    sample trains it, no token id more often than the turn generated that id. That is exact for
    an id the turn generated once, and never faults a strategy that trains each output position
    at most once."""
    outputs = {turn.turn_index: turn.output_ids for turn in session.turns}
    by_sample = _trained_per_sample(result)
    shared = {source for source, n in Counter(s for c in by_sample for s in c).items() if n > 1 and source in outputs}
    if shared:
        _check_shared_turns(result, outputs, shared)
    trained = _summed(by_sample)
    for source, count in trained.items():
        if source in outputs and count > len(outputs[source]):
            raise TrainedTwice(
                f"turn {source} has {count} tokens with loss 1 in samples {_samples_training(result, source)} "
                f"but generated {len(outputs[source])}; a generated token may be trained in one sample only"
            )
    return trained


def _trained_region(sample: Sample) -> tuple[list[int], list[int]]:
    """(producing turn per response token, loss mask) of a sample."""
    return sample.source_turn[len(sample.token_ids) - sample.response_length :], sample.loss_mask


def _check_shared_turns(result: ReplayResult, outputs: dict[int, list[int]], shared: set[int]) -> None:
    """Turns that several samples train: per token id, no more trainings than the turn generated it."""
    trained: Counter = Counter()
    for sample in result.samples:
        sources, mask = _trained_region(sample)
        ids = sample.token_ids[len(sample.token_ids) - sample.response_length :]
        trained.update(pair for pair in zip(compress(sources, mask), compress(ids, mask)) if pair[0] in shared)
    generated = {source: Counter(outputs[source]) for source in shared}
    for (source, token), times in trained.items():
        occurs = generated[source][token]
        if times > occurs > 0:
            raise TrainedTwice(
                f"turn {source}'s token {token} carries loss 1 {times} times in samples "
                f"{_samples_training(result, source, token)} but the turn generated it {occurs} time(s); "
                "a generated token may be trained in one sample only"
            )


def _samples_training(result: ReplayResult, source: int, token: int | None = None) -> list[int]:
    """Indices of the samples that train a token of turn `source` (that token id, when given)."""
    found = []
    for index, sample in enumerate(result.samples):
        start = len(sample.token_ids) - sample.response_length
        pairs = zip(sample.source_turn[start:], sample.token_ids[start:], sample.loss_mask)
        if any(turn == source and mask and token in (None, tid) for turn, tid, mask in pairs):
            found.append(index)
    return found


def turn_event(generated: int, trained: int, strategy_event: str | None) -> str:
    if generated and trained >= generated:
        return "trained"
    if trained > 0:
        return "partly_trained"
    return strategy_event or "untrained"


def turn_rows(
    strategy: str,
    session: Session,
    result: ReplayResult,
    tool_names: dict[int, list[str]],
    prompt_lengths: dict[int, int],
    trained: Counter | None = None,
) -> list[dict[str, Any]]:
    """One row per turn; `trained` is `trained_by_turn(result)` when the caller has it already."""
    trained = trained_by_turn(result) if trained is None else trained
    behaviour = behaviour_label(_ground_truth(session.turns[0].metadata, "behaviours") if session.turns else None)
    step = session.step
    rows = []
    for turn in session.turns:
        names = tool_names.get(turn.turn_index, [])
        generated = len(turn.output_ids)
        rows.append(
            {
                "strategy": strategy,
                "session_id": session.session_id,
                "turn_index": turn.turn_index,
                "tool": names[0] if names else "text",
                "tool_names": names,
                "generated_tokens": generated,
                "trained_tokens": trained.get(turn.turn_index, 0),
                "event": turn_event(
                    generated, trained.get(turn.turn_index, 0), result.turn_events.get(turn.turn_index)
                ),
                "prompt_event": result.prompt_events.get(turn.turn_index, "clean"),
                "drift_position": result.drift_positions.get(turn.turn_index),
                "failure": result.failures.get(turn.turn_index),
                "prompt_tokens": prompt_lengths.get(turn.turn_index),
                "genuine": _ground_truth(turn.metadata, "genuine"),
                "behaviour": behaviour,
                "step": step,
            }
        )
    return rows


def session_row(
    strategy: str, session: Session, result: ReplayResult, elapsed_s: float, trained: Counter | None = None
) -> dict[str, Any]:
    """The session's row; `trained` is `trained_by_turn(result)` when the caller has it already."""
    generated = sum(len(t.output_ids) for t in session.turns)
    trained_tokens = sum((trained_by_turn(result) if trained is None else trained).values())
    forwarded = sum(len(s.token_ids) for s in result.samples)
    row: dict[str, Any] = {
        "strategy": strategy,
        "session_id": session.session_id,
        "turns": len(session.turns),
        "samples": len(result.samples),
        "forks": max(len(result.samples) - 1, 0),
        "generated_tokens": generated,
        "trained_tokens": trained_tokens,
        "forwarded_tokens": forwarded,
        "context_tokens": forwarded - trained_tokens,
        "reward": session.reward,
        "elapsed_s": elapsed_s,
        "step": session.step,
    }
    row.update({name: int(result.counters.get(name, 0)) for name in COUNTERS})
    first_meta = session.turns[0].metadata if session.turns else None
    row["behaviours"] = list(_ground_truth(first_meta, "behaviours") or [])
    row["ideal_samples"] = _ground_truth(first_meta, "ideal_samples")
    row["ideal_forwarded_tokens"] = _ground_truth(first_meta, "ideal_forwarded_tokens")
    return row


def sample_rows(strategy: str, session_id: str, result: ReplayResult, step: int | None = None) -> list[dict[str, Any]]:
    """Sample rows (`io.rundir.SAMPLES_SCHEMA`, RUN/samples/); metadata as JSON, `step` the session's."""
    return [
        {
            "strategy": strategy,
            "session_id": session_id,
            "sample_index": i,
            "token_ids": s.token_ids,
            "response_length": s.response_length,
            "loss_mask": s.loss_mask,
            "logprobs": s.logprobs,
            "source_turn": s.source_turn,
            "reward": s.reward,
            "metadata": json.dumps(s.metadata, sort_keys=True, default=str),
            "step": step,
        }
        for i, s in enumerate(result.samples)
    ]


def extra_counters(result: ReplayResult) -> dict[str, int]:
    """Counters a strategy adds beyond the list of docs/metrics.md#per-session (kept, so nothing it
    measured is lost)."""
    return {k: int(v) for k, v in result.counters.items() if k not in COUNTERS}


def _ground_truth(metadata: dict | None, key: str) -> Any:
    return (metadata or {}).get(key) if isinstance(metadata, dict) else None
