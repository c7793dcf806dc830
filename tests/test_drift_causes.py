"""Drift causes that name what happened: the template's own rewrites are `template_rewrite`, each
rewrite a harness profile can name has its cause, a cosmetic rewrite is never `genuine_edit`, and the
message difference shows the part that differs."""

from __future__ import annotations

import json

import pytest

from trace_tools.pipeline import Pipeline
from trace_tools.pipeline.drift import classify, differing_parts, find_drift, message_diff
from trace_tools.simulate import simulate


def _findings(path):
    out = []
    for prepared in Pipeline(path).prepared():
        behaviours = "+".join(prepared.turns[0].turn.metadata["behaviours"])
        out += [(behaviours, finding) for finding in find_drift(prepared)]
    return out


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    path = tmp_path_factory.mktemp("drift") / "deepseek.parquet"
    behaviours = ["byte-exact", "json-reserialize", "claude-code", "reasoning-dropped"]
    simulate(sessions=4, seed=3, template="deepseek-v3", behaviours=behaviours, max_turns=6, out=str(path))
    return _findings(path)


def test_deepseek_v3_history_rewrites_are_the_templates_not_the_echoes(deepseek):
    """DeepSeek V3 re-renders a reply without the generation prompt's <think> (and the tool-outputs
    closer): a byte-exact echo drifts the same way, so the echo's own rewrite is never the cause."""
    drifted = [(behaviours, f) for behaviours, f in deepseek if f.token_drift]
    assert {behaviours for behaviours, _ in drifted} == {
        "byte-exact",
        "json-reserialize",
        "claude-code",
        "reasoning-dropped",
    }
    assert all(f.cause == "template_rewrite" for _, f in drifted), [(b, f.causes) for b, f in drifted]
    # the echo's rewrites are still listed, after the template's
    listed = {cause for behaviours, f in drifted if behaviours != "byte-exact" for cause in f.causes[1:]}
    assert {"key_order_or_spacing", "reasoning"} <= listed


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    path = tmp_path_factory.mktemp("drift") / "qwen3.parquet"
    simulate(sessions=2, seed=3, template="qwen3", behaviours=["claude-code", "json-reserialize"], out=str(path))
    return _findings(path)


def test_on_qwen3_the_echo_leads_where_it_makes_the_first_difference(qwen3):
    causes = {f.cause for _, f in qwen3 if f.token_drift}
    assert {"command_prefix", "schema_default", "key_order_or_spacing"} <= causes
    assert "genuine_edit" not in causes


def test_a_removed_cd_prefix_is_named_and_a_removed_other_prefix_is_an_edit():
    tools = None
    stored = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "Bash", "arguments": {"command": "cd /w && make"}}}
        ],
    }

    def echoed(command):
        return {
            **stored,
            "tool_calls": [
                {**stored["tool_calls"][0], "function": {"name": "Bash", "arguments": {"command": command}}}
            ],
        }

    causes, diff = classify(stored, echoed("make"), tools, False, 0, [], [], 0, None, cwd="/w")
    assert causes == ["command_prefix"] and "'cd /w && make'" in diff[0]
    assert classify(stored, echoed("make"), tools, False, 0, [], [], 0, None, cwd="/elsewhere")[0] == ["genuine_edit"]
    assert classify(stored, echoed("make -j4"), tools, False, 0, [], [], 0, None, cwd="/w")[0] == ["genuine_edit"]


def test_reasoning_sent_back_as_text_is_a_reasoning_cause_not_an_edit():
    stored = {"role": "assistant", "content": "Fixing.", "reasoning_content": "Off by one."}
    echo = {"role": "assistant", "content": "Off by one.Fixing."}
    assert classify(stored, echo, None, False, 0, [], [], 0, None)[0] == ["reasoning"]
    edited = {"role": "assistant", "content": "Off by one. Fixing it twice."}
    assert classify(stored, edited, None, False, 0, [], [], 0, None)[0] == ["genuine_edit"]


def test_javascript_trim_end_whitespace_is_whitespace():
    stored = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "Write", "arguments": {"content": "x = 1\ufeff\ny = 2\u3000"}}}
        ],
    }
    echo = json.loads(json.dumps(stored))
    echo["tool_calls"][0]["function"]["arguments"]["content"] = "x = 1\ny = 2"
    assert classify(stored, echo, None, False, 0, [], [], 0, None)[0] == ["whitespace"]


def test_the_message_difference_shows_the_part_that_differs():
    body = "".join(f"line {n} of a long file\n" for n in range(40))
    before, after = body + "the end  \n" + body, body + "the end\n" + body
    line = message_diff({"content": before}, {"content": after})[0]
    served, echoed = line.split(": ", 1)[1].split(" → ")
    assert served != echoed and "the end  " in served and "the end\\n" in echoed
    assert served.startswith("…") and served.endswith("…")  # both sides cut around the difference
    assert differing_parts("abc", "abcdef") == ("'abc'", "'abcdef'")
    assert differing_parts("cd /w && make", "make")[0].startswith("'cd /w && ")


def test_the_message_difference_shows_what_differs_between_lists_and_shapes():
    long = "x" * 200
    calls = [{"id": "a", "function": {"name": "Read"}}, {"id": "b", "function": {"name": "Grep"}}]
    assert message_diff({"tool_calls": calls}, {"tool_calls": calls[:1]}) == [
        'tool_calls[1]: {"id": "b", "function": {"name": "Grep"}} → <missing>'
    ]
    parts = {"content": [{"type": "text", "text": long + "served" + long}]}
    [line] = message_diff(parts, {"content": long + "echoed" + long})  # content parts against a string
    assert line.startswith("content (text): …") and "served" in line and "echoed" in line
