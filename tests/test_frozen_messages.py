"""Canonical messages are immutable once the pipeline canonicalized them: memos downstream
(message digests, template forms, window renders) key on their identity."""

from __future__ import annotations

import copy
import json
import pickle

import pytest

from trace_tools.pipeline import Pipeline
from trace_tools.render.canonical import FrozenDict, FrozenList, freeze

MESSAGE = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"type": "function", "function": {"name": "Edit", "arguments": {"file_path": "a.py"}}}],
}


@pytest.fixture(scope="module")
def prepared():
    pipeline = Pipeline("sample_traces/qwen3.parquet")
    return pipeline.prepare(next(s for s in pipeline if hasattr(s, "turns")))


def test_every_canonical_message_and_response_of_a_prepared_session_is_frozen(prepared):
    turns = prepared.turns
    assert all(type(m) is FrozenDict for t in turns for m in t.messages)
    assert all(type(t.response_message) is FrozenDict for t in turns if t.response_message is not None)
    calls = [c for t in turns for m in t.messages for c in m.get("tool_calls") or ()]
    assert calls and all(type(c) is FrozenDict and type(c["function"]) is FrozenDict for c in calls)
    message = next(m for t in turns for m in t.messages if m.get("tool_calls"))
    for change in (
        lambda: message.__setitem__("content", "x"),
        lambda: message.pop("role"),
        lambda: message.update(role="user"),
        lambda: message["tool_calls"].append({}),
        lambda: message["tool_calls"][0]["function"].__setitem__("name", "Bash"),
    ):
        with pytest.raises(TypeError, match="immutable"):
            change()


def test_a_frozen_message_is_still_the_same_message_and_its_copies_can_change():
    frozen = freeze(MESSAGE)
    assert frozen == MESSAGE and json.dumps(frozen) == json.dumps(MESSAGE)
    assert isinstance(frozen, dict) and isinstance(frozen["tool_calls"], list)
    assert type(frozen["tool_calls"]) is FrozenList
    for copied in (copy.deepcopy(frozen), pickle.loads(pickle.dumps(frozen))):
        assert copied == MESSAGE and type(copied) is dict and type(copied["tool_calls"]) is list
        copied["tool_calls"][0]["function"]["name"] = "Bash"  # a plain, changeable copy
    assert type(copy.copy(frozen)) is dict and type(dict(frozen)) is dict
    assert frozen["tool_calls"][0]["function"]["name"] == "Edit"


def test_frozen_messages_render_on_the_native_template_path(prepared):
    """The template runner takes frozen messages as plain JSON (no fallback to transformers), and
    renders them exactly as their plain copies."""
    from trace_tools.render.template_runner import NativeSteps

    renderer = prepared.renderer
    turn = prepared.turns[-1]
    assert NativeSteps.message(turn.messages[0]) == NativeSteps.message(dict(turn.messages[0]))
    plain = [copy.deepcopy(m) for m in turn.messages]
    assert renderer.render_text(turn.messages, turn.tools) == renderer.render_text(plain, turn.tools)
