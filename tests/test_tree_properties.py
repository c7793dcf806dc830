"""Property tests: the invariants of docs/metrics.md#invariants of the tree manager over random small sessions.

Sessions are random message trees (fresh roots, extensions of any earlier turn, regenerations of
the same prompt, rewritten or foreign assistant echoes) rendered by a toy chat format, with random
token drift (replace / insert / delete) applied to some prompts. Output ids carry distinctive
logprobs so a trained token's logprob can be traced back to the exact recorded one.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trace_tools.strategies.tree_core import BaseSample, TrajectoryManager, TreeSample, TurnRecord

OPEN = {"system": 100, "user": 200, "tool": 300, "assistant": 400}
A_CLOSE, DRIFT = 499, 999

SETTINGS = {
    "slime": {},
    "slime-threshold-1": {"fork_threshold": 1},
    "agentcore-now": {"fork_threshold": 0},
    "trl": {"fork_threshold": 3, "realign_gate": "drift", "realign_from": "divergence"},
    "drift-gate-from-response": {"fork_threshold": 2, "realign_gate": "drift"},
}


@dataclass
class RecordedTurn:
    index: int
    messages: list[dict]
    prompt: list[int]
    output: list[int]
    logprobs: tuple[float, ...]
    reply: dict | None


class ToyFormat:
    """Renders messages to ids; a generated reply re-renders to exactly `[assistant open] + its output`."""

    def __init__(self):
        self.outputs: dict[str, list[int]] = {}

    def render(self, messages: list[dict]) -> list[int]:
        ids: list[int] = []
        for message in messages:
            ids += self._message(message)
        return ids + [OPEN["assistant"]]

    def _message(self, message: dict) -> list[int]:
        role, content = message["role"], message["content"]
        if role == "assistant" and content in self.outputs:
            return [OPEN[role]] + self.outputs[content]
        body = OPEN[role] + 1 + sum(map(ord, content)) % 90
        return [OPEN[role], body, OPEN[role] + 99]


def _message_history(draw, turns: list[RecordedTurn], append_only: bool) -> list[dict]:
    fresh = [{"role": "system", "content": "s"}, {"role": "user", "content": f"u{draw(st.integers(0, 2))}"}]
    if not turns:
        return fresh if not append_only else fresh[:1] + [{"role": "user", "content": "u0"}]
    if append_only:
        base = turns[-1]
        return base.messages + [base.reply, {"role": "tool", "content": f"t{base.index}"}]
    mode = draw(st.sampled_from(["fresh", "extend", "extend", "extend", "regenerate"]))
    base = draw(st.sampled_from(turns))
    if mode == "fresh":
        return fresh
    if mode == "regenerate":
        return list(base.messages)
    echo = base.reply
    if echo is None or draw(st.integers(0, 7)) == 0:  # a rewritten or foreign assistant message
        echo = {"role": "assistant", "content": f"edited-{base.index}-{draw(st.integers(0, 1))}"}
    return base.messages + [echo, {"role": "tool", "content": f"t{draw(st.integers(0, 3))}"}]


def _drifted(draw, prompt: list[int], echo_span: range) -> list[int]:
    """Random drift anywhere, or a "wobble" inside the echo of the answer this turn extends."""
    mode = draw(st.sampled_from(["none", "none", "none", "replace", "insert", "delete", "wobble", "wobble"]))
    if mode == "none" or (mode == "wobble" and not echo_span):
        return prompt
    if mode == "wobble":
        at = draw(st.sampled_from(echo_span))
        return prompt[:at] + [DRIFT] + prompt[at + 1 :]
    at = draw(st.integers(0, len(prompt) - 1))
    if mode == "replace":
        return prompt[:at] + [DRIFT] + prompt[at + 1 :]
    if mode == "insert":
        return prompt[:at] + [DRIFT] + prompt[at:]
    return prompt[:at] + prompt[at + 1 :]


def _last_echo_span(toy: ToyFormat, messages: list[dict]) -> range:
    """Positions of the last assistant message's generated ids in the rendered prompt (empty if none)."""
    for cut in range(len(messages) - 1, -1, -1):
        if messages[cut]["role"] == "assistant" and messages[cut]["content"] in toy.outputs:
            start = len(toy.render(messages[:cut]))
            return range(start, start + len(toy.outputs[messages[cut]["content"]]))
    return range(0)


@st.composite
def sessions(draw, append_only: bool = False) -> list[RecordedTurn]:
    toy, turns = ToyFormat(), []
    for index in range(draw(st.integers(1, 6))):
        messages = _message_history(draw, turns, append_only)
        prompt = toy.render(messages)
        if not append_only:
            prompt = _drifted(draw, prompt, _last_echo_span(toy, messages))
        body = draw(st.lists(st.integers(500, 509), min_size=1 if append_only else 0, max_size=4))
        output = body + [A_CLOSE] if body else []
        with_logprobs = append_only or draw(st.booleans())
        logprobs = tuple(-(index + 1) - k / 100 for k in range(len(output))) if with_logprobs else ()
        reply = {"role": "assistant", "content": f"r{index}"} if output else None
        if output:
            toy.outputs[f"r{index}"] = output
        turns.append(RecordedTurn(index, messages, prompt, output, logprobs, reply))
    return turns


def replay(turns: list[RecordedTurn], params: dict, max_sample_tokens: int = 0):
    mgr = TrajectoryManager(**params)
    for t in turns:
        mgr.record_turn(
            "s",
            turn=TurnRecord(t.prompt, t.output, "stop", t.logprobs),
            prompt_messages=t.messages,
            response_message=t.reply,
            source=t.index,
        )
    samples = mgr.get_trajectory("s", base_sample=BaseSample(), reward=1.5, max_sample_tokens=max_sample_tokens)
    return samples, mgr.pop_stats("s")


def source_runs(sample: TreeSample) -> list[tuple[int, int, int]]:
    """Maximal runs `(source, start, end)` of equal non-negative provenance."""
    runs, start = [], 0
    for pos in range(1, len(sample.source_turn) + 1):
        if pos == len(sample.source_turn) or sample.source_turn[pos] != sample.source_turn[start]:
            if sample.source_turn[start] >= 0:
                runs.append((sample.source_turn[start], start, pos))
            start = pos
    return runs


def check_layout(sample: TreeSample) -> None:
    assert len(sample.loss_mask) == len(sample.logprobs) == sample.response_length
    assert len(sample.source_turn) == len(sample.token_ids)
    assert 0 < sample.response_length <= len(sample.token_ids)
    assert any(sample.loss_mask), "no fully masked sample is emitted"
    assert all(lp == 0.0 for lp, mask in zip(sample.logprobs, sample.loss_mask) if not mask), "context has logprob 0"
    assert sample.reward == 1.5


def trained_by_turn(turns: list[RecordedTurn], samples: list[TreeSample]) -> Counter:
    """Check every run of a turn's tokens against its recorded output; count trained tokens per turn."""
    trained, owner = Counter(), {}
    for number, sample in enumerate(samples):
        check_layout(sample)
        region_start = len(sample.token_ids) - sample.response_length
        for source, start, end in source_runs(sample):
            turn = turns[source]
            assert sample.token_ids[start:end] == turn.output[: end - start], "provenance points at other ids"
            masks = [sample.loss_mask[p - region_start] if p >= region_start else 0 for p in range(start, end)]
            assert len(set(masks)) == 1, "a turn's run is trained entirely or not at all"
            if masks[0]:
                assert owner.setdefault(source, number) == number, f"turn {source} trained in two samples"
                recorded = turn.logprobs or (0.0,) * len(turn.output)
                assert sample.logprobs[start - region_start : end - region_start] == list(recorded[: end - start])
                trained[source] += end - start
        untracked = [
            p
            for p in range(region_start, len(sample.token_ids))
            if sample.loss_mask[p - region_start] and sample.source_turn[p] < 0
        ]
        assert not untracked, "a trained token without provenance"
    return trained


@pytest.mark.parametrize("name", list(SETTINGS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns=sessions())
def test_tree_invariants_on_random_sessions(name, turns):
    params = SETTINGS[name]
    samples, stats = replay(turns, params)
    trained = trained_by_turn(turns, samples)
    for t in turns:
        assert trained[t.index] <= len(t.output)
        if stats.turn_events.get(t.index) in ("zeroed_by_realign", "demoted_by_merge"):
            assert trained[t.index] == 0
        elif params.get("realign_from") != "divergence":
            assert trained[t.index] == len(t.output), f"turn {t.index} lost tokens without an event"
    if params.get("fork_threshold", 1024) <= 0:  # agentcore now: nothing is ever zeroed or merged away
        assert stats.counters["drift_realign"] == stats.counters["rewrite_merges"] == 0
        assert all(trained[t.index] == len(t.output) for t in turns)


@pytest.mark.parametrize("name", list(SETTINGS))
@settings(max_examples=40, deadline=None)
@given(turns=sessions(), budget=st.integers(1, 30))
def test_tree_invariants_hold_under_truncation(name, turns, budget):
    samples, _ = replay(turns, SETTINGS[name], max_sample_tokens=budget)
    trained_by_turn(turns, samples)
    assert all(len(s.token_ids) <= budget for s in samples)


@pytest.mark.parametrize("name", list(SETTINGS))
@settings(max_examples=40, deadline=None)
@given(turns=sessions(append_only=True))
def test_byte_exact_append_only_is_one_fully_trained_sample(name, turns):
    samples, stats = replay(turns, SETTINGS[name])
    assert len(samples) == 1
    trained = trained_by_turn(turns, samples)
    assert all(trained[t.index] == len(t.output) for t in turns)
    assert stats.counters["drift_clean"] == len(turns) - 1
    assert stats.counters["drift_fork"] == stats.counters["drift_realign"] == stats.counters["tree_branches"] == 0
    assert set(stats.prompt_events.values()) == {"clean"} and not stats.turn_events
