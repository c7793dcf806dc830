"""miles' message matchers (docs/upstream_session.md#matchers): one test per consequence bullet."""

from __future__ import annotations

import pytest

from session_fakes import assistant, call, tool, user
from trace_tools.errors import UnknownName
from trace_tools.strategies.session_core.errors import ServerError
from trace_tools.strategies.session_core.matchers import (
    INVALID_JSON_OBJECT,
    json_object_tree,
    loose_tool_call_match,
    matches,
    resolve_matcher,
    role_content_only_match,
    strict_match,
)

ALL = [strict_match, loose_tool_call_match, role_content_only_match]


@pytest.mark.parametrize("match", ALL)
@pytest.mark.parametrize("left,right", [(None, ""), ("", "MISSING"), (None, "MISSING")])
def test_empty_content_spellings_are_one(match, left, right):
    stored = {"role": "assistant", "content": left}
    new = {"role": "assistant"} if right == "MISSING" else {"role": "assistant", "content": right}
    assert match(stored, new) and match(new, stored)


@pytest.mark.parametrize("match", ALL)
def test_whitespace_content_is_not_empty(match):
    assert not match(user(" "), user(""))
    assert not match(user("ok\n"), user("ok"))


@pytest.mark.parametrize("spelling", [None, [], "MISSING"])
def test_empty_tool_call_spellings_are_one(spelling):
    new = assistant("hi")
    if spelling != "MISSING":
        new["tool_calls"] = spelling
    for match in (strict_match, loose_tool_call_match):
        assert match({**assistant("hi"), "tool_calls": None}, new)


def test_reasoning_empty_spellings_equal_but_text_differs():
    for value in (None, ""):
        assert strict_match(assistant("a", reasoning=value), assistant("a"))
    assert not strict_match(assistant("a", reasoning="thought"), assistant("a"))
    assert not loose_tool_call_match(assistant("a", reasoning="thought"), assistant("a"))
    assert role_content_only_match(assistant("a", reasoning="thought"), assistant("a"))


def test_tool_call_id_is_compared():
    stored = assistant("", call("Read", '{"p":1}', call_id="c-1"))
    renamed = assistant("", call("Read", '{"p":1}', call_id="c-2"))
    assert not strict_match(stored, renamed)
    assert not loose_tool_call_match(stored, renamed)
    assert role_content_only_match(stored, renamed)


def test_index_is_ignored_but_null_keys_are_kept():
    served = assistant("", call("Bash", '{"c":"ls"}', call_id="x", index=3))
    streamed = assistant("", call("Bash", '{"c":"ls"}', call_id="x"))
    renumbered = assistant("", call("Bash", '{"c":"ls"}', call_id="x", index=0))
    assert strict_match(served, streamed) and strict_match(served, renumbered)
    with_null = assistant("", call("Bash", '{"c":"ls"}', call_id="x"))
    with_null["tool_calls"][0]["extra"] = None
    assert not strict_match(with_null, streamed)


def test_strict_compares_arguments_raw():
    compact = assistant("", call("Edit", '{"n":1}', call_id="e"))
    spaced = assistant("", call("Edit", '{"n": 1}', call_id="e"))
    as_dict = assistant("", call("Edit", {"n": 1}, call_id="e"))
    assert not strict_match(compact, spaced)
    assert not strict_match(compact, as_dict)
    assert not strict_match(spaced, as_dict)
    assert strict_match(as_dict, assistant("", call("Edit", {"n": 1}, call_id="e")))


def test_keys_outside_the_template_are_ignored():
    stored = {**tool("out"), "tool_call_id": "a", "name": "Read"}
    new = {**tool("out"), "tool_call_id": "b", "provider_specific_fields": {"x": 1}}
    for match in ALL:
        assert match(stored, new)


def test_role_is_compared_by_every_matcher():
    for match in ALL:
        assert not match(user("x"), tool("x"))


@pytest.mark.parametrize(
    "left,right",
    [
        ('{"n":1}', '{"n": 1}'),  # spacing
        ('{"a":1,"b":2}', '{"b":2,"a":1}'),  # key order
        ('{"n":1}', {"n": 1}),  # string vs parsed
        ('{"n":1}', '{"n":1.0}'),  # exact number equality
        ('{"n":100}', '{"n":1e2}'),
        (None, ""),
        ("", {}),
        (None, "{}"),  # empty spellings of the empty object
    ],
)
def test_loose_equates_json_object_spellings(left, right):
    stored = assistant("", call("Edit", left, call_id="e"))
    new = assistant("", call("Edit", right, call_id="e"))
    assert loose_tool_call_match(stored, new)


@pytest.mark.parametrize(
    "left,right",
    [
        ('{"n":true}', '{"n":1}'),  # boolean is not number
        ('{"n":"1"}', '{"n":1}'),  # string is not number
        ('{"l":[1,2]}', '{"l":[2,1]}'),  # arrays keep order
        ('{"n":1}', '{"n":2}'),
    ],
)
def test_loose_keeps_json_types_apart(left, right):
    stored = assistant("", call("Edit", left, call_id="e"))
    new = assistant("", call("Edit", right, call_id="e"))
    assert not loose_tool_call_match(stored, new)


@pytest.mark.parametrize("text", ['{"a":1,"a":2}', '{"a":NaN}', '{"a":Infinity}', "[1,2]", "not json"])
def test_invalid_arguments_fall_back_to_raw_equality(text):
    assert json_object_tree(text) is INVALID_JSON_OBJECT
    same = assistant("", call("Edit", text, call_id="e"))
    assert loose_tool_call_match(same, assistant("", call("Edit", text, call_id="e")))
    assert not loose_tool_call_match(same, assistant("", call("Edit", text + " ", call_id="e")))


def test_loose_fallback_is_type_sensitive():
    # Plain equality (strict) says [1] == [True] ...
    assert strict_match(assistant("", call("F", [1], call_id="e")), assistant("", call("F", [True], call_id="e")))
    # ... but once strict fails elsewhere (the first call's spelling), a non-object argument is
    # compared structurally, where 1 and True differ.
    stored = assistant("", call("E", '{"n":1}', call_id="a"), call("F", [1], call_id="b"))
    respelled = assistant("", call("E", '{"n": 1}', call_id="a"), call("F", [1], call_id="b"))
    retyped = assistant("", call("E", '{"n": 1}', call_id="a"), call("F", [True], call_id="b"))
    assert loose_tool_call_match(stored, respelled)
    assert not loose_tool_call_match(stored, retyped)


def test_loose_still_compares_everything_but_argument_spelling():
    base = assistant("", call("Edit", '{"n":1}', call_id="e"))
    assert not loose_tool_call_match(base, assistant("", call("Write", '{"n": 1}', call_id="e")))
    assert not loose_tool_call_match(base, assistant("x", call("Edit", '{"n": 1}', call_id="e")))
    two = assistant("", call("Edit", '{"n":1}', call_id="e"), call("Edit", '{"n":1}', call_id="e"))
    assert not loose_tool_call_match(base, two)
    extra = assistant("", call("Edit", '{"n": 1}', call_id="e"))
    extra["tool_calls"][0]["function"]["kind"] = "x"
    assert not loose_tool_call_match(base, extra)


def test_role_content_only_ignores_tool_calls():
    assert role_content_only_match(assistant("", call("A", "{}")), assistant(None))
    assert not role_content_only_match(assistant("a"), assistant("b"))


def test_matcher_registry_and_contract():
    assert resolve_matcher(None) is strict_match
    assert resolve_matcher("loose_tool_call") is loose_tool_call_match
    with pytest.raises(UnknownName):
        resolve_matcher("fuzzy")
    with pytest.raises(ServerError):
        matches(lambda a, b: 1, user("a"), user("a"))  # a truthy non-bool breaks the contract
    with pytest.raises(ServerError):
        matches(lambda a, b: a["missing"], user("a"), user("a"))
