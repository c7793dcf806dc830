"""The GLM-4.5, DeepSeek V3, gpt-oss and Llama 3.1 response parsers (SGLang detector semantics)."""

from __future__ import annotations

import pytest

from trace_tools.render.canonical import canonicalize_response
from trace_tools.render.parser import parse_response_text
from trace_tools.simulate.tools import MAIN_TOOLS, tool_schemas

TOOLS = tool_schemas(MAIN_TOOLS)
NEW = ("glm4.5", "deepseek-v3", "gpt-oss", "llama3.1")


def _parse(text, fmt, **kwargs):
    stops = {
        "glm": ("<|user|>", "<|observation|>", "<|endoftext|>"),
        "deepseek": ("<｜end▁of▁sentence｜>",),
        "harmony": ("<|return|>", "<|call|>", "<|endoftext|>"),
        "llama": ("<|eot_id|>", "<|eom_id|>"),
    }[fmt]
    return parse_response_text(text, fmt=fmt, tools=TOOLS, stop_strings=stops, **kwargs)


def _calls(parsed):
    return [(c["function"]["name"], c["function"]["arguments"]) for c in parsed.message.get("tool_calls") or []]


@pytest.mark.parametrize("name", NEW)
def test_every_simulated_tool_call_round_trips(name):
    """Each complete turn of every behaviour parses back to the response the gateway returned:
    content, reasoning and every call with typed, nested arguments."""
    from trace_tools.render.renderer import Renderer
    from trace_tools.simulate import simulate_sessions
    from trace_tools.simulate.behaviours import parse_recipes

    sessions, meta = simulate_sessions(16, 13, name, parse_recipes(None), "tree", 10)
    renderer = Renderer.from_spec(meta.tokenizer, None, dump_meta=meta)
    kinds, calls = set(), 0
    for session in sessions:
        for turn in session.turns:
            if turn.finish_reason == "length":
                continue
            parsed = renderer.parse_response(turn.output_ids, turn.tools)
            assert not parsed.ill_formed, (turn.turn_index, parsed.errors)
            assert canonicalize_response(parsed.message) == canonicalize_response(turn.response)
            for call in parsed.message.get("tool_calls") or []:
                calls += 1
                kinds |= {type(value).__name__ for value in call["function"]["arguments"].values()}
    assert calls >= 40 and {"str", "int", "bool", "list"} <= kinds


# -- GLM-4.5 -------------------------------------------------------------------------------------
def test_glm_content_reasoning_and_schema_typed_calls():
    text = (
        "\n<think>Check both.</think>\nReading now.\n<tool_call>Read\n<arg_key>file_path</arg_key>\n"
        "<arg_value>/r/a.py</arg_value>\n<arg_key>limit</arg_key>\n<arg_value>40</arg_value>\n</tool_call>\n"
        "<tool_call>Edit\n<arg_key> replace_all </arg_key>\n<arg_value>true</arg_value>\n<arg_key>new_string</arg_key>\n"
        "<arg_value> 12 </arg_value>\n<arg_key>undeclared</arg_key>\n<arg_value>[1]</arg_value>\n</tool_call><|observation|>"
    )
    parsed = _parse(text, "glm")
    assert parsed.message["reasoning_content"] == "Check both." and parsed.message["content"] == "Reading now."
    assert _calls(parsed) == [
        ("Read", {"file_path": "/r/a.py", "limit": 40}),
        ("Edit", {"replace_all": True, "new_string": " 12 ", "undeclared": "[1]"}),
    ]
    assert not parsed.ill_formed


def test_glm_nested_values_and_broken_calls():
    todos = '[{"id": "1", "content": "fix", "status": "completed"}]'
    ok = _parse(
        f"\n<think></think><tool_call>TodoWrite\n<arg_key>todos</arg_key>\n<arg_value>{todos}</arg_value>\n"
        "</tool_call><|observation|>",
        "glm",
    )
    assert _calls(ok) == [("TodoWrite", {"todos": [{"id": "1", "content": "fix", "status": "completed"}]})]
    cut = _parse("\n<think>x</think>\n<tool_call>Edit\n<arg_key>file_path</arg_key>\n<arg_val", "glm")
    assert cut.ill_formed and cut.message["content"].startswith("<tool_call>Edit") and not _calls(cut)
    junk = _parse("\n<think>x</think>\n<tool_call>Read\nfile_path=/a\n</tool_call><|observation|>", "glm")
    assert junk.ill_formed and "outside" in junk.errors[0]


# -- DeepSeek V3 ---------------------------------------------------------------------------------
def test_deepseek_v3_and_v31_layouts_and_reasoning():
    v3 = (
        "Plan.\n</think>\n\nReading.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>Read\n```json\n"
        '{"file_path": "/r/a.py", "offset": 3}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>Bash'
        '\n```json\n{"command": "ls", "timeout": 5}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>'
    )
    parsed = _parse(v3, "deepseek")
    assert (parsed.message["reasoning_content"], parsed.message["content"]) == ("Plan.", "Reading.")
    assert _calls(parsed) == [
        ("Read", {"file_path": "/r/a.py", "offset": 3}),
        ("Bash", {"command": "ls", "timeout": 5}),
    ]
    v31 = (
        '<think>Plan.</think>Go.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>Read<｜tool▁sep｜>{"file_path": "/b"}'
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
    )
    parsed = _parse(v31, "deepseek")
    assert parsed.message["reasoning_content"] == "Plan." and _calls(parsed) == [("Read", {"file_path": "/b"})]
    plain = _parse("Done after the tool outputs.<｜end▁of▁sentence｜>", "deepseek")
    assert plain.message == {"role": "assistant", "content": "Done after the tool outputs."}


def test_deepseek_broken_calls_keep_their_text():
    bad = _parse(
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>Read\n```json\n{oops}\n```"
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
        "deepseek",
    )
    assert bad.ill_formed and "not JSON" in bad.errors[0] and "{oops}" in bad.message["content"]
    cut = _parse('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>Read\n```json\n{"file', "deepseek")
    assert cut.ill_formed and not _calls(cut)


# -- gpt-oss (harmony) ---------------------------------------------------------------------------
def test_harmony_channels_and_both_recipient_placements():
    template_style = (
        "<|channel|>analysis<|message|>Look first.<|end|><|start|>assistant to=functions.Read"
        '<|channel|>commentary json<|message|>{"file_path": "/r/a.py", "limit": 10}<|call|>'
    )
    parsed = _parse(template_style, "harmony")
    assert parsed.message["reasoning_content"] == "Look first." and parsed.message["content"] == ""
    assert _calls(parsed) == [("Read", {"file_path": "/r/a.py", "limit": 10})]
    model_style = (
        "<|channel|>analysis<|message|>Look.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.Bash <|constrain|>json<|message|>{"command":"ls"}<|call|>'
    )
    assert _calls(_parse(model_style, "harmony")) == [("Bash", {"command": "ls"})]
    final = _parse(
        "<|channel|>analysis<|message|>Done.<|end|><|start|>assistant<|channel|>final<|message|>All green.<|return|>",
        "harmony",
    )
    assert final.message == {"role": "assistant", "content": "All green.", "reasoning_content": "Done."}
    preamble = _parse(
        "<|channel|>commentary<|message|>Checking the tests.<|end|><|start|>assistant<|channel|>final"
        "<|message|>Fine.<|return|>",
        "harmony",
    )
    assert preamble.message["content"] == "Checking the tests.\nFine."


def test_harmony_cut_off_call_is_ill_formed():
    cut = _parse(
        "<|channel|>analysis<|message|>Edit it.<|end|><|start|>assistant to=functions.Edit<|channel|>"
        'commentary json<|message|>{"file_path": "/r',
        "harmony",
    )
    assert cut.ill_formed and "cut off" in cut.errors[0] and not _calls(cut)
    assert cut.message["reasoning_content"] == "Edit it." and "to=functions.Edit" in cut.message["content"]


# -- Llama 3.1 -----------------------------------------------------------------------------------
def test_llama_json_calls_with_and_without_python_tag():
    bare = _parse('{"name": "Read", "parameters": {"file_path": "/r/a.py", "limit": 5}}<|eot_id|>', "llama")
    assert _calls(bare) == [("Read", {"file_path": "/r/a.py", "limit": 5})] and bare.message["content"] == ""
    tagged = _parse(
        'Let me look.<|python_tag|>{"name": "Grep", "arguments": {"pattern": "x"}}; '
        '{"name": "Glob", "parameters": {"pattern": "*.py"}}<|eom_id|>',
        "llama",
    )
    assert _calls(tagged) == [("Grep", {"pattern": "x"}), ("Glob", {"pattern": "*.py"})]
    assert tagged.message["content"] == "Let me look."
    text = _parse("The fix is in. All tests pass.<|eot_id|>", "llama")
    assert text.message == {"role": "assistant", "content": "The fix is in. All tests pass."}


def test_llama_broken_json_is_ill_formed_text():
    cut = _parse('{"name": "Edit", "parameters": {"file_path": "/r/a.py", "old_str', "llama")
    assert cut.ill_formed and not _calls(cut) and cut.message["content"].startswith('{"name": "Edit"')
    nameless = _parse('{"tool": "Edit"}<|eot_id|>', "llama")
    assert nameless.ill_formed and "name" in nameless.errors[0]
