"""The `tree` strategy over recorded sessions: provenance, per-turn events, counters, options, edge guards."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from trace_tools.data import COUNTERS, ReplayResult, Sample, Session, Turn
from trace_tools.errors import InvalidOption, ReplayError
from trace_tools.strategies.base import ReplayContext
from trace_tools.strategies.declarations import TREE
from trace_tools.strategies.registry import get_strategy
from trace_tools.strategies.tree import TreeStrategy
from trace_tools.strategies.tree_core import BaseSample, TrajectoryManager, TurnRecord

SYSTEM = {"role": "system", "content": "you fix bugs"}
USER = {"role": "user", "content": "tests fail"}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def tool(text: str) -> dict:
    return {"role": "tool", "content": text, "tool_call_id": "call-1"}


def turn(index: int, messages: list[dict], prompt: list[int], output: list[int], reply: str, **extra) -> Turn:
    return Turn(
        session_id="sess",
        turn_index=index,
        messages=messages,
        output_ids=output,
        prompt_ids=prompt,
        output_logprobs=extra.pop("logprobs", [-0.1 * (k + 1) for k in range(len(output))]),
        response=assistant(reply),
        **extra,
    )


def linear_session() -> Session:
    """Three byte-exact append-only turns (prompt of turn n = prompt + output of n-1 + a tool block)."""
    return Session(
        "sess",
        [
            turn(0, [SYSTEM, USER], [1, 2, 3], [10, 11], "look"),
            turn(1, [SYSTEM, USER, assistant("look"), tool("r0")], [1, 2, 3, 10, 11, 20, 21], [12, 13], "edit"),
            turn(
                2,
                [SYSTEM, USER, assistant("look"), tool("r0"), assistant("edit"), tool("r1")],
                [1, 2, 3, 10, 11, 20, 21, 12, 13, 22, 23],
                [14, 15],
                "done",
                reward=2.0,
            ),
        ],
    )


def wobble_session(echo: str = "look") -> Session:
    """Turn 1's prompt re-renders the last token of turn 0's answer (11 -> 99)."""
    return Session(
        "sess",
        [
            turn(0, [SYSTEM, USER], [1, 2, 3], [10, 11], "look"),
            turn(1, [SYSTEM, USER, assistant(echo), tool("r0")], [1, 2, 3, 10, 99, 20, 21], [12, 13], "edit"),
        ],
    )


def run(session: Session, **params) -> ReplayResult:
    return TreeStrategy(ReplayContext(None, prompt_source="recorded", params=params)).replay(session)


def test_tree_is_registered():
    assert get_strategy("tree") is TreeStrategy


def test_tree_append_only_session_is_one_fully_trained_sample():
    result = run(linear_session())
    (sample,) = result.samples
    assert isinstance(sample, Sample)
    assert sample.token_ids == [1, 2, 3, 10, 11, 20, 21, 12, 13, 22, 23, 14, 15]
    assert sample.source_turn == [-1, -1, -1, 0, 0, -1, -1, 1, 1, -1, -1, 2, 2]
    assert sample.loss_mask == [1, 1, 0, 0, 1, 1, 0, 0, 1, 1]
    assert sample.logprobs == pytest.approx([-0.1, -0.2, 0, 0, -0.1, -0.2, 0, 0, -0.1, -0.2])
    assert sample.reward == 2.0
    assert result.prompt_events == {0: "clean", 1: "clean", 2: "clean"}
    assert result.turn_events == {} and result.drift_positions == {}
    assert (result.counters["drift_clean"], result.counters["drift_fork"], result.counters["tree_branches"]) == (
        2,
        0,
        0,
    )
    assert set(COUNTERS) <= set(result.counters)


def test_tree_realign_zeroes_the_previous_answer_and_marks_both_turns():
    result = run(wobble_session())
    (sample,) = result.samples
    assert sample.token_ids == [1, 2, 3, 10, 99, 20, 21, 12, 13]
    assert sample.source_turn == [-1] * 7 + [1, 1]  # the overwritten answer is context now
    assert sample.loss_mask == [0, 0, 0, 0, 1, 1]
    assert result.turn_events == {0: "zeroed_by_realign"}
    assert result.prompt_events == {0: "clean", 1: "realigned"}
    assert result.drift_positions == {1: 4}
    assert result.counters["drift_realign"] == 1


def test_tree_trl_realign_keeps_the_matching_head_trained():
    result = run(wobble_session(), realign_gate="drift", realign_from="divergence")
    (sample,) = result.samples
    assert sample.source_turn == [-1, -1, -1, 0, -1, -1, -1, 1, 1]
    assert sample.loss_mask == [1, 0, 0, 0, 1, 1]
    assert sample.logprobs == pytest.approx([-0.1, 0, 0, 0, -0.1, -0.2])
    assert result.turn_events == {}  # partly trained: the engine reads that from provenance
    assert result.prompt_events[1] == "realigned" and result.drift_positions == {1: 4}


def test_tree_threshold_zero_forks_instead():
    result = run(wobble_session(), fork_threshold=0)
    assert [s.source_turn for s in result.samples] == [[-1, -1, -1, 0, 0], [-1] * 7 + [1, 1]]
    assert [s.loss_mask for s in result.samples] == [[1, 1], [1, 1]]
    assert result.prompt_events == {0: "clean", 1: "forked"}
    assert result.drift_positions == {1: 4}
    assert (result.counters["drift_fork"], result.counters["drift_realign"]) == (1, 0)
    assert result.turn_events == {}


def test_tree_rewritten_echo_demotes_the_short_turn():
    result = run(wobble_session(echo="look again"))
    (sample,) = result.samples
    assert sample.source_turn == [-1] * 7 + [1, 1] and sample.loss_mask == [1, 1]
    assert result.turn_events == {0: "demoted_by_merge"}
    assert result.counters["rewrite_merges"] == 1
    assert result.counters["drift_clean"] + result.counters["drift_realign"] + result.counters["drift_fork"] == 0


def test_tree_rewritten_echo_branches_when_merge_is_off():
    result = run(wobble_session(echo="look again"), fork_threshold=0)
    assert len(result.samples) == 2
    assert result.counters["tree_branches"] == 1 and result.counters["rewrite_merges"] == 0
    assert result.turn_events == {}


def test_tree_regenerations_are_sibling_leaves():
    session = Session(
        "sess", [turn(0, [SYSTEM, USER], [1, 2, 3], [10, 11], "a"), turn(1, [SYSTEM, USER], [1, 2, 3], [12, 13], "b")]
    )
    result = run(session)
    assert [s.source_turn[-1] for s in result.samples] == [0, 1]
    assert result.counters["tree_branches"] == 1


def test_tree_max_sample_tokens_truncates():
    (sample,) = run(linear_session(), max_sample_tokens=6).samples
    assert sample.token_ids == [1, 2, 3, 10, 11, 20] and sample.loss_mask == [1, 1, 0]
    assert sample.source_turn == [-1, -1, -1, 0, 0, -1]


def test_tree_truncation_below_first_prompt_drops_the_sample_safely():
    result = run(linear_session(), max_sample_tokens=2)
    assert result.samples == [] and result.counters["truncation_drops"] == 1


def test_tree_unsafe_edges_reproduce_negative_response_length():
    (sample,) = run(linear_session(), max_sample_tokens=2, safe_edges=False).samples
    assert (sample.token_ids, sample.response_length, sample.loss_mask) == ([1, 2], -1, [])


def _shared_first_turn(mgr: TrajectoryManager) -> list:
    """Two leaves share turn 1; the second leaf's only trained tokens are its last answer."""
    for prompt, output, result in (([1, 2], [10], None), ([1, 2, 10, 5], [11], "a"), ([1, 2, 10, 6], [12], "b")):
        history = [USER] if result is None else [USER, assistant("x"), {"role": "tool", "content": result}]
        mgr.record_turn(
            "s",
            turn=TurnRecord(prompt, output),
            prompt_messages=history,
            response_message=assistant("x" if result is None else result),
        )
    return mgr.get_trajectory("s", base_sample=BaseSample(), max_sample_tokens=4)


def test_truncation_that_cuts_every_trained_token():
    unsafe = _shared_first_turn(TrajectoryManager(safe_edges=False))
    assert [s.loss_mask for s in unsafe] == [[1, 0], [0, 0]]  # upstream emits an untrained sample
    safe_manager = TrajectoryManager()
    assert [s.loss_mask for s in _shared_first_turn(safe_manager)] == [[1, 0]]
    assert safe_manager.pop_stats("s").counters["truncation_drops"] == 1


def test_tree_bad_logprobs_raise_a_replay_error():
    session = Session("sess", [turn(0, [SYSTEM, USER], [1, 2, 3], [10, 11], "a", logprobs=[-0.5])])
    with pytest.raises(ReplayError, match="output_log_probs has 1 entries but output_ids has 2"):
        run(session)


@pytest.mark.parametrize(
    "params",
    [{"realign_gate": "sideways"}, {"realign_from": "middle"}, {"fork_threshold": "many"}, {"max_sample_tokens": -4}],
)
def test_tree_rejects_bad_options(params):
    with pytest.raises(InvalidOption):
        run(linear_session(), **params)
    assert issubclass(InvalidOption, ValueError)


def test_replay_prepared_accepts_prepared_turn_like_inputs():
    """Other strategies feed their own prepared turns (e.g. healed prompt ids) through the same manager."""
    session = linear_session()
    prepared = [
        SimpleNamespace(
            turn=t,
            messages=[{"role": m["role"], "content": m["content"]} for m in t.messages],
            response_message=assistant(t.response["content"]),
            prompt_ids=t.prompt_ids,
            ill_formed=False,
        )
        for t in session.turns
    ]
    result = TreeStrategy(ReplayContext(None)).replay_prepared("other-id", prepared, reward=0.5)
    assert [(s.token_ids, s.source_turn, s.reward) for s in result.samples] == [
        (run(session).samples[0].token_ids, run(session).samples[0].source_turn, 0.5)
    ]


def test_subclass_can_rewrite_turns_before_recording():
    class Shifted(TreeStrategy):
        declaration = replace(TREE, name="tree-shifted-test", label="shifted")

        def record_prepared(self, manager, session_id, prepared):
            prepared.prompt_ids = [7] + list(prepared.prompt_ids)  # every prompt changes its first token
            super().record_prepared(manager, session_id, prepared)

    result = Shifted(ReplayContext(None, prompt_source="recorded")).replay(linear_session())
    assert len(result.samples) == 1 and result.samples[0].token_ids[0] == 7


def test_ill_formed_and_tool_use_reach_sample_metadata():
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "Bash", "arguments": "{not json"}}],
    }
    session = Session(
        "sess", [Turn("sess", 0, [USER], [10, 11], prompt_ids=[1, 2], response=call, finish_reason="length")]
    )
    (sample,) = run(session).samples
    assert sample.metadata == {"truncated": True, "use_tool": True, "ill_formed": True}


# ---- end to end on the real Qwen3 template and tokenizer -----------------------------------------


@pytest.fixture(scope="module")
def qwen3():
    from trace_tools.render.renderer import Renderer

    return Renderer.from_spec("qwen3", "qwen3")


def _qwen3_session(renderer, first_reply: dict, first_text: str) -> Session:
    """Two turns; the second echoes the first reply and adds a new user message."""
    history = [SYSTEM, USER]
    follow_up = history + [dict(first_reply, role="assistant"), {"role": "user", "content": "go on"}]
    return Session(
        "q",
        [
            Turn("q", 0, history, renderer.encode(first_text), response=first_reply),
            Turn("q", 1, follow_up, renderer.encode("Done.<|im_end|>"), response=assistant("Done.")),
        ],
    )


def _rendered(renderer, session: Session, **params) -> ReplayResult:
    ctx = ReplayContext(renderer, prompt_source="rendered", params=params)
    return TreeStrategy(ctx).replay(session)


def test_qwen3_plain_answers_stay_one_clean_sample(qwen3):
    session = _qwen3_session(qwen3, assistant("I will look."), "I will look.<|im_end|>")
    result = _rendered(qwen3, session)
    (sample,) = result.samples
    assert sum(sample.loss_mask) == sum(len(t.output_ids) for t in session.turns)
    assert result.prompt_events == {0: "clean", 1: "clean"} and result.counters["drift_clean"] == 1


def test_qwen3_dropped_reasoning_realigns_and_zeroes_the_first_turn(qwen3):
    reply = {"role": "assistant", "content": "I will look.", "reasoning_content": "plan"}
    session = _qwen3_session(qwen3, reply, "<think>\nplan\n</think>\n\nI will look.<|im_end|>")
    first_prompt = qwen3.render([SYSTEM, USER], None, True)
    result = _rendered(qwen3, session)
    (sample,) = result.samples
    assert 0 not in sample.source_turn  # the whole first answer became context
    assert result.turn_events == {0: "zeroed_by_realign"} and result.prompt_events[1] == "realigned"
    assert result.drift_positions == {1: len(first_prompt)}  # diverges where the answer started
    forked = _rendered(qwen3, session, fork_threshold=0)
    assert [s.source_turn.count(0) for s in forked.samples] == [len(session.turns[0].output_ids), 0]
    assert sum(sum(s.loss_mask) for s in forked.samples) == sum(len(t.output_ids) for t in session.turns)
