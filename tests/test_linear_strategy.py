"""The `linear` and `linear+restore` strategies end to end on recorded sessions."""

from __future__ import annotations

import pytest

from test_linear_fakes import SERVED_BASE, FakeRenderer, assistant, tool_result, user
from test_restore_pr2282 import EDIT_ARGS, TOOLS, harness_echo
from trace_tools.data import Session, Turn
from trace_tools.errors import ReplayError, TraceToolsError
from trace_tools.replay.turnrows import trained_by_turn
from trace_tools.strategies.base import ReplayContext
from trace_tools.strategies.linear_core import NonlinearHistory
from trace_tools.strategies.registry import get_strategy


def session_of(steps, sid="lin") -> Session:
    """steps: (messages, response, output length); served ids come from the 9000s (never a re-render)."""
    turns, next_id = [], SERVED_BASE
    for index, (messages, response, length) in enumerate(steps):
        output = list(range(next_id, next_id + length))
        next_id += length
        turns.append(
            Turn(
                sid,
                index,
                messages,
                output,
                tools=TOOLS,
                response=response,
                output_logprobs=[-0.25] * length,
                chat_template_kwargs={"enable_thinking": False},
            )
        )
    return Session(sid, turns)


def append_only(echo_edit=None) -> Session:
    edit = assistant("", ("Edit", EDIT_ARGS))
    first = [user("use pi")]
    second = first + [echo_edit or edit, tool_result("edited")]
    third = second + [assistant("checking"), user("now run the tests")]
    return session_of([(first, edit, 4), (second, assistant("checking"), 2), (third, assistant("ok"), 3)])


def replay(name: str, session: Session, **params):
    return get_strategy(name)(ReplayContext(FakeRenderer(), params=params)).replay(session)


def test_tree_forks_on_served_ids_that_never_re_render():
    assert len(replay("tree", append_only(), fork_threshold=0).samples) == 3


@pytest.mark.parametrize("delta", [True, False, "false"])
def test_linear_keeps_an_append_only_session_in_one_sample(delta):
    session = append_only()
    result = replay("linear", session, fork_threshold=0, delta=delta)
    assert len(result.samples) == 1
    assert dict(trained_by_turn(result)) == {t.turn_index: len(t.output_ids) for t in session.turns}
    assert result.prompt_events == {0: "rendered", 1: "healed", 2: "healed"}
    counters = result.counters
    assert (counters["healed_turns"], counters["nonlinear"], counters["resets"], counters["drift_fork"]) == (2, 0, 0, 0)
    assert result.samples[0].metadata["linear_healer"]["healed_turns"] == 2


def test_linear_resets_on_a_rewritten_edit_echo_and_restore_rescues_it():
    session = append_only(echo_edit=harness_echo("Edit", EDIT_ARGS, replace_all=False))
    linear = replay("linear", session, fork_threshold=0)
    assert linear.prompt_events[1] == "reset" and (linear.counters["nonlinear"], linear.counters["resets"]) == (1, 1)
    assert len(linear.samples) == 2

    combined = replay("linear+restore", session, fork_threshold=0)
    assert len(combined.samples) == 1 and combined.counters["nonlinear"] == 0
    assert (combined.counters["restored_echoes"], combined.counters["healed_turns"]) == (2, 2)
    assert combined.prompt_events == {0: "rendered", 1: "healed", 2: "healed"}


def test_error_mode_fails_the_session_with_a_replay_error():
    session = append_only(echo_edit=harness_echo("Edit", EDIT_ARGS, replace_all=False))
    with pytest.raises(NonlinearHistory, match="append-only") as info:
        replay("linear", session, on_nonlinear="error")
    assert isinstance(info.value, ReplayError)


def test_passthrough_turns_are_plain_renders_and_the_trees_fork_shows():
    session = append_only(echo_edit=harness_echo("Edit", EDIT_ARGS, replace_all=False))
    result = replay("linear", session, on_nonlinear="passthrough", fork_threshold=0)
    # turn 1 opens a new branch of the message tree (its echo differs), turn 2 re-renders the
    # served "checking" reply and forks at the token level
    assert result.prompt_events == {0: "rendered", 1: "rendered", 2: "forked"}
    assert (result.counters["nonlinear"], result.counters["resets"], result.counters["healed_turns"]) == (1, 0, 0)


@pytest.mark.parametrize("params", [{"on_nonlinear": "skip"}, {"delta": "maybe"}])
def test_bad_options_name_the_choices(params):
    with pytest.raises(TraceToolsError, match="choose one of"):
        replay("linear", append_only(), **params)


def test_needs_a_renderer():
    with pytest.raises(ReplayError, match="--tokenizer"):
        get_strategy("linear")(ReplayContext(None)).replay(append_only())


def test_both_are_registered_as_counterfactual():
    assert get_strategy("linear").counterfactual and get_strategy("linear+restore").counterfactual
