"""Echo equivalence of the checkpoint tree: every cosmetic replay rewrite is looked past, no
genuine change is."""

from __future__ import annotations

import copy
import json

import pytest

from checkpoint_fakes import TOOLS
from trace_tools.strategies.checkpoint_core import ECHO, EQUAL, message_match
from trace_tools.strategies.restore_core import tool_defaults

DEFAULTS = tool_defaults(TOOLS)


def held_patch() -> dict:
    """What the tree stored for a generated Patch call (canonical form, model's key order)."""
    return {
        "role": "assistant",
        "content": "Swapping the comparison.",
        "reasoning_content": "The boil check uses >= where it needs >.",
        "tool_calls": [
            {
                "type": "function",
                "function": {
                    "name": "Patch",
                    "arguments": {
                        "path": "fw/boil.c",
                        "find": "if (t >= 100)   \n  return 1;",
                        "put": "if (t > 100) {\n  return 1;\n}",
                    },
                },
            }
        ],
    }


def rewritten(**changes) -> dict:
    message = held_patch()
    for key, value in changes.items():
        if value is None:
            message.pop(key, None)
        else:
            message[key] = value
    return message


def with_arguments(arguments: dict, name: str = "Patch") -> dict:
    message = held_patch()
    message["tool_calls"] = [{"type": "function", "function": {"name": name, "arguments": arguments}}]
    return message


ARGS = held_patch()["tool_calls"][0]["function"]["arguments"]


def test_identical_messages_are_equal_not_echoes():
    assert message_match(held_patch(), held_patch(), DEFAULTS) == EQUAL


@pytest.mark.parametrize(
    "incoming",
    [
        pytest.param(with_arguments({**ARGS, "everywhere": False}), id="schema-default-filled"),
        pytest.param(with_arguments({**ARGS, "find": "if (t >= 100)\n  return 1;"}), id="per-line-rstrip"),
        pytest.param(rewritten(reasoning_content=None), id="reasoning-dropped"),
        pytest.param(rewritten(reasoning_content=""), id="reasoning-empty"),
        pytest.param(
            {**rewritten(reasoning_content=None), "reasoning": held_patch()["reasoning_content"]},
            id="reasoning-rekeyed",
        ),
        pytest.param(
            {**rewritten(reasoning_content=None), "thinking": held_patch()["reasoning_content"]},
            id="reasoning-as-thinking",
        ),
        pytest.param(
            rewritten(
                reasoning_content=None,
                content="<think>\nThe boil check uses >= where it needs >.\n</think>\n\nSwapping the comparison.",
            ),
            id="reasoning-inlined",
        ),
        pytest.param(rewritten(content="Swapping the comparison.   \n"), id="content-trailing-space"),
    ],
)
def test_cosmetic_rewrites_are_recognised(incoming):
    assert message_match(held_patch(), incoming, DEFAULTS) == ECHO


def test_reordered_argument_keys_are_plain_dict_equality():
    # Python dicts compare without order; the tree keeps its own spelling for rendering anyway.
    assert message_match(held_patch(), with_arguments(dict(reversed(list(ARGS.items())))), DEFAULTS) == EQUAL


def test_wire_form_with_ids_index_and_string_arguments_is_recognised():
    wire = held_patch()
    compact = json.dumps({**ARGS, "everywhere": False}, sort_keys=True, separators=(",", ":"))
    wire["tool_calls"] = [
        {"id": "call_Zq81", "index": 3, "type": "function", "function": {"name": "Patch", "arguments": compact}}
    ]
    assert message_match(held_patch(), wire, DEFAULTS) == ECHO


def test_rstrip_reaches_nested_strings():
    held = with_arguments({"path": "fw/x.c", "edits": [{"find": "a = 1;", "put": "a = 2;"}]})
    incoming = with_arguments({"path": "fw/x.c", "edits": [{"find": "a = 1;  ", "put": "a = 2;\t"}]})
    assert message_match(held, incoming, DEFAULTS) == ECHO


@pytest.mark.parametrize(
    "incoming",
    [
        pytest.param(rewritten(content="Swapping the comparison, and the timer."), id="different-content"),
        pytest.param(with_arguments({**ARGS, "put": "if (t > 99) {\n  return 1;\n}"}), id="different-argument"),
        pytest.param(with_arguments({**ARGS, "everywhere": True}), id="non-default-filled"),
        pytest.param(with_arguments({**ARGS, "everywhere": 0}), id="bool-identity"),
        pytest.param(with_arguments({**ARGS, "find": "  if (t >= 100)\n  return 1;"}), id="leading-whitespace"),
        pytest.param(with_arguments({**ARGS, "path": "fw/heater.c"}), id="different-file"),
        pytest.param(with_arguments(ARGS, name="Write"), id="different-tool"),
        pytest.param(rewritten(reasoning_content="A different line of thought."), id="different-reasoning"),
        pytest.param(rewritten(tool_calls=None), id="call-dropped"),
        pytest.param(rewritten(name="helper"), id="extra-key"),
    ],
)
def test_genuine_changes_are_not_echoes(incoming):
    assert message_match(held_patch(), incoming, DEFAULTS) is None


def test_an_extra_call_is_a_different_message():
    incoming = held_patch()
    incoming["tool_calls"] = incoming["tool_calls"] * 2
    assert message_match(held_patch(), incoming, DEFAULTS) is None


def test_defaults_need_the_schema():
    incoming = with_arguments({**ARGS, "everywhere": False})
    assert message_match(held_patch(), incoming, {}) is None
    assert message_match(held_patch(), incoming, DEFAULTS) == ECHO


def test_echo_rules_off_means_dict_equality():
    reordered = with_arguments(dict(reversed(list(ARGS.items()))))
    assert message_match(held_patch(), reordered, DEFAULTS, echo_rules=False) == EQUAL  # dicts are equal
    assert message_match(held_patch(), rewritten(reasoning_content=None), DEFAULTS, echo_rules=False) is None


def test_non_assistant_messages_match_exactly_except_tool_call_ids():
    result = {"role": "tool", "content": "1 passed", "tool_call_id": "call_a"}
    assert message_match(result, {**result, "tool_call_id": "call_b"}) == EQUAL
    assert message_match(result, {**result, "content": "1 passed "}) is None
    question = {"role": "user", "content": "Fix the kettle."}
    assert message_match(question, {"role": "user", "content": "Fix the kettle. "}) is None
    assert message_match(question, {"role": "system", "content": "Fix the kettle."}) is None


def test_matching_never_mutates_its_inputs():
    held, incoming = held_patch(), with_arguments({**ARGS, "everywhere": False})
    before = copy.deepcopy((held, incoming))
    message_match(held, incoming, DEFAULTS)
    assert (held, incoming) == before
