"""The `echo-restore` strategy end to end on recorded sessions, against the plain `tree`."""

from __future__ import annotations

from test_linear_fakes import FakeRenderer, assistant, system, tool_result, user
from test_restore_pr2282 import EDIT_ARGS, TOOLS, WRITE_ARGS, harness_echo
from trace_tools.data import COUNTERS, Session, Turn
from trace_tools.replay.turnrows import trained_by_turn
from trace_tools.strategies.base import ReplayContext
from trace_tools.strategies.registry import get_strategy

RENDERER = FakeRenderer()


def served(response: dict) -> list[int]:
    """The ids the engine generated for `response`: its toy rendering after the assistant opener."""
    return RENDERER.render([response], None, False)[1:]


def rewriting_session() -> Session:
    """Edit, then Write, then a text answer; the harness re-renders both tool-call echoes."""
    opening = [system("You edit code."), user("Use pi in area().")]
    edit, write, done = assistant("", ("Edit", EDIT_ARGS)), assistant("", ("Write", WRITE_ARGS)), assistant("Done.")
    second = opening + [harness_echo("Edit", EDIT_ARGS, replace_all=False), tool_result("edited")]
    third = second + [harness_echo("Write", WRITE_ARGS), tool_result("written")]
    turns = [
        Turn(
            "rw",
            i,
            messages,
            served(response),
            tools=TOOLS,
            response=response,
            output_logprobs=[-0.5] * len(served(response)),
        )
        for i, (messages, response) in enumerate([(opening, edit), (second, write), (third, done)])
    ]
    return Session("rw", turns)


def replay(name: str, session: Session, **params):
    ctx = ReplayContext(RENDERER, prompt_source="rendered", params=params)
    return get_strategy(name)(ctx).replay(session)


def test_tree_loses_the_rewritten_turns():
    session = rewriting_session()
    result = replay("tree", session)
    assert dict(trained_by_turn(result)) == {2: len(session.turns[2].output_ids)}
    assert result.turn_events == {0: "demoted_by_merge", 1: "demoted_by_merge"}


def test_echo_restore_trains_every_turn_in_one_sample():
    session = rewriting_session()
    result = replay("echo-restore", session)
    assert len(result.samples) == 1
    assert dict(trained_by_turn(result)) == {t.turn_index: len(t.output_ids) for t in session.turns}
    assert result.prompt_events == {0: "clean", 1: "restored", 2: "restored"}
    # the Edit echo is restored in turns 1 and 2, the Write echo in turn 2
    assert (result.counters["restored_echoes"], result.counters["restored_distinct_echoes"]) == (3, 2)
    assert result.counters["unrecognized_echoes"] == 0
    assert set(COUNTERS) <= set(result.counters)


def test_unrecognised_echo_is_counted_and_the_turn_handled_by_the_tree():
    session = rewriting_session()
    session.turns[1].messages[2] = harness_echo("Edit", EDIT_ARGS, replace_all=True)  # not the declared default
    session.turns[2].messages[2] = harness_echo("Edit", EDIT_ARGS, replace_all=True)
    result = replay("echo-restore", session)
    assert (result.counters["restored_echoes"], result.counters["unrecognized_echoes"]) == (1, 1)
    assert result.turn_events.get(0) == "demoted_by_merge" and result.counters["rewrite_merges"] == 1


def test_fork_threshold_zero_keeps_both_generations_when_unrecognised():
    session = rewriting_session()
    session.turns[1].messages[2] = harness_echo("Edit", EDIT_ARGS, replace_all=True)
    session.turns[2].messages[2] = harness_echo("Edit", EDIT_ARGS, replace_all=True)
    result = replay("echo-restore", session, fork_threshold=0)
    assert result.counters["rewrite_merges"] == 0 and len(result.samples) == 2
    assert set(trained_by_turn(result)) == {0, 1, 2}


def test_a_byte_exact_session_is_untouched():
    session = rewriting_session()
    exact_echoes = {2: session.turns[0].response, 4: session.turns[1].response}  # position -> what was generated
    for turn in session.turns[1:]:
        for position, response in exact_echoes.items():
            if position < len(turn.messages):
                turn.messages[position] = response
    result = replay("echo-restore", session)
    assert result.counters["restored_echoes"] == 0 and len(result.samples) == 1
    assert set(result.prompt_events.values()) == {"clean"}


def test_echo_restore_is_counterfactual():
    assert get_strategy("echo-restore").counterfactual is True
