"""miles v2 (trajectory forest): attach-point properties, the v2 outcome table, drop_retries, exactly-once masking
(docs/upstream_session.md#v2-the-trajectory-forest), and the `session-v2` strategy."""

from __future__ import annotations

from collections import Counter

import pytest

from session_fakes import NEWLINE, TOY, ToyRenderer, assistant, call, conversation, tool, user
from trace_tools.strategies.base import ReplayContext
from trace_tools.strategies.registry import get_strategy
from trace_tools.strategies.session_core.matchers import strict_match
from trace_tools.strategies.session_core.recording import request_from_turn
from trace_tools.strategies.session_core.tito import FAMILIES, TitoTokenizer
from trace_tools.strategies.session_core.v2 import MAX_NODES, drop_retries, find_attach_point, replay_v2, samples_v2

U1, U_OTHER = user("rename the module"), user("summarize the log")
A1 = assistant("", call("Grep", '{"q":"mod"}', call_id="g1"))
T1, T1_ALT = tool("3 hits", "g1"), tool("timeout", "g1")
A2 = assistant("", call("Edit", '{"f":"m.py"}', call_id="e1"))
T2 = tool("saved", "e1")
A3, NEW = assistant("renamed"), assistant("let me retry")


def run(*pairs, finishes=None, max_nodes=MAX_NODES, family="qwen3"):
    session = conversation(list(pairs))
    for turn, finish in zip(session.turns, finishes or []):
        turn.finish_reason = finish
    tito = TitoTokenizer(ToyRenderer(), FAMILIES[family])
    state, outcomes = replay_v2([request_from_turn(t) for t in session.turns], tito, max_nodes=max_nodes)
    return state, outcomes, tito


def shape(state):
    """(seq, parent seq) of every node, for comparing trees."""
    return [(n.seq, n.parent.seq if n.parent else None) for n in state.tree.nodes]


# -- attach point ------------------------------------------------------------------------------------
def test_attach_point_search_is_pure():
    state, _, _ = run(([U1], A1), ([U1, A1, T1], A2), ([U1, A1, T1_ALT], NEW))
    before, leaf = shape(state), state.active_leaf
    for request in ([], [U1], [U1, A1, T1, A2, T2], [U_OTHER]):
        find_attach_point(state.tree, request, strict_match)
    assert shape(state) == before and state.active_leaf is leaf


@pytest.mark.parametrize(
    "request_",
    [[], [U_OTHER], [U1], [user("rename"), A1]],
    ids=["empty", "zero_overlap", "prefix_of_root_delta", "diverges_in_root_delta"],
)
def test_requests_that_do_not_cover_a_root_delta_make_a_new_root(request_):
    state, _, _ = run(([U1], A1))
    assert find_attach_point(state.tree, request_, strict_match).node is None


def test_divergence_inside_a_child_delta_attaches_to_its_parent():
    state, _, _ = run(([U1], A1), ([U1, A1, T1], A2))
    point = find_attach_point(state.tree, [U1, A1, T1, assistant("other")], strict_match)
    assert point.node is state.tree.roots[0] and point.matched == 2 and point.overlap == 3


def test_degenerate_resend_attaches_to_the_path_end_with_an_empty_environment_suffix():
    state, outcomes, tito = run(([U1], A1), ([U1, A1, T1], A2), ([U1, A1, T1, A2], NEW))
    resend = state.tree.nodes[2]
    assert resend.parent is state.tree.nodes[1] and resend.delta_messages == [NEW]
    assert outcomes[2].prompt_ids == state.tree.nodes[1].token_ids + [NEWLINE] + TOY.encode("<|im_start|>assistant\n")


def test_ties_go_to_the_latest_node():
    state, _, _ = run(([U1], A1), ([U1, A1, T1], A2), ([U1, A1, T1], A2))
    twins = state.tree.roots[0].children
    assert twins[0].delta_messages == twins[1].delta_messages
    assert find_attach_point(state.tree, [U1, A1, T1, A2, T2], strict_match).node is twins[1]


def test_most_messages_consumed_wins_over_depth():
    # root 0 carries four messages in one delta; root 1 -> child 2 reaches the same four in two steps
    state, _, _ = run(([U1, A1, T1, A2, T2], A3), ([U1], A1), ([U1, A1, T1], A2))
    assert [len(r.delta_messages) for r in state.tree.roots] == [6, 2]
    point = find_attach_point(state.tree, [U1, A1, T1, A2, T2, A3, user("next")], strict_match)
    assert point.node is state.tree.roots[0] and point.matched == 6
    shallow = find_attach_point(state.tree, [U1, A1, T1, A2, T1_ALT], strict_match)
    assert shallow.node is state.tree.nodes[2] and shallow.matched == 4  # a partial root delta never counts


# -- the v2 outcome table -------------------------------------------------------------------------------
@pytest.mark.parametrize("last_tool", [T1, T1_ALT], ids=["pure_drop", "divergent"])
def test_one_step_retry_becomes_a_sibling_and_the_old_leaf_is_trimmed(last_tool):
    state, outcomes, _ = run(([U1], A1), ([U1, A1, T1], A2), ([U1, A1, last_tool], NEW))
    assert outcomes[2].status == "ok" and outcomes[2].placement == "sibling"
    assert shape(state) == [(0, None), (1, 0), (2, 0)]
    assert len(state.active_leaf.path_nodes()) == 2  # GET would show two records
    kept, trimmed = samples_v2(state.tree, 0)
    assert [k.leaf.seq for k in kept] == [2] and [t.leaf.seq for t in trimmed] == [1]


def test_deep_divergence_branches_and_both_leaves_train():
    state, outcomes, _ = run(([U1], A1), ([U1, A1, T1], A2), ([U1, A1, T1, A2, T2], A3), ([U1, A1, T1_ALT], NEW))
    assert outcomes[3].status == "ok" and state.tree.nodes[3].parent is state.tree.roots[0]
    kept, trimmed = samples_v2(state.tree, 0)
    assert {k.leaf.seq for k in kept} == {2, 3} and not trimmed
    anchor_span = state.tree.roots[0].completion_span
    trained_in = [k.leaf.seq for k in kept if _trained_positions(k) & set(range(*anchor_span))]
    assert trained_in == [2]  # the shared anchor completion trains only in the earlier leaf


def test_different_opening_starts_a_new_root_and_both_roots_emit():
    state, outcomes, _ = run(([U1], A1), ([U1, A1, T1], A2), ([U_OTHER], NEW))
    assert outcomes[2].placement == "new_root" and len(state.tree.roots) == 2
    kept, _ = samples_v2(state.tree, 0)
    assert {k.path[0].seq for k in kept} == {0, 2}


def test_extending_a_length_cut_generation_is_a_409_but_rerooting_works():
    state, outcomes, _ = run(([U1], A1), ([U1, A1, T1], A2), ([U1], NEW), finishes=["length", "stop", "stop"])
    assert outcomes[1].status == "rejected" and "truncated generation" in outcomes[1].detail
    assert outcomes[2].status == "ok" and outcomes[2].placement == "new_root"
    assert shape(state) == [(0, None), (1, None)]


def test_carried_assistant_in_the_suffix_is_a_child_of_the_anchor():
    compacted = [U1, A1, T1, assistant("summary so far"), user("continue")]
    state, outcomes, tito = run(([U1], A1), (compacted, NEW))
    node = state.tree.nodes[1]
    assert outcomes[1].status == "ok" and node.parent is state.tree.roots[0]
    assert node.delta_messages == compacted[2:] + [NEW]
    assert outcomes[1].prompt_ids == tito.full_render(compacted, None)  # toy template is append-only


def test_disallowed_role_is_a_400_after_the_view_moved():
    state, outcomes, _ = run(([U1], A1), ([U1, A1, T1], A2), ([U1, A1, {"role": "developer", "content": "x"}], NEW))
    assert outcomes[2].status == "rejected" and outcomes[2].detail.endswith("appending this role")
    assert state.active_leaf is state.tree.roots[0] and len(state.tree.nodes) == 2


def test_node_cap_turns_the_next_commit_into_a_server_error():
    pairs = [([user(f"task {i}")], assistant(f"ok {i}")) for i in range(MAX_NODES + 1)]
    state, outcomes, _ = run(*pairs)
    assert len(state.tree.nodes) == MAX_NODES == 1024
    assert outcomes[-1].status == "failed" and "full" in outcomes[-1].detail
    assert all(o.status == "ok" for o in outcomes[:-1])


# -- drop_retries ------------------------------------------------------------------------------------------
def test_chained_retries_keep_only_the_last():
    retries = [([U1, A1, tool(f"attempt {i}", "g1")], assistant(f"try {i}")) for i in range(4)]
    state, _, _ = run(([U1], A1), *retries)
    kept, trimmed = drop_retries(_material(state))
    assert [k.leaf.seq for k in kept] == [4] and [t.leaf.seq for t in trimmed] == [1, 2, 3]


def test_equal_length_twins_keep_the_later():
    state, _, _ = run(([U1], A1), ([U1, A1, T1], A2), ([U1, A1, T1], A2))
    kept, trimmed = drop_retries(_material(state))
    assert [k.leaf.seq for k in kept] == [2] and [t.leaf.seq for t in trimmed] == [1]


def test_abandoned_deep_branch_survives_and_order_is_deepest_then_latest():
    state, _, _ = run(
        ([U1], A1), ([U1, A1, T1], A2), ([U1, A1, T1, A2, T2], A3), ([U1, A1, T1_ALT], NEW), ([U_OTHER], NEW)
    )
    kept, trimmed = drop_retries(_material(state))
    assert not trimmed
    assert [(len(k.path), k.leaf.seq) for k in kept] == [(3, 2), (2, 3), (1, 4)]


def test_roots_are_never_trimmed():
    state, _, _ = run(([U1], A1), ([U1], NEW))  # a pure resend of the opening: two roots
    kept, trimmed = drop_retries(_material(state))
    assert {k.leaf.seq for k in kept} == {0, 1} and not trimmed


# -- exactly-once masking ------------------------------------------------------------------------------------
FOREST = [
    ([U1], A1),
    ([U1, A1, T1], A2),
    ([U1, A1, T1, A2, T2], A3),
    ([U1, A1, T1_ALT], NEW),
    ([U1, A1, T1_ALT, NEW, user("again")], A3),
    ([U1, A1, T1, A2, T2], assistant("twin")),
    ([U_OTHER], A1),
    ([U_OTHER, A1, T1], A2),
]


@pytest.mark.parametrize("prefix", range(3, len(FOREST) + 1))
def test_every_surviving_span_trains_in_exactly_one_sample(prefix):
    state, _, _ = run(*FOREST[:prefix])
    kept, _ = samples_v2(state.tree, 0, reward=0.25)
    surviving = {n.seq: n for k in kept for n in k.path}
    owned_positions = Counter()
    for item in kept:
        trained = _trained_positions(item)
        spans = {n.seq: set(range(*n.completion_span)) for n in item.path}
        for seq, span in spans.items():
            owned_positions[seq] += bool(span & trained)
        assert trained <= set().union(*spans.values())  # every trained position lies in a span
        assert item.sample.reward == 0.25
    assert all(owned_positions[seq] == 1 for seq in surviving)


def test_masking_zeroes_only_the_loss_mask():
    state, _, _ = run(([U1], A1), ([U1, A1, T1], A2), ([U1, A1, T1, A2, T2], A3), ([U1, A1, T1_ALT], NEW))
    later = next(k for k in samples_v2(state.tree, 0)[0] if k.leaf.seq == 3)
    sample, root = later.sample, state.tree.roots[0]
    start = len(sample.token_ids) - sample.response_length
    lo, hi = root.completion_span
    assert sample.loss_mask[lo - start : hi - start] == [0] * (hi - lo)
    assert sample.logprobs[lo - start : hi - start] == root.record.generation.logprobs


def _material(state):
    from trace_tools.strategies.session_core.v2 import collect_v2

    return collect_v2(state.tree, 0)


def _trained_positions(item) -> set[int]:
    sample = item.sample
    start = len(sample.token_ids) - sample.response_length
    return {start + i for i, m in enumerate(sample.loss_mask) if m}


# -- the strategy ------------------------------------------------------------------------------------------
def replay(session, **params):
    return get_strategy("session-v2")(ReplayContext(renderer=ToyRenderer(), params=params)).replay(session)


def test_strategy_events_and_counters():
    session = conversation(
        [([U1], A1), ([U1, A1, T1], A2), ([U1, A1, T1_ALT], NEW), ([U_OTHER], A3), ([U_OTHER, A3, user("more")], A1)]
    )
    session.turns[0].reward = 3.0
    result = replay(session)
    assert result.prompt_events == {0: "clean", 1: "clean", 2: "forked", 3: "new_root", 4: "clean"}
    assert result.turn_events == {1: "trimmed"}
    assert result.counters["tree_branches"] == 2 and result.counters["trimmed_leaves"] == 1
    assert len(result.samples) == 2 and {s.reward for s in result.samples} == {3.0}
    trained = Counter(
        s
        for sample in result.samples
        for s, m in zip(sample.source_turn[-sample.response_length :], sample.loss_mask)
        if m
    )
    assert trained == {t.turn_index: len(t.output_ids) for t in session.turns if t.turn_index != 1}


def test_strategy_counts_409s_as_rejected():
    session = conversation([([U1], A1), ([U1, A1, T1], A2)])
    session.turns[0].finish_reason = "length"
    result = replay(session)
    assert result.turn_events == {1: "rejected"} and result.counters["rejected_requests"] == 1


def test_strategy_byte_exact_session_is_one_sample_fully_trained():
    pairs = [([U1], A1), ([U1, A1, T1], A2), ([U1, A1, T1, A2, T2], A3)]
    session = conversation(pairs)
    result = replay(session)
    assert len(result.samples) == 1 and result.counters["tree_branches"] == 0
    assert sum(result.samples[0].loss_mask) == sum(len(t.output_ids) for t in session.turns)


def test_branch_count_follows_the_fork_definition():
    # docs/upstream_session.md#counters: nodes whose parent already had a child, plus roots beyond the first
    state, _, _ = run(*FOREST[:7])
    by_rule = sum(1 for n in state.tree.nodes if n.parent and n.parent.children.index(n) > 0)
    assert by_rule >= 2 and len(state.tree.roots) == 2
    assert state.tree.branches == by_rule + len(state.tree.roots) - 1
