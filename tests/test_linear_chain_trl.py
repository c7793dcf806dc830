"""`linear-chain`: TRL's AsyncGRPO message-mode reconciler, end to end on recorded sessions.

The scenarios of TRL's reconciler tests (huggingface/trl 197db06, `TestReconciler`), in our own
data, through the strategy: each session's turns carry recorded prompt ids, so no renderer is
needed. The last test drives the installed `trl` package's own reconciler as an oracle on random
chains (the test extra installs `trl`).
"""

from __future__ import annotations

import importlib
import random

import pytest

from trace_tools.data import Session, Turn
from trace_tools.replay.turnrows import trained_by_turn
from trace_tools.strategies.base import ReplayContext
from trace_tools.strategies.registry import get_strategy
from trace_tools.strategies.tree_core import full_length_layout


def chain(*turns: tuple[list[int], list[int]], sid: str = "chain") -> Session:
    """A session of (prompt ids, output ids) turns; every message history a new user turn, so only ids decide."""
    return Session(
        sid,
        [
            Turn(
                sid,
                index,
                [{"role": "user", "content": f"step {n}"} for n in range(index + 1)],
                list(output),
                prompt_ids=list(prompt),
                output_logprobs=[-0.5 - index] * len(output),
                response={"role": "assistant", "content": f"reply {index}"},
            )
            for index, (prompt, output) in enumerate(turns)
        ],
    )


def replay(session: Session, **params):
    return get_strategy("linear-chain")(ReplayContext(None, params=params)).replay(session)


def layouts(session: Session, **params) -> list[tuple[list[int], list[int]]]:
    return [full_length_layout(s)[:2] for s in replay(session, **params).samples]


def test_a_single_turn_is_one_row():
    assert layouts(chain(([4, 5, 6], [70, 71]))) == [([4, 5, 6, 70, 71], [0, 0, 0, 1, 1])]


def test_a_clean_chain_stays_one_row():
    session = chain(([4, 5, 6], [70, 71]), ([4, 5, 6, 70, 71, 80, 81], [72, 73]))
    assert layouts(session) == [([4, 5, 6, 70, 71, 80, 81, 72, 73], [0, 0, 0, 1, 1, 0, 0, 1, 1])]
    assert replay(session).prompt_events == {0: "clean", 1: "clean"}


def test_a_drift_past_the_threshold_forks_and_trains_each_token_once():
    session = chain(([4, 5, 6], [70, 71, 72, 73]), ([4, 5, 6, 70, 90, 91, 92], [74, 75, 76]))
    assert layouts(session, fork_threshold=2) == [
        ([4, 5, 6, 70, 71, 72, 73], [0, 0, 0, 1, 1, 1, 1]),
        ([4, 5, 6, 70, 90, 91, 92, 74, 75, 76], [0, 0, 0, 0, 0, 0, 0, 1, 1, 1]),
    ]
    result = replay(session, fork_threshold=2)
    assert (result.counters["drift_fork"], result.prompt_events[1]) == (1, "forked")


def test_a_divergence_before_the_last_answer_forks_whatever_the_threshold():
    session = chain(([4, 5, 6], [70, 71]), ([4, 9, 6, 70, 71], [74]))
    assert len(layouts(session, fork_threshold=1_000_000)) == 2


def test_a_tail_wobble_realigns_from_the_divergence_point():
    session = chain(([4, 5, 6], [70, 71]), ([4, 5, 6, 70, 79], [74, 75]))
    (row,) = replay(session).samples
    assert full_length_layout(row)[:2] == ([4, 5, 6, 70, 79, 74, 75], [0, 0, 0, 1, 0, 1, 1])
    assert full_length_layout(row)[2] == [0.0, 0.0, 0.0, -0.5, 0.0, -1.5, -1.5]  # the kept head keeps its logprob


def test_the_gate_is_the_drift_not_the_next_answers_length():
    long_answer = [70, 71, 72, 73, 74, 75]
    session = chain(([4, 5, 6], long_answer), ([4, 5, 6, 90, 91], [76]))
    assert layouts(session, fork_threshold=3) == [
        ([4, 5, 6, *long_answer], [0, 0, 0, 1, 1, 1, 1, 1, 1]),
        ([4, 5, 6, 90, 91, 76], [0, 0, 0, 0, 0, 1]),
    ]


def test_strict_forks_on_any_drift():
    session = chain(([4, 5, 6], [70, 71]), ([4, 5, 6, 70, 79], [74, 75]))
    assert len(layouts(session, strict=True)) == 2
    assert len(layouts(session, strict=False)) == 1


def test_rows_without_a_trained_token_are_dropped():
    session = chain(([4, 5, 6], []), ([4, 8, 8], [74]))
    assert layouts(session) == [([4, 8, 8, 74], [0, 0, 0, 1])]


def test_no_message_routing_a_resent_request_realigns_the_chain():
    # turn 1 resends turn 0's request (a retry): the tree routes it to a sibling branch, the chain
    # REALIGNs it onto turn 0's prompt, erasing turn 0's answer (zeroed), in arrival order
    session = chain(([4, 5, 6], [70, 71]), ([4, 5, 6], [72, 73]))
    session.turns[1].messages = session.turns[0].messages
    result = replay(session)
    assert [full_length_layout(s)[:2] for s in result.samples] == [([4, 5, 6, 72, 73], [0, 0, 0, 1, 1])]
    assert result.turn_events == {0: "zeroed_by_realign"} and dict(trained_by_turn(result)) == {1: 2}
    tree = get_strategy("tree")(ReplayContext(None)).replay(session)
    assert tree.counters["tree_branches"] == 1 and dict(trained_by_turn(tree)) == {0: 2, 1: 2}


def random_chain(rng: random.Random) -> list[tuple[list[int], list[int]]]:
    """Turns whose prompts extend, wobble or rewrite what came before, as a re-tokenizing loop makes them."""
    turns, held = [], [1, 2, 3]
    for _ in range(rng.randint(1, 7)):
        output = [rng.randint(100, 120) for _ in range(rng.randint(0, 6))]
        turns.append((list(held), output))
        held = held + output
        cut = len(held) - rng.choice([0, 0, 1, 2, 5, 9])
        held = held[: max(cut, 1)] + [rng.randint(200, 210) for _ in range(rng.randint(0, 4))]
    return turns


@pytest.mark.parametrize("threshold", [0, 1, 3, 1024])
def test_the_rows_are_trls_own(threshold):
    worker = importlib.import_module("trl.experimental.async_grpo.async_rollout_worker")
    rng = random.Random(threshold)
    for _ in range(150):
        turns = random_chain(rng)
        session = chain(*turns)
        upstream = worker._chain_to_sequences(
            [
                worker.TurnRecord(p, o, list(t.output_logprobs or []))
                for (p, o), t in zip(turns, session.turns, strict=True)
            ],
            "r",
            threshold,
        )
        rows = upstream[0] if isinstance(upstream, tuple) else upstream  # newer releases add a drift tally
        ours = [full_length_layout(s) for s in replay(session, fork_threshold=threshold).samples]
        assert ours == [(r.input_ids, r.completion_mask, r.old_log_probs) for r in rows], turns
