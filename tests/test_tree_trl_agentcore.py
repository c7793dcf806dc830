"""TRL's reconciler cases and agentcore's trajectory cases (docs/upstream_tree.md#case--test-map), in our own data.

TRL has no message tree: one conversation is a list of turns. We feed such a list through the
tree manager with a strictly growing message history, so the tree is a single chain and only the
token layer decides. TRL's variant is `realign_gate="drift", realign_from="divergence"`.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from trace_tools.strategies.tree_core import (
    BaseSample,
    DriftKind,
    MessageNode,
    SampleLayoutError,
    TrajectoryManager,
    TreeSample,
    TurnRecord,
    _SampleBuilder,
    common_prefix_len,
    full_length_layout,
)


def trl_manager(fork_threshold: int = 1024) -> TrajectoryManager:
    return TrajectoryManager(fork_threshold, realign_gate="drift", realign_from="divergence")


def conversation(mgr: TrajectoryManager, turns: list[TurnRecord], sid: str = "c") -> None:
    """Record turns as one linear conversation: each turn's history is the previous one plus its reply."""
    history = [{"role": "user", "content": "task"}]
    for i, turn in enumerate(turns):
        reply = {"role": "assistant", "content": f"reply {i}"}
        mgr.record_turn(sid, turn=turn, prompt_messages=list(history), response_message=reply)
        history += [reply, {"role": "tool", "content": f"result {i}"}]


def rows(mgr: TrajectoryManager, turns: list[TurnRecord]) -> list[tuple[list[int], list[int], list[float]]]:
    conversation(mgr, turns)
    return [full_length_layout(s) for s in mgr.get_trajectory("c", base_sample=BaseSample(rollout_id="r0"))]


# ---- TRL -----------------------------------------------------------------------------------------


def test_trl_common_prefix_len():
    assert common_prefix_len([5, 6, 7], [5, 6, 7]) == 3
    assert common_prefix_len([5, 6], [5, 6, 7, 8]) == 2
    assert common_prefix_len([], [5, 6]) == 0
    assert common_prefix_len([5, 6, 7, 8, 9], [5, 6, 7, 0, 9], chunk=2) == 3  # fast path, then per token
    assert common_prefix_len([5, 6, 7, 8], [5, 6, 7, 8, 9], chunk=2) == 4


def test_trl_single_turn():
    mgr = trl_manager()
    conversation(mgr, [TurnRecord([5, 6, 7], [40, 41], output_log_probs=(-0.5, -0.25))])
    (sample,) = mgr.get_trajectory("c", base_sample=BaseSample(rollout_id="r0"))
    assert full_length_layout(sample) == ([5, 6, 7, 40, 41], [0, 0, 0, 1, 1], [0.0, 0.0, 0.0, -0.5, -0.25])
    assert sample.rollout_id == "r0"


def test_trl_clean_chain_stays_one_row():
    t1 = TurnRecord([5, 6, 7], [40, 41], output_log_probs=(-0.5, -0.25))
    t2 = TurnRecord([5, 6, 7, 40, 41, 60, 61], [42, 43], output_log_probs=(-1.0, -2.0))
    assert rows(trl_manager(), [t1, t2]) == [
        (
            [5, 6, 7, 40, 41, 60, 61, 42, 43],
            [0, 0, 0, 1, 1, 0, 0, 1, 1],
            [0.0, 0.0, 0.0, -0.5, -0.25, 0.0, 0.0, -1.0, -2.0],
        )
    ]


def test_trl_rewrite_forks_into_two_rows():
    t1 = TurnRecord([5, 6, 7], [40, 41, 42, 43])
    t2 = TurnRecord([5, 6, 7, 40, 77, 78, 79], [50, 51, 52])  # drift 3 >= threshold 2
    got = rows(trl_manager(fork_threshold=2), [t1, t2])
    assert [(ids, mask) for ids, mask, _ in got] == [
        ([5, 6, 7, 40, 41, 42, 43], [0, 0, 0, 1, 1, 1, 1]),
        ([5, 6, 7, 40, 77, 78, 79, 50, 51, 52], [0] * 7 + [1, 1, 1]),
    ]


def test_trl_fork_when_divergence_precedes_last_response():
    builder = _SampleBuilder(1024, "drift", "divergence")
    builder.append_turn(TurnRecord([5, 6, 7], [40, 41]), DriftKind.CLEAN)
    assert builder.last_response_start_idx == 3
    assert builder.classify_token_drift(TurnRecord([5, 0, 7, 40, 41], [50])) is DriftKind.FORK


def test_trl_tail_wobble_realigns_to_context():
    t1 = TurnRecord([5, 6, 7], [40, 41], output_log_probs=(-0.5, -0.25))
    t2 = TurnRecord([5, 6, 7, 40, 44], [50, 51], output_log_probs=(-1.0, -2.0))  # 41 re-rendered as 44
    mgr = trl_manager()
    conversation(mgr, [t1, t2])
    (sample,) = mgr.get_trajectory("c", base_sample=BaseSample())
    # our layout: the response region only (the first prompt [5, 6, 7] stripped)
    assert sample.token_ids == [5, 6, 7, 40, 44, 50, 51]
    assert sample.response_length == 4
    assert sample.loss_mask == [1, 0, 1, 1]
    assert sample.logprobs == [-0.5, 0.0, -1.0, -2.0]
    # TRL's full-length layout, literally
    assert full_length_layout(sample) == (
        [5, 6, 7, 40, 44, 50, 51],
        [0, 0, 0, 1, 0, 1, 1],
        [0.0, 0.0, 0.0, -0.5, 0.0, -1.0, -2.0],
    )


def test_trl_tail_wobble_under_slime_masks_the_whole_answer():
    """Same data, slime's rule: REALIGN rewrites from the response start, so 40 loses its loss too."""
    t1 = TurnRecord([5, 6, 7], [40, 41], output_log_probs=(-0.5, -0.25))
    t2 = TurnRecord([5, 6, 7, 40, 44], [50, 51], output_log_probs=(-1.0, -2.0))
    assert rows(TrajectoryManager(), [t1, t2])[0][1] == [0, 0, 0, 0, 0, 1, 1]


def test_trl_large_drift_forks_even_when_next_turn_is_short():
    t1 = TurnRecord([5, 6, 7], [40, 41, 42, 43, 44, 45])
    t2 = TurnRecord([5, 6, 7, 70, 71], [50])  # answer dropped: 6 held tokens invalidated, 1-token reply
    got = rows(trl_manager(fork_threshold=3), [t1, t2])
    assert [(ids, mask) for ids, mask, _ in got] == [
        ([5, 6, 7, 40, 41, 42, 43, 44, 45], [0, 0, 0] + [1] * 6),
        ([5, 6, 7, 70, 71, 50], [0, 0, 0, 0, 0, 1]),
    ]
    # slime's output-length gate would REALIGN here (1 < 3) and lose the long answer
    slime = rows(TrajectoryManager(fork_threshold=3), [t1, t2])
    assert [mask for _, mask, _ in slime] == [[0, 0, 0, 0, 0, 1]]


def test_trl_clean_two_turns_stay_one_row():
    t1 = TurnRecord([1, 2, 3], [10, 11], output_log_probs=(-0.1, -0.2))
    t2 = TurnRecord([1, 2, 3, 10, 11, 20, 21], [30, 31], output_log_probs=(-0.3, -0.4))
    ((ids, mask, lps),) = rows(trl_manager(), [t1, t2])
    assert mask == [0, 0, 0, 1, 1, 0, 0, 1, 1]
    assert lps == [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, 0.0, -0.3, -0.4]


def test_trl_history_rewrite_forks_into_two_rows():
    t1 = TurnRecord([5, 6, 7], [40, 41, 42, 43], output_log_probs=(-0.1,) * 4)
    t2 = TurnRecord([5, 6, 7, 80, 81, 82], [50, 51, 52], output_log_probs=(-0.2,) * 3)
    got = rows(trl_manager(fork_threshold=2), [t1, t2])
    assert [mask for _, mask, _ in got] == [[0, 0, 0, 1, 1, 1, 1], [0] * 6 + [1, 1, 1]]
    assert sum(sum(mask) for _, mask, _ in got) == 4 + 3  # every generated token trained exactly once


# ---- agentcore ---------------------------------------------------------------------------------


def test_agentcore_leaves_handles_chain_deeper_than_recursion_limit():
    root = node = MessageNode()
    for _ in range(sys.getrecursionlimit() * 3):
        node = node.add_child(MessageNode(role="assistant"))
    assert list(root.leaves()) == [node]
    assert len(node.path_from_root()) == sys.getrecursionlimit() * 3


def test_agentcore_leaves_preserves_left_to_right_dfs_order():
    root = MessageNode()
    west = root.add_child(MessageNode("user", {"content": "W"}))
    west_leaf = west.add_child(MessageNode("assistant", {"content": "W1"}))
    east = root.add_child(MessageNode("user", {"content": "E"}))
    east_leaf = east.add_child(MessageNode("assistant", {"content": "E1"}))
    assert list(root.leaves()) == [west_leaf, east_leaf]


def test_agentcore_trace_record_rejects_loss_mask_longer_than_tokens():
    with pytest.raises(SampleLayoutError, match="loss_mask has 3 entries.*token_ids has only 2"):
        TreeSample(
            token_ids=[8, 9], response_length=3, loss_mask=[1, 0, 1], logprobs=[-0.5, 0.0, -0.5], source_turn=[0, 0]
        )


def test_agentcore_trace_record_rejects_misaligned_logprobs():
    with pytest.raises(ValueError, match="logprobs has 1 entries.*loss_mask has 2"):
        TreeSample(token_ids=[7, 8, 9], response_length=2, loss_mask=[1, 1], logprobs=[-0.5], source_turn=[-1, 0, 0])


def test_agentcore_sample_rejects_short_provenance():
    with pytest.raises(SampleLayoutError, match="source_turn has 1 entries"):
        TreeSample(token_ids=[7, 8], response_length=1, loss_mask=[1], logprobs=[-0.5], source_turn=[0])


def test_agentcore_core_imports_without_torch():
    code = (
        "import sys, trace_tools.strategies.tree_core, trace_tools.strategies.tree; "
        "leaked = [m for m in ('torch', 'transformers', 'ray', 'aiohttp') if m in sys.modules]; "
        "assert not leaked, leaked; print('clean')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "clean" in done.stdout


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def _assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def test_agentcore_single_turn_strips_leading_prompt():
    mgr = TrajectoryManager(0)
    mgr.record_turn(
        "s",
        turn=TurnRecord([11, 12, 13], [21, 22], "stop", (-0.5, -1.5)),
        prompt_messages=[_user("hey")],
        response_message=_assistant("yo"),
    )
    (rec,) = mgr.get_trajectory("s", base_sample=BaseSample(index=3, rollout_id="episode"), reward=4.0)
    assert (rec.token_ids, rec.loss_mask, rec.logprobs) == ([11, 12, 13, 21, 22], [1, 1], [-0.5, -1.5])
    assert (rec.response_length, rec.reward, rec.rollout_id, rec.status) == (2, 4.0, "episode", "completed")
    assert rec.source_turn == [-1, -1, -1, 1, 1]  # no source given: the manager's 1-based turn index


def test_agentcore_clean_multiturn_masks_observation():
    mgr = TrajectoryManager(0)
    mgr.record_turn(
        "s",
        turn=TurnRecord([11, 12, 13], [21, 22], "stop", (-0.5, -1.5)),
        prompt_messages=[_user("hey")],
        response_message=_assistant("yo"),
    )
    mgr.record_turn(
        "s",
        turn=TurnRecord([11, 12, 13, 21, 22, 31], [23], "stop", (-2.5,)),
        prompt_messages=[_user("hey"), _assistant("yo"), _user("again")],
        response_message=_assistant("ok"),
    )
    (rec,) = mgr.get_trajectory("s", base_sample=BaseSample(index=0), reward=1.0)
    assert rec.token_ids == [11, 12, 13, 21, 22, 31, 23]
    assert rec.loss_mask == [1, 1, 0, 1] and rec.logprobs == [-0.5, -1.5, 0.0, -2.5]
    assert rec.rollout_id == 0  # falls back to the base index


def test_agentcore_fork_produces_two_samples():
    mgr = TrajectoryManager(0)
    mgr.record_turn(
        "s", turn=TurnRecord([11, 12], [90]), prompt_messages=[_user("p")], response_message=_assistant("x")
    )
    mgr.record_turn(
        "s", turn=TurnRecord([13, 14], [91]), prompt_messages=[_user("q")], response_message=_assistant("y")
    )
    recs = mgr.get_trajectory("s", base_sample=BaseSample(), reward=0.5)
    assert [r.reward for r in recs] == [0.5, 0.5]


def _drift_session(threshold: int | None, first_len: int, rewrite: bool):
    mgr = TrajectoryManager(threshold)
    first = TurnRecord([11, 12], [90] * first_len, "stop", (-0.5,) * first_len)
    second = TurnRecord([11, 12, 80, 13], [70], "stop", (-0.25,))
    mgr.record_turn("s", turn=first, prompt_messages=[_user("q")], response_message=_assistant("a"))
    mgr.record_turn(
        "s",
        turn=second,
        prompt_messages=[_user("q"), _assistant("edited" if rewrite else "a"), _user("more")],
        response_message=_assistant("b"),
    )
    return mgr.get_trajectory("s", base_sample=BaseSample(rollout_id="ep"), reward=1.0), first, second


@pytest.mark.parametrize("rewrite", [False, True], ids=["token-drift", "message-rewrite"])
@pytest.mark.parametrize("first_len", [2, 1500])
def test_agentcore_drift_preserves_both_generations(rewrite, first_len):
    recs, first, second = _drift_session(0, first_len, rewrite)
    assert len(recs) == 2
    for rec, turn in zip(recs, [first, second]):
        assert rec.token_ids == list(turn.prompt_ids) + list(turn.output_ids)
        assert rec.loss_mask == [1] * len(turn.output_ids)
        assert rec.logprobs == list(turn.output_log_probs)
        assert (rec.reward, rec.rollout_id) == (1.0, "ep")


def test_agentcore_drift_at_slime_default_gives_1_1_1_2():
    """A probe of upstream (docs/upstream_tree.md#parameters--upstream-variants): slime at 1024 REALIGNs or merges where agentcore now forks."""
    counts = [len(_drift_session(None, first_len, rewrite)[0]) for rewrite in (False, True) for first_len in (2, 1500)]
    assert counts == [1, 1, 1, 2]


def test_agentcore_truncated_metadata_from_length_finish():
    mgr = TrajectoryManager(0)
    mgr.record_turn(
        "s", turn=TurnRecord([11], [21, 22], "length"), prompt_messages=[_user("hi")], response_message=_assistant("a")
    )
    assert mgr.get_trajectory("s", base_sample=BaseSample())[0].metadata["truncated"] is True


def test_agentcore_get_trajectory_consumes_session():
    mgr = TrajectoryManager(0)
    mgr.record_turn("s", turn=TurnRecord([11], [21]), prompt_messages=[_user("hi")], response_message=_assistant("a"))
    assert mgr.has_session("s")
    assert len(mgr.get_trajectory("s", base_sample=BaseSample())) == 1
    assert not mgr.has_session("s")
    assert mgr.get_trajectory("s", base_sample=BaseSample()) == []


def test_agentcore_ill_formed_propagates_to_metadata():
    mgr = TrajectoryManager(0)
    mgr.record_turn(
        "s",
        turn=TurnRecord([11], [21], ill_formed=True),
        prompt_messages=[_user("hi")],
        response_message=_assistant("a"),
    )
    metadata = mgr.get_trajectory("s", base_sample=BaseSample())[0].metadata
    assert metadata == {"truncated": False, "use_tool": False, "ill_formed": True}
