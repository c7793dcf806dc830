"""miles sample assembly (docs/upstream_session.md#the-samples-op): trailing trim, truncation, merge, provenance."""

from __future__ import annotations

import pytest

from trace_tools.strategies.session_core.assembly import (
    COMPLETED,
    TRUNCATED,
    TurnSample,
    assemble_records,
    chain_provenance,
    compute_turn_samples,
    merge_pair,
    merge_turn_samples,
    sample_status,
    truncate_turn_samples,
)
from trace_tools.strategies.session_core.errors import AssemblyError
from trace_tools.strategies.session_core.records import Generation, Record

STOP = 9  # a stop token that the next turn's render replaces (GLM-style)


def record(turn: int, prompt: list[int], output: list[int], finish: str | None = "stop") -> Record:
    logprobs = [-(turn + 1) - k / 10 for k in range(len(output))]
    return Record(turn, prompt, Generation(output, logprobs, finish, {"role": "assistant", "content": ""}))


def glm_pair():
    first = record(0, [10, 11], [20, 21, STOP])
    second = record(1, [10, 11, 20, 21, 30, 31], [40, STOP])
    return [first, second], second.all_ids


def test_trailing_stop_replaced_by_the_next_opener_is_trimmed():
    records, acc = glm_pair()
    turns = compute_turn_samples(records, acc, max_trim=1)
    assert turns[0].tokens == [10, 11, 20, 21] and turns[0].response_length == 2
    assert turns[0].logprobs == records[0].generation.logprobs[:2]
    assert turns[1].tokens == acc and turns[1].response_length == 2  # the last turn keeps its stop
    merged = merge_turn_samples(turns)
    assert merged.tokens == acc and merged.response_length == 6
    assert merged.loss_mask == [1, 1, 0, 0, 1, 1]
    assert merged.logprobs == [-1.0, -1.1, 0.0, 0.0, -2.0, -2.1]
    assert merged.tokens[: len(merged.tokens) - merged.response_length] == records[0].prompt_ids
    assert sum(merged.loss_mask) == (3 - 1) + (2 - 0)  # Σ (len(O_i) - trim_i)


def test_trim_beyond_the_family_allowance_is_a_422():
    records, acc = glm_pair()
    with pytest.raises(AssemblyError):
        compute_turn_samples(records, acc, max_trim=0)


def test_the_last_turn_is_never_trimmed():
    records, _ = glm_pair()
    with pytest.raises(AssemblyError):
        compute_turn_samples(records, records[1].prompt_ids + [40, 8], max_trim=1)


def test_history_longer_than_the_records_is_a_422():
    records, acc = glm_pair()
    with pytest.raises(AssemblyError, match="cover"):
        compute_turn_samples(records, acc + [77], max_trim=1)


def three_turns(finishes=("stop", "stop", "stop")):
    a = record(0, [1, 2], [3, 4], finishes[0])
    b = record(1, a.all_ids + [5], [6, 7, 8], finishes[1])
    c = record(2, b.all_ids + [9, 9], [10, 11], finishes[2])
    return [a, b, c]


def test_truncation_cuts_the_first_overflowing_turn_and_drops_the_rest():
    records = three_turns()
    turns = compute_turn_samples(records, records[-1].all_ids, 0)
    assert truncate_turn_samples(turns, 100) == turns
    cut = truncate_turn_samples(turns, 7)  # turn 1 has 8 tokens: one output token goes
    assert len(cut) == 2 and cut[1].status == TRUNCATED
    assert cut[1].tokens == [1, 2, 3, 4, 5, 6, 7] and cut[1].response_length == 2
    assert cut[1].loss_mask == [1, 1] and cut[1].logprobs == records[1].generation.logprobs[:2]
    merged = merge_turn_samples(cut)
    assert merged.status == TRUNCATED and merged.loss_mask == [1, 1, 0, 1, 1]


def test_truncation_that_leaves_no_response_token_drops_the_turn():
    records = three_turns()
    turns = compute_turn_samples(records, records[-1].all_ids, 0)
    assert [t.records[-1].turn_index for t in truncate_turn_samples(turns, 5)] == [0]  # turn 1 would keep 0
    assert truncate_turn_samples(turns, 2) == []
    assert assemble_records(records, records[-1].all_ids, 0, max_seq_len=2) is None


@pytest.mark.parametrize("finish", ["length", "abort", "content_filter"])
def test_merge_stops_after_a_turn_that_did_not_complete(finish):
    records = three_turns(("stop", finish, "stop"))
    merged = assemble_records(records, records[-1].all_ids, 0)
    assert merged.tokens == records[1].all_ids and merged.status == sample_status(finish) != COMPLETED
    assert sum(merged.loss_mask) == 2 + 3  # turns 0 and 1; turn 2 is cut off


def test_status_table():
    assert [sample_status(f) for f in ("stop", "tool_calls", "length", "abort", "weird", None)] == [
        COMPLETED,
        COMPLETED,
        TRUNCATED,
        "aborted",
        "pending",
        COMPLETED,
    ]


def test_merge_requires_context_between_turns_and_a_prefix():
    a = TurnSample([1, 2, 3], 1, [1], [-0.5], COMPLETED, [])
    glued = TurnSample([1, 2, 3, 4], 1, [1], [-0.5], COMPLETED, [])  # no observation token between
    with pytest.raises(AssemblyError, match="observation"):
        merge_pair(a, glued)
    with pytest.raises(AssemblyError, match="extend"):
        merge_pair(a, TurnSample([1, 9, 3, 5, 6], 1, [1], [-0.5], COMPLETED, []))


def test_provenance_follows_the_outputs_through_the_chain():
    records, acc = glm_pair()
    assert chain_provenance(records) == [-1, -1, 0, 0, -1, -1, 1, 1]
    merged = merge_turn_samples(compute_turn_samples(records, acc, 1))
    sample = merged.to_sample(reward=2.0)
    assert sample.source_turn == [-1, -1, 0, 0, -1, -1, 1, 1] and sample.reward == 2.0
    region = sample.source_turn[-sample.response_length :]
    assert all(m == (s >= 0) for m, s in zip(sample.loss_mask, region))
