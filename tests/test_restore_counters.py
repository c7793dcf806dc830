"""What `restored_echoes` and `unrecognized_echoes` count (docs/upstream_restore_linear.md)."""

from __future__ import annotations

from test_linear_fakes import assistant, tool_result, user
from trace_tools.strategies.restore_core import restore_generated_messages, restore_walk
from trace_tools.strategies.tree_core import TrajectoryManager, TurnRecord

CALL = ("Bash", {"command": "make test  "})
ECHO = assistant("", ("Bash", {"command": "make test"}))


def manager_with(*responses: dict, prompt=None) -> TrajectoryManager:
    manager = TrajectoryManager()
    for response in responses:
        manager.record_turn(
            "s", turn=TurnRecord([1, 2], [3]), prompt_messages=prompt or [user("go")], response_message=response
        )
    return manager


def test_no_tree_returns_the_same_list_object():
    messages = [user("go"), ECHO]
    assert restore_generated_messages(TrajectoryManager(), "s", messages) is messages


def test_a_recognised_echo_counts_as_restored_only():
    outcome = restore_walk(manager_with(assistant("", CALL)), "s", [user("go"), ECHO, tool_result("ok")])
    assert (outcome.restored, outcome.unrecognized) == (1, 0)


def test_two_generated_siblings_that_both_match_are_ambiguous_and_unrecognised():
    manager = manager_with(assistant("", CALL), assistant("", CALL))  # a regeneration from the same prompt
    outcome = restore_walk(manager, "s", [user("go"), ECHO])
    assert (outcome.restored, outcome.unrecognized) == (0, 1)


def test_a_byte_exact_echo_is_neither():
    generated = assistant("", CALL)
    outcome = restore_walk(manager_with(generated), "s", [user("go"), dict(generated), tool_result("ok")])
    assert (outcome.restored, outcome.unrecognized) == (0, 0)


def test_a_stop_on_a_user_message_is_not_an_echo():
    outcome = restore_walk(manager_with(assistant("", CALL)), "s", [user("something else")])
    assert (outcome.restored, outcome.unrecognized) == (0, 0)


def test_an_assistant_where_nothing_was_generated_is_not_an_echo():
    # the foreign assistant sits under a user node that has no generated child
    manager = manager_with(assistant("", CALL))
    outcome = restore_walk(manager, "s", [user("go"), ECHO, tool_result("ok"), assistant("foreign")])
    assert (outcome.restored, outcome.unrecognized) == (1, 0)


def test_an_unrecognised_echo_is_counted_once_its_turn_is_recorded():
    manager = manager_with(assistant("", CALL))
    edited = [user("go"), assistant("", ("Bash", {"command": "make lint"})), tool_result("ok")]
    assert restore_walk(manager, "s", edited).unrecognized == 1
    manager.record_turn("s", turn=TurnRecord([1], [4]), prompt_messages=edited, response_message=assistant("x"))
    assert restore_walk(manager, "s", edited + [assistant("x"), user("more")]).unrecognized == 0
