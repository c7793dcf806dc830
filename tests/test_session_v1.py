"""miles v1 (LinearTrajectory): every row of the decision matrix (docs/upstream_session.md#case--test-map), commit, and the
`session-v1` strategy on toy sessions."""

from __future__ import annotations

import pytest

from session_fakes import (
    IM_END,
    NEWLINE,
    TOY,
    ToyRenderer,
    assistant,
    call,
    conversation,
    make_turn,
    session_of,
    tool,
    user,
)
from trace_tools.data import Session
from trace_tools.strategies.base import ReplayContext
from trace_tools.strategies.registry import get_strategy
from trace_tools.strategies.session_core.errors import ServerError
from trace_tools.strategies.session_core.recording import request_from_turn
from trace_tools.strategies.session_core.records import Generation
from trace_tools.strategies.session_core.tito import FAMILIES, TitoTokenizer
from trace_tools.strategies.session_core.v1 import LinearTrajectory, replay_v1

U1, U_OTHER = user("fix the failing test"), user("write a haiku")
A1 = assistant("", call("Read", '{"path":"t.py"}', call_id="r1"))
T1, T1_ALT = tool("def test(): ...", "r1"), tool("permission denied", "r1")
A2 = assistant("", call("Edit", '{"path":"t.py","new":"x"}', call_id="e1"))
T2 = tool("edited", "e1")
A3 = assistant("all green")
NEW = assistant("retrying")
GP = TOY.encode("<|im_start|>assistant\n")


def run(*pairs):
    """Replay (request, response) pairs through v1 on the toy Qwen-family renderer."""
    session = conversation(list(pairs))
    tito = TitoTokenizer(ToyRenderer(), FAMILIES["qwen3"])
    state, outcomes = replay_v1([request_from_turn(t) for t in session.turns], tito)
    return state, outcomes, tito


def stored_two():  # [U1, a1, T1, a2], checkpoint ends [2, 4]
    return [([U1], A1), ([U1, A1, T1], A2)]


def test_row_extend():
    state, outcomes, tito = run(*stored_two(), ([U1, A1, T1, A2, T2], A3))
    assert [o.status for o in outcomes] == ["ok"] * 3 and not outcomes[2].rolled_back
    assert len(state.records) == 3 and state.message_ends == [2, 4, 6]
    assert outcomes[2].prompt_ids == tito.full_render([U1, A1, T1, A2, T2], None)


def test_row_exact_resend_generates_again_after_boundary_and_generation_prompt():
    state, outcomes, _ = run(*stored_two(), ([U1, A1, T1, A2], NEW))
    checkpoint = state.checkpoints[1]
    assert outcomes[2].prompt_ids == checkpoint + [NEWLINE] + GP
    assert len(state.records) == 3 and state.message_ends == [2, 4, 5]


@pytest.mark.parametrize("last_tool", [T1, T1_ALT], ids=["pure_drop", "divergent"])
def test_row_one_step_back_rolls_back_and_regenerates(last_tool):
    state, outcomes, tito = run(*stored_two(), ([U1, A1, last_tool], NEW))
    assert outcomes[2].status == "ok" and outcomes[2].rolled_back == [1]
    assert [r.turn_index for r in state.records] == [0, 2]
    assert state.messages == [U1, A1, last_tool, NEW]
    suffix = tito.renderer.encode(f"<|im_start|>tool\n{last_tool['content']}<|im_end|>\n") + GP
    assert outcomes[2].prompt_ids == state.checkpoints[0] + [NEWLINE] + suffix


def test_row_two_steps_back_is_rejected_with_state_unchanged():
    pairs = [*stored_two(), ([U1, A1, T1, A2, T2], A3)]
    state, _, _ = run(*pairs)
    before = (list(state.messages), [r.turn_index for r in state.records], list(state.message_ends))
    state2, outcomes, _ = run(*pairs, ([U1, A1, T1_ALT], NEW))
    assert outcomes[3].status == "rejected"
    assert outcomes[3].detail == (
        "rollback failed: discard_count=2 exceeds max_assistant_rollback_steps=1 "
        "(stored has 6 messages, request has 3 messages)"
    )
    assert (state2.messages, [r.turn_index for r in state2.records], state2.message_ends) == before


@pytest.mark.parametrize("request_", [[U1], [U_OTHER]], ids=["shorter", "different_opening"])
def test_row_single_generation_rolls_back_to_empty_and_full_renders(request_):
    state, outcomes, tito = run(([U1], A1), (request_, NEW))
    assert outcomes[1].rolled_back == [0] and outcomes[1].placement == "full_render"
    assert outcomes[1].prompt_ids == tito.full_render(request_, None)
    assert [r.turn_index for r in state.records] == [1] and state.messages == request_ + [NEW]


def test_row_different_opening_after_two_generations_is_rejected():
    state, outcomes, _ = run(*stored_two(), ([U_OTHER], NEW))
    assert outcomes[2].status == "rejected" and "discard_count=2" in outcomes[2].detail
    assert len(state.records) == 2


def test_row_failed_first_turn_then_a_different_first_request_is_accepted():
    broken = [user("q"), assistant("", call("Read", "{not json")), user("go")]
    state, outcomes, _ = run((broken, A1), ([U_OTHER], NEW))
    assert outcomes[0].status == "failed" and outcomes[1].status == "ok"
    assert [r.turn_index for r in state.records] == [1] and not outcomes[1].rolled_back


def test_row_few_shot_assistant_is_not_an_anchor():
    shot_q, shot_a, question = user("2+2?"), assistant("4"), user("3+3?")
    a1 = assistant("", call("Calc", '{"e":"3+3"}', call_id="c"))
    t1, t1_alt = tool("6", "c"), tool("error", "c")
    state, outcomes, _ = run(([shot_q, shot_a, question], a1), ([shot_q, shot_a, question, a1, t1], A2))
    assert state.message_ends == [4, 6]
    state, outcomes, _ = run(
        ([shot_q, shot_a, question], a1),
        ([shot_q, shot_a, question, a1, t1], A2),
        ([shot_q, shot_a, question, a1, t1_alt], NEW),
    )
    assert outcomes[2].status == "ok" and outcomes[2].rolled_back == [1]
    assert state.message_ends == [4, 6]


def test_row_disallowed_role_is_rejected_after_the_rollback_took_effect():
    developer = {"role": "developer", "content": "be brief"}
    state, outcomes, _ = run(*stored_two(), ([U1, A1, T1_ALT, developer], NEW))
    assert outcomes[2].status == "rejected"
    assert outcomes[2].detail.endswith("the selected TITO fixed template does not support appending this role")
    assert outcomes[2].rolled_back == [1]
    assert state.messages == [U1, A1] and [r.turn_index for r in state.records] == [0]


def test_rollback_side_effect_persists_into_the_next_request():
    developer = {"role": "developer", "content": "be brief"}
    state, outcomes, _ = run(*stored_two(), ([U1, A1, T1_ALT, developer], NEW), ([U1, A1, T1, A2, T2], A3))
    assert outcomes[3].status == "ok" and not outcomes[3].rolled_back
    # a2 is now carried as context inside turn 3's prompt, not a checkpoint of its own
    assert [r.turn_index for r in state.records] == [0, 3] and state.message_ends == [2, 6]


def test_qwen35_family_refuses_a_mid_session_system_message():
    session = conversation([([U1], A1), ([U1, A1, {"role": "system", "content": "note"}], A2)])
    tito = TitoTokenizer(ToyRenderer(), FAMILIES["qwen35"])
    _, outcomes = replay_v1([request_from_turn(t) for t in session.turns], tito)
    assert outcomes[1].status == "rejected" and "role='system'" in outcomes[1].detail


def test_commit_checks_the_prefix_up_to_max_trim():
    state = LinearTrajectory()
    gen = Generation([7, IM_END], [0.0, 0.0], "stop", A1)
    state.commit([U1], [5, 6], 0, gen, 0)
    with pytest.raises(ServerError, match="prefix mismatch"):
        state.commit([U1, A1, T1], [5, 6, 7, 99, 8], 1, gen, 0)
    state.commit([U1, A1, T1], [5, 6, 7, 99, 8], 1, gen, 1)  # the last checkpoint token may differ
    assert len(state.records) == 2


# -- the strategy --------------------------------------------------------------------------------
def replay(session: Session, renderer=None, **params):
    ctx = ReplayContext(renderer=renderer or ToyRenderer(), params=params)
    return get_strategy("session-v1")(ctx).replay(session)


def test_strategy_byte_exact_session_trains_every_token_once():
    pairs = [*stored_two(), ([U1, A1, T1, A2, T2], A3)]
    full = [TOY.render(req, None) for req, _ in pairs]
    session = session_of(
        *(make_turn(i, req, resp, prompt_ids=full[i], reward=1.5) for i, (req, resp) in enumerate(pairs))
    )
    result = replay(session)
    assert len(result.samples) == 1
    sample = result.samples[0]
    response = sample.source_turn[-sample.response_length :]
    for turn in session.turns:
        positions = [i for i, s in enumerate(response) if s == turn.turn_index]
        assert len(positions) == len(turn.output_ids)
        assert all(sample.loss_mask[i] == 1 for i in positions)
        assert [sample.logprobs[i] for i in positions] == turn.output_logprobs
    assert sum(sample.loss_mask) == sum(len(t.output_ids) for t in session.turns)
    assert sample.token_ids[: len(full[0])] == full[0]
    assert sample.reward == 1.5
    assert set(result.prompt_events.values()) == {"clean"} and not result.turn_events
    assert result.counters["rollbacks"] == 0 and result.counters["rejected_requests"] == 0


def test_strategy_marks_prompts_that_differ_from_the_recorded_ones():
    session = conversation(stored_two())
    session.turns[1].prompt_ids = TOY.render([U1, A1, T1], None)[:5] + [99999]
    result = replay(session)
    assert result.prompt_events == {0: "clean", 1: "rendered"}
    assert result.drift_positions == {1: 5}


def test_strategy_retry_rolls_back_one_generation():
    session = conversation([*stored_two(), ([U1, A1, T1_ALT], NEW)])
    result = replay(session)
    assert result.turn_events == {1: "rolled_back"} and result.prompt_events[2] == "rolled_back"
    assert result.counters["rollbacks"] == 1
    assert result.counters["rollback_dropped_tokens"] == len(session.turns[1].output_ids)
    assert len(result.samples) == 1 and 1 not in result.samples[0].source_turn


def test_strategy_counts_rejections_and_server_errors():
    # a carried assistant whose arguments are not JSON fails the suffix render (a 500)
    broken = [U1, A1, T1, A2, T2, A3, user("q"), assistant("", call("Read", "{bad")), user("go")]
    session = conversation([*stored_two(), ([U1, A1, T1, A2, T2], A3), ([U1, A1, T1_ALT], NEW), (broken, NEW)])
    result = replay(session)
    assert result.turn_events[3] == "rejected" and result.prompt_events[3] == "rejected"
    assert result.turn_events[4] == "failed" and result.prompt_events[4] == "failed"
    assert result.counters["rejected_requests"] == 1 and result.counters["server_errors"] == 1
    assert len(result.samples) == 1  # v1 always assembles one sample from what was stored


@pytest.mark.parametrize("matcher,rollbacks", [("strict", 1), ("loose_tool_call", 0), ("role_content_only", 0)])
def test_strategy_matcher_decides_whether_a_reserialized_echo_rolls_back(matcher, rollbacks):
    echoed = assistant("", call("Read", '{"path": "t.py"}', call_id="r1"))  # spaces added by the client
    session = conversation([([U1], A1), ([U1, echoed, T1], A2), ([U1, echoed, T1, A2, T2], A3)])
    result = replay(session, matcher=matcher)
    assert result.counters["rollbacks"] == rollbacks
    assert (result.turn_events.get(0) == "rolled_back") == bool(rollbacks)


def test_strategy_ignores_the_streaming_index_but_not_a_renamed_id():
    served = assistant("", call("Read", '{"path":"t.py"}', call_id="r1", index=0))
    renamed = assistant("", call("Read", '{"path":"t.py"}', call_id="zz"))
    ok = replay(conversation([([U1], served), ([U1, A1, T1], A2)]))
    assert ok.counters["rollbacks"] == 0
    assert replay(conversation([([U1], A1), ([U1, renamed, T1], A2)])).counters["rollbacks"] == 1


def test_strategy_rejects_a_conflicting_fixed_kwarg():
    session = conversation(stored_two())
    session.turns[1].chat_template_kwargs = {"clear_thinking": True}
    result = replay(session)
    assert result.turn_events == {1: "rejected"} and result.counters["rejected_requests"] == 1


def test_strategy_truncates_to_max_seq_len():
    session = conversation([*stored_two(), ([U1, A1, T1, A2, T2], A3)])
    full = replay(session).samples[0]
    cut = replay(session, max_seq_len=len(full.token_ids) - 3).samples[0]
    assert cut.token_ids == full.token_ids[:-3] and cut.metadata["status"] == "truncated"
    assert sum(cut.loss_mask) == sum(full.loss_mask) - 3


def test_stored_assistant_is_the_response_with_empty_content_for_null():
    served = assistant(None, call("Read", '{"path":"t.py"}', call_id="r1"), reasoning="look first")
    session = conversation(
        [
            ([U1], served),
            ([U1, assistant("", call("Read", '{"path":"t.py"}', call_id="r1"), reasoning="look first"), T1], A2),
        ]
    )
    state, outcomes = replay_v1(
        [request_from_turn(t) for t in session.turns], TitoTokenizer(ToyRenderer(), FAMILIES["qwen3"])
    )
    assert state.messages[1] == {**served, "content": ""}
    assert session.turns[0].response["content"] is None  # the recording is not modified
    assert not outcomes[1].rolled_back
    assert replay(session).counters["rollbacks"] == 0
