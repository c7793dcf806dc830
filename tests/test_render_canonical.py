"""Canonicalization policies: one test per rule of each gateway's translate step."""

from __future__ import annotations

import copy

import pytest

from trace_tools.errors import UnknownName
from trace_tools.render.canonical import POLICIES, canonicalize_messages, canonicalize_response, flatten_content

WIRE_ASSISTANT = {
    "role": "assistant",
    "content": None,
    "reasoning_content": "",
    "name": "agent",
    "tool_calls": [
        {
            "id": "call_a1",
            "index": 0,
            "type": "function",
            "function": {"name": "Edit", "arguments": '{"file_path": "a.py", "replace_all": false}'},
        },
        {"id": "call_a2", "index": 1, "type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}},
    ],
}


def slime(messages):
    return canonicalize_messages(messages, "slime")


def test_policies_are_named_and_slime_is_default():
    assert set(POLICIES) == {"slime", "none", "uniagent", "miles"}
    messages = [{"role": "developer", "content": "be brief"}]
    assert canonicalize_messages(messages) == slime(messages)
    with pytest.raises(UnknownName, match="slime"):
        canonicalize_messages(messages, "vllm")


def test_slime_developer_becomes_system_and_extra_keys_go():
    out = slime(
        [
            {"role": "developer", "content": "rules", "name": "ops"},
            {"role": "user", "content": "hi", "name": "bob", "cache_control": {"type": "ephemeral"}},
        ]
    )
    assert out == [{"role": "system", "content": "rules"}, {"role": "user", "content": "hi"}]


def test_slime_tool_message_drops_tool_call_id():
    assert slime([{"role": "tool", "tool_call_id": "call_a1", "name": "Bash", "content": "ok"}]) == [
        {"role": "tool", "content": "ok"}
    ]


def test_slime_flattens_content_parts():
    parts = [
        {"type": "text", "text": "first"},
        {"type": "image_url", "image_url": {"url": "x"}},
        {"type": "input_text", "text": ""},
        "bare",
        {"type": "output_text", "text": "last"},
    ]
    assert slime([{"role": "user", "content": parts}])[0]["content"] == "first\n[image omitted]\nbare\nlast"
    assert flatten_content(None) == "" and flatten_content(7) == "7"
    assert flatten_content([{"type": "tool_result", "content": [{"type": "text", "text": "nested"}]}]) == "nested"


def test_slime_assistant_keeps_every_call_with_dict_arguments_and_no_ids():
    [out] = slime([WIRE_ASSISTANT])
    assert out == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "Edit", "arguments": {"file_path": "a.py", "replace_all": False}},
            },
            {"type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}},
        ],
    }


def test_slime_reasoning_kept_only_when_truthy():
    assert "reasoning_content" not in slime([{"role": "assistant", "content": "x", "reasoning_content": ""}])[0]
    assert "reasoning_content" not in slime([{"role": "assistant", "content": "x", "reasoning_content": None}])[0]
    assert slime([{"role": "assistant", "content": "x", "reasoning_content": "why"}])[0]["reasoning_content"] == "why"


@pytest.mark.parametrize(
    "arguments, expected",
    [
        ('{"a": 1}', {"a": 1}),
        ('{"a": 1', {"_raw_arguments": '{"a": 1'}),
        ("[1, 2]", {"_raw_arguments": "[1, 2]"}),
        ('"text"', {"_raw_arguments": '"text"'}),
        ([1, 2], {"_raw_arguments": [1, 2]}),
        (None, {}),
    ],
)
def test_slime_argument_parsing(arguments, expected):
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": arguments}}],
    }
    assert slime([message])[0]["tool_calls"][0]["function"]["arguments"] == expected


def test_slime_drops_unknown_roles_and_non_dicts_and_empty_call_lists():
    out = slime(
        [
            {"role": "function", "content": "legacy"},
            "junk",
            {"content": "no role"},
            {"role": "assistant", "content": "x", "tool_calls": []},
        ]
    )
    assert out == [{"role": "assistant", "content": "x"}]


def test_uniagent_normalization():
    messages = [
        {"role": "system", "content": None, "extra": 1},
        {"role": "tool", "tool_call_id": 17, "content": "ok", "name": "Bash"},
        copy.deepcopy(WIRE_ASSISTANT),
        {
            "role": "assistant",
            "content": "x",
            "reasoning_content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "not json"}},
                {"id": "d", "type": "function", "function": {"name": "g", "arguments": "[1]"}},
            ],
        },
        {"role": "", "content": "no role"},
    ]
    out = canonicalize_messages(messages, "uniagent")
    assert out[0] == {"role": "system", "content": ""}
    assert out[1] == {"role": "tool", "content": "ok", "name": "Bash", "tool_call_id": "17"}
    assert out[2]["name"] == "agent" and out[2]["content"] == "" and out[2]["reasoning_content"] == ""
    # ids, index and type survive; string arguments that parse to an object become dicts
    assert out[2]["tool_calls"][0] == {
        "id": "call_a1",
        "index": 0,
        "type": "function",
        "function": {"name": "Edit", "arguments": {"file_path": "a.py", "replace_all": False}},
    }
    assert out[3]["reasoning_content"] is None  # the key stays even when null
    assert [c["function"]["arguments"] for c in out[3]["tool_calls"]] == ["not json", "[1]"]
    assert len(out) == 4


@pytest.mark.parametrize("policy", ["none", "miles"])
def test_as_sent_policies_deep_copy(policy):
    messages = [copy.deepcopy(WIRE_ASSISTANT)]
    out = canonicalize_messages(messages, policy)
    assert out == messages and out[0] is not messages[0]
    out[0]["tool_calls"][0]["function"]["name"] = "changed"
    assert messages[0]["tool_calls"][0]["function"]["name"] == "Edit"


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_inputs_are_never_mutated(policy):
    messages = [copy.deepcopy(WIRE_ASSISTANT), {"role": "developer", "content": [{"type": "text", "text": "a"}]}]
    snapshot = copy.deepcopy(messages)
    canonicalize_messages(messages, policy)
    canonicalize_response(messages[0], policy)
    assert messages == snapshot


def test_response_goes_through_the_same_policy():
    response = {
        "content": "Done.",
        "reasoning_content": "checked",
        "tool_calls": [
            {"id": "call_9", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}
        ],
    }
    expected = {
        "role": "assistant",
        "content": "Done.",
        "reasoning_content": "checked",
        "tool_calls": [{"type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}}],
    }
    assert canonicalize_response(response) == expected
    # A harness echoing the response byte for byte canonicalizes to the same message.
    echo = {"role": "assistant", **copy.deepcopy(response)}
    assert slime([echo]) == [expected]
    assert canonicalize_response(None) is None
    assert canonicalize_response(response, "none") == {"role": "assistant", **response}


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_null_response_role_reads_as_assistant_like_a_missing_one(policy):
    """Row validation accepts `"role": null` in a response; every policy used to drop it (None)."""
    assert (
        canonicalize_response({"role": None, "content": "Done."}, policy)
        == canonicalize_response({"content": "Done."}, policy)
        == {"role": "assistant", "content": "Done."}
    )
