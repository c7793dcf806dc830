"""slime PR #2282's restore cases 3_9–3_14, in our own words and data.

A small gateway drives the real tree manager the way the adapter does: restore the incoming
messages, render the prompt from them with the toy renderer, "generate" (the served ids are the
toy rendering of the response body plus the closer, so a byte-exact echo re-renders to exactly
what was served), and record the turn. Each scenario also runs with restore switched off, to show
the assertion depends on the restore.
"""

from __future__ import annotations

import copy

import pytest

from test_linear_fakes import FakeRenderer, assistant, system, tool_result, user
from trace_tools.strategies.restore_core import (
    drop_schema_defaults,
    is_same_tool_call_echo,
    restore_walk,
    strip_trailing_ws,
    tool_defaults,
)
from trace_tools.strategies.tree_core import BaseSample, TrajectoryManager, TurnRecord


def schema(name: str, **properties) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": properties}}}


EDIT = schema(
    "Edit",
    file_path={"type": "string"},
    old_string={"type": "string"},
    new_string={"type": "string"},
    replace_all={"type": "boolean", "default": False},
)
WRITE = schema("Write", file_path={"type": "string"}, content={"type": "string"})
FETCH = schema("Fetch", url={"type": "string"}, follow_redirects={"type": "boolean", "default": True})
MULTI = schema("MultiEdit", file_path={"type": "string"}, edits={"type": "array"})
TOOLS = [EDIT, WRITE, FETCH, MULTI]

# What the model generated (note the trailing blanks inside the code payloads).
EDIT_ARGS = {
    "file_path": "pkg/mod.py",
    "old_string": "def area(r):  \n    return 3 * r",
    "new_string": "def area(r):\n    return math.pi * r * r   ",
}
WRITE_ARGS = {"file_path": "notes.txt", "content": "first line   \nsecond line\t\n"}


def harness_echo(name: str, args: dict, **filled) -> dict:
    """What a Claude-Code-like harness sends back: defaults filled in, every line right-stripped."""
    return assistant("", (name, {**strip_trailing_ws(args), **filled}))


class Gateway:
    """slime's adapter path for one session: restore → render → generate → record."""

    def __init__(self, *, restore: bool = True, tools=TOOLS, fork_threshold: int = 1024):
        self.manager, self.renderer = TrajectoryManager(fork_threshold), FakeRenderer()
        self.restore, self.tools, self.outputs = restore, tools, []

    def turn(self, messages: list[dict], response: dict) -> list[dict]:
        if self.restore:
            messages = restore_walk(self.manager, "s", messages, self.tools).messages
        prompt = self.renderer.render(messages, self.tools, True)
        output = self.renderer.render([response], None, False)[1:]  # body + closer: the served ids
        logprobs = [-0.01 * (len(self.outputs) + 1)] * len(output)
        self.outputs.append(output)
        self.manager.record_turn(
            "s", turn=TurnRecord(prompt, output, "stop", logprobs), prompt_messages=messages, response_message=response
        )
        return messages

    def samples(self):
        return self.manager.get_trajectory("s", base_sample=BaseSample(), reward=1.0)

    def trained(self) -> int:
        return sum(sum(s.loss_mask) for s in self.samples())


def opening() -> list[dict]:
    return [system("You edit code."), user("Use pi in area().")]


# -- 3_9 -----------------------------------------------------------------------------------------
def test_3_9_restored_edit_echo_keeps_the_turn_trainable():
    gateway = Gateway()
    generated = assistant("", ("Edit", EDIT_ARGS))
    gateway.turn(opening(), generated)
    incoming = opening() + [harness_echo("Edit", EDIT_ARGS, replace_all=False), tool_result("edited")]
    snapshot = copy.deepcopy(incoming)
    outcome = restore_walk(gateway.manager, "s", incoming, TOOLS)
    assert incoming == snapshot  # the caller's list is left alone
    assert outcome.messages[2] is generated  # the stored dict itself comes back
    assert all(outcome.messages[i] is incoming[i] for i in (0, 1, 3))
    assert (outcome.restored, outcome.unrecognized) == (1, 0)

    gateway.turn(incoming, assistant("Done."))
    edit_node = gateway.manager._trees["s"].children[0].children[0].children[0]
    assert edit_node.turn is not None and "merged_rewrite" not in edit_node.metadata
    samples = gateway.samples()
    assert len(samples) == 1 and len(list(gateway.manager._trees)) == 0
    assert sum(samples[0].loss_mask) == sum(map(len, gateway.outputs))


def test_3_9_control_without_restore_the_edit_turn_is_lost():
    gateway = Gateway(restore=False)
    gateway.turn(opening(), assistant("", ("Edit", EDIT_ARGS)))
    gateway.turn(
        opening() + [harness_echo("Edit", EDIT_ARGS, replace_all=False), tool_result("edited")], assistant("Done.")
    )
    assert gateway.trained() == len(gateway.outputs[1])  # only the last turn trains


# -- 3_10 ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("restore, trained_turns", [(True, (0, 1)), (False, (1,))])
def test_3_10_write_echo_differing_only_by_trailing_whitespace(restore, trained_turns):
    gateway = Gateway(restore=restore)
    gateway.turn(opening(), assistant("", ("Write", WRITE_ARGS)))
    echo = harness_echo("Write", WRITE_ARGS)
    assert echo != assistant("", ("Write", WRITE_ARGS))
    gateway.turn(opening() + [echo, tool_result("written")], assistant("Written."))
    assert gateway.trained() == sum(len(gateway.outputs[i]) for i in trained_turns)


# -- 3_11 ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, args, filled, recognised",
    [
        ("Edit", EDIT_ARGS, {"replace_all": False}, True),  # default False, filled False
        ("Edit", EDIT_ARGS, {"replace_all": True}, False),  # default False, filled True
        ("Fetch", {"url": "https://x.test/a"}, {"follow_redirects": True}, True),  # default True, filled True
        ("Fetch", {"url": "https://x.test/a"}, {"follow_redirects": False}, False),  # default True, filled False
        ("Edit", EDIT_ARGS, {"replace_all": 0}, False),  # 0 == False, but not the declared boolean
        ("Fetch", {"url": "https://x.test/a"}, {"follow_redirects": 1}, False),
    ],
)
def test_3_11_either_default_polarity(name, args, filled, recognised):
    gateway = Gateway()
    gateway.turn(opening(), assistant("", (name, args)))
    incoming = opening() + [harness_echo(name, args, **filled), tool_result("ok")]
    outcome = restore_walk(gateway.manager, "s", incoming, TOOLS)
    assert (outcome.restored, outcome.unrecognized) == ((1, 0) if recognised else (0, 1))
    assert (outcome.messages[2] is not incoming[2]) is recognised


# -- 3_12 ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, args, filled, recognised",
    [
        ("Edit", EDIT_ARGS, {"replace_all": False}, False),  # without a schema the filled default stays a difference
        ("Write", WRITE_ARGS, {}, True),  # whitespace alone is still looked past
    ],
)
def test_3_12_without_a_schema_only_whitespace_is_looked_past(name, args, filled, recognised):
    gateway = Gateway(tools=None)
    gateway.turn(opening(), assistant("", (name, args)))
    incoming = opening() + [harness_echo(name, args, **filled), tool_result("ok")]
    assert restore_walk(gateway.manager, "s", incoming, None).restored == int(recognised)
    assert restore_walk(gateway.manager, "s", incoming, TOOLS).restored == 1  # the schema is what decides


# -- 3_13 ----------------------------------------------------------------------------------------
MULTI_ARGS = {"file_path": "a.py", "edits": [{"old": "x = 1  ", "new": "x = 2"}, {"old": "y", "new": "z"}]}
REJECTIONS = {
    "different old_string": harness_echo("Edit", {**EDIT_ARGS, "old_string": "def area(d):"}, replace_all=False),
    "replace_all true": harness_echo("Edit", EDIT_ARGS, replace_all=True),
    "different file": harness_echo("Edit", {**EDIT_ARGS, "file_path": "pkg/other.py"}, replace_all=False),
    "different tool": harness_echo("Write", EDIT_ARGS),
    "no tool call": assistant("I changed area() to use pi."),
    "leading whitespace": harness_echo("Edit", {**EDIT_ARGS, "old_string": "  " + EDIT_ARGS["old_string"]}),
    "content added": {**harness_echo("Edit", EDIT_ARGS), "content": "Editing now."},
    "extra call": assistant("", ("Edit", strip_trailing_ws(EDIT_ARGS)), ("Edit", strip_trailing_ws(EDIT_ARGS))),
}


@pytest.mark.parametrize("case", sorted(REJECTIONS))
def test_3_13_restore_declines_anything_but_an_echo(case):
    gateway = Gateway()
    gateway.turn(opening(), assistant("", ("Edit", EDIT_ARGS)))
    incoming = opening() + [REJECTIONS[case], tool_result("ok")]
    outcome = restore_walk(gateway.manager, "s", incoming, TOOLS)
    assert outcome.restored == 0 and outcome.messages == incoming and outcome.unrecognized == 1


def test_3_13_the_real_echo_is_the_one_accepted():
    gateway = Gateway()
    gateway.turn(opening(), assistant("", ("Edit", EDIT_ARGS)))
    echo = harness_echo("Edit", EDIT_ARGS, replace_all=False)
    assert restore_walk(gateway.manager, "s", opening() + [echo], TOOLS).restored == 1


def test_3_13_nested_payload_change_is_declined():
    gateway = Gateway()
    gateway.turn(opening(), assistant("", ("MultiEdit", MULTI_ARGS)))
    same = harness_echo("MultiEdit", MULTI_ARGS)  # nested strings right-stripped: still the same call
    changed = harness_echo(
        "MultiEdit", {**MULTI_ARGS, "edits": [{"old": "x = 1", "new": "x = 3"}, MULTI_ARGS["edits"][1]]}
    )
    assert restore_walk(gateway.manager, "s", opening() + [same], TOOLS).restored == 1
    assert restore_walk(gateway.manager, "s", opening() + [changed], TOOLS).restored == 0


# -- 3_14 ----------------------------------------------------------------------------------------
def five_turn_session(gateway: Gateway) -> None:
    history = opening()
    calls = [
        ("Edit", EDIT_ARGS),
        ("Write", WRITE_ARGS),
        ("Fetch", {"url": "https://x.test/doc  "}),
        ("Edit", {**EDIT_ARGS, "old_string": "return 3  "}),
        ("Write", {**WRITE_ARGS, "content": "end \n"}),
    ]
    fills = [{"replace_all": False}, {}, {"follow_redirects": True}, {"replace_all": False}, {}]
    for (name, args), filled in zip(calls, fills):
        gateway.turn(history, assistant("", (name, args)))
        history = history + [harness_echo(name, args, **filled), tool_result(f"{name} ok")]


def test_3_14_restore_across_a_long_rewriting_session():
    gateway = Gateway()
    five_turn_session(gateway)
    root = gateway.manager._trees["s"]
    assert len(list(root.leaves())) == 1
    samples = gateway.samples()
    assert len(samples) == 1
    assert sum(samples[0].loss_mask) == sum(map(len, gateway.outputs))  # all five turns trained


def test_3_14_control_without_restore_turns_are_lost():
    gateway = Gateway(restore=False)
    five_turn_session(gateway)
    assert gateway.trained() == len(gateway.outputs[-1])  # every echoed turn was merged away


# -- helpers, pinned directly ----------------------------------------------------------------------
def test_tool_defaults_collects_only_declared_defaults():
    assert tool_defaults(TOOLS) == {"Edit": {"replace_all": False}, "Fetch": {"follow_redirects": True}}
    assert tool_defaults(None) == {} and tool_defaults([{"type": "function"}]) == {}


def test_drop_schema_defaults_uses_identity_for_booleans():
    defaults = {"replace_all": False, "limit": 10}
    assert drop_schema_defaults({"a": 1, "replace_all": False, "limit": 10}, defaults) == {"a": 1}
    assert drop_schema_defaults({"replace_all": 0, "limit": 10.0}, defaults) == {"replace_all": 0}
    args = {"replace_all": False}
    assert drop_schema_defaults(args, {}) is args and drop_schema_defaults("raw", defaults) == "raw"


def test_strip_trailing_ws_keeps_keys_and_leading_space():
    assert strip_trailing_ws({"k ": [" a \n b\t", 3, None]}) == {"k ": [" a\n b", 3, None]}


def test_is_same_tool_call_echo_ignores_call_ids_but_not_roles():
    held = assistant("", ("Edit", EDIT_ARGS))
    with_id = copy.deepcopy(held)
    with_id["tool_calls"][0]["id"] = "call_1"
    assert is_same_tool_call_echo(held, with_id, {})
    assert not is_same_tool_call_echo(held, {**with_id, "role": "user"}, {})
    assert not is_same_tool_call_echo(None, held, {})
