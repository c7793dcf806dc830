"""Parsing generated text back into messages: round trips through the real templates, typing, bad calls."""

from __future__ import annotations

from functools import lru_cache

import pytest

from trace_tools.render.parse_common import convert_parameter
from trace_tools.render.parser import parse_response_text
from trace_tools.render.renderer import Renderer
from trace_tools.render.templates import resolve_template

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Write",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "content": {"type": "string"},
                    "mode": {"type": "integer"},
                    "overwrite": {"type": "boolean"},
                    "ratio": {"type": "number"},
                    "meta": {"type": "object"},
                    "tags": {"type": "array"},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}, "timeout": {"type": ["integer", "null"]}},
            },
        },
    },
]
HISTORY = [{"role": "system", "content": "You write files."}, {"role": "user", "content": "Create the config."}]


def _call(name, **arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


MESSAGES = {
    "several_calls": {
        "role": "assistant",
        "content": "Writing both files now.",
        "reasoning_content": "Two files are needed.\nThe second one is a script.",
        "tool_calls": [
            _call(
                "Write",
                path="/etc/app/config.yaml",
                content="name: démo 日本\nitems:\n  - a   \n  - b\t\n\n",
                mode=420,
                overwrite=True,
                ratio=0.25,
                meta={"owner": {"uid": 0, "groups": ["wheel"]}, "ok": None},
                tags=["x", 1, False],
            ),
            _call("Bash", command="chmod +x run.sh && ./run.sh  ", timeout=30),
            _call(
                "Write",
                path="notes.txt",
                content="  leading and trailing  ",
                mode=0,
                overwrite=False,
                ratio=1.5,
                meta={},
                tags=[],
            ),
        ],
    },
    "call_without_text": {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Just run it.",
        "tool_calls": [_call("Bash", command="ls -la\n\necho done")],
    },
    "text_only": {"role": "assistant", "content": "All done — 完成 ✅\nNothing else to do."},
    "text_with_reasoning": {
        "role": "assistant",
        "content": "The answer is 42.",
        "reasoning_content": "6 × 7 = 42, double-check: yes.",
    },
    "string_lookalikes": {
        "role": "assistant",
        "content": "",
        "tool_calls": [_call("Write", path="42", content="null"), _call("Bash", command="true")],
    },
}


@lru_cache(maxsize=None)
def _renderer(name: str) -> Renderer:
    text, identity = resolve_template(name)
    return Renderer(name, text, template_identity=identity)


def _emitted_ids(renderer: Renderer, message: dict) -> list[int]:
    """What the model would have generated: the template's rendering of the turn after the prompt."""
    prompt = renderer.render_text(HISTORY, TOOLS, True)
    full = renderer.render_text(HISTORY + [message], TOOLS, False)
    assert full.startswith(prompt)
    emitted = full[len(prompt) :]
    assert emitted.endswith("<|im_end|>\n")
    return renderer.encode(emitted[:-1])


@pytest.mark.parametrize("name", ["qwen3", "qwen3.5"])
@pytest.mark.parametrize("case", sorted(MESSAGES))
def test_round_trip_through_the_real_template(name, case):
    renderer = _renderer(name)
    parsed = renderer.parse_response(_emitted_ids(renderer, MESSAGES[case]), TOOLS)
    assert parsed.ill_formed is False and parsed.errors == []
    assert parsed.message == MESSAGES[case]


def test_xml_values_typed_from_the_request_schema():
    text = (
        "<tool_call>\n<function=Write>\n<parameter=mode>\n007\n</parameter>\n<parameter=overwrite>\nFalse\n"
        '</parameter>\n<parameter=ratio>\n2.50\n</parameter>\n<parameter=tags>\n[1, "two"]\n</parameter>\n'
        "<parameter=extra>\n12\n</parameter>\n</function>\n</tool_call>"
    )
    parsed = parse_response_text(text, fmt="xml", tools=TOOLS, reasoning_open=False)
    assert parsed.message["tool_calls"][0]["function"]["arguments"] == {
        "mode": 7,
        "overwrite": False,
        "ratio": 2.5,
        "tags": [1, "two"],
        "extra": "12",
    }
    # Without schemas every value stays text.
    untyped = parse_response_text(text, fmt="xml", tools=None, reasoning_open=False)
    assert untyped.message["tool_calls"][0]["function"]["arguments"]["mode"] == "007"


@pytest.mark.parametrize(
    "value, schema, expected",
    [
        ("12", {"type": "integer"}, 12),
        ("twelve", {"type": "integer"}, "twelve"),
        ("3.0", {"type": "number"}, 3),
        ("-0.125", {"type": "number"}, -0.125),
        ("TRUE", {"type": "boolean"}, True),
        ("no", {"type": "boolean"}, False),
        ("null", {"type": "integer"}, None),
        ("null", {"type": "string"}, "null"),
        ("5", {"type": ["integer", "null"]}, 5),
        ("{'a': (1)}", {"type": "object"}, {"a": 1}),
        ("{not json", {"type": "object"}, "{not json"),
        ("[1, 2]", {"anyOf": [{"type": "array"}, {"type": "null"}]}, [1, 2]),
        ("  spaced  ", {"type": "string"}, "  spaced  "),
        ("7", None, "7"),
    ],
)
def test_convert_parameter(value, schema, expected):
    result = convert_parameter(value, schema)
    assert result == expected and type(result) is type(expected)


def test_only_the_format_newlines_are_removed_from_values():
    text = "<tool_call>\n<function=Bash>\n<parameter=command>\n\nls\n\n</parameter>\n</function>\n</tool_call>"
    parsed = parse_response_text(text, fmt="xml", tools=TOOLS, reasoning_open=False)
    assert parsed.message["tool_calls"][0]["function"]["arguments"]["command"] == "\nls\n"


@pytest.mark.parametrize(
    "fmt, text",
    [
        ("json", 'Let me check.\n<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}\n</tool_call>'),
        ("json", '<tool_call>\n{"arguments": {"command": "ls"}}\n</tool_call>'),
        ("json", '<tool_call>\n{"name": "Bash", "arguments": "not json"}\n</tool_call>'),
        ("json", 'Truncated:\n<tool_call>\n{"name": "Bash", "argum'),
        ("xml", "<tool_call>\n<function=Bash>\n<parameter=command>\nls\n</parameter>\n</tool_call>"),
        ("xml", "<tool_call>\n<function=Bash>\nstray text\n</function>\n</tool_call>"),
    ],
)
def test_malformed_calls_are_flagged_and_kept(fmt, text):
    parsed = parse_response_text(text + "<|im_end|>", fmt=fmt, tools=TOOLS, reasoning_open=False)
    assert parsed.ill_formed is True and parsed.errors
    assert "tool_calls" not in parsed.message
    assert "<tool_call>" in parsed.message["content"]  # the raw call text is not lost
    assert not parsed.message["content"].endswith("<|im_end|>")


def test_good_calls_survive_next_to_a_bad_one():
    text = (
        '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "Bash", "arguments": {oops}}\n</tool_call>'
    )
    parsed = parse_response_text(text, fmt="json", tools=TOOLS, reasoning_open=False)
    assert parsed.ill_formed
    assert parsed.message["tool_calls"] == [_call("Bash", command="ls")]
    assert "{oops}" in parsed.message["content"]


def test_reasoning_open_and_truncated_reasoning():
    done = parse_response_text(
        "step one\nstep two\n</think>\n\nanswer<|im_end|>", fmt="xml", tools=None, reasoning_open=True
    )
    assert done.message == {"role": "assistant", "content": "answer", "reasoning_content": "step one\nstep two"}
    cut = parse_response_text("still thinking about", fmt="xml", tools=None, reasoning_open=True)
    assert cut.message == {"role": "assistant", "content": "", "reasoning_content": "still thinking about"}
    plain = parse_response_text("no tags here<|endoftext|>", fmt="json", tools=None, reasoning_open=False)
    assert plain.message == {"role": "assistant", "content": "no tags here"}


def test_unknown_format_keeps_tool_text_as_content():
    text = '<tool_call>\n{"name": "Bash", "arguments": {}}\n</tool_call>'
    parsed = parse_response_text(text, fmt=None, tools=None, reasoning_open=False)
    assert parsed.message == {"role": "assistant", "content": text} and not parsed.ill_formed
