"""The template runner: transformers' render, with its per-call steps memoised, and without
importing transformers once a template's verdict is on disk."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import UserString

import pytest

from trace_tools.render.renderer import Renderer
from trace_tools.render.template_runner import TemplateRunner, TransformersSteps

PATH = {"type": "object", "properties": {"path": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "Read", "description": "read a file", "parameters": PATH}}]
CONVERSATION = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "open a.py"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "need the file",
        "tool_calls": [{"type": "function", "function": {"name": "Read", "arguments": {"path": "a.py"}}}],
    },
    {"role": "tool", "content": "print(1)"},
    {"role": "assistant", "content": "it prints 1", "thinking": "easy"},
    {"role": "user", "content": "thanks", "name": None},
]


def _reference(renderer, messages, tools, generation):
    return renderer.tokenizer.hf.apply_chat_template(
        messages, tools=tools, chat_template=renderer.chat_template, add_generation_prompt=generation, tokenize=False
    )


@pytest.mark.parametrize("name", ["qwen3", "qwen3.5", "glm4.5", "gpt-oss", "llama3.1"])
def test_the_runner_renders_what_apply_chat_template_renders(name):
    from trace_tools.render.families import FAMILIES

    renderer = Renderer.from_spec(FAMILIES[name].tokenizer if name in FAMILIES else name, name)
    for end in range(2, len(CONVERSATION) + 1):
        for generation in (False, True):
            messages = CONVERSATION[:end]
            assert renderer._apply_template(messages, TOOLS, generation, {}) == _reference(
                renderer, messages, TOOLS, generation
            )
    assert isinstance(renderer._jinja, TemplateRunner) and renderer._jinja.steps.name == "native"


def test_data_that_is_not_plain_json_is_rendered_by_transformers():
    renderer = Renderer.from_spec("qwen3", "qwen3")
    odd = [{"role": "user", "content": UserString("a string-like object")}]
    assert renderer._apply_template(odd, None, True, {}) == _reference(renderer, odd, None, True)
    assert "<UserString>" in renderer._apply_template(odd, None, True, {})  # transformers' placeholder


def test_a_stored_no_renders_with_transformers_own_steps(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACE_TOOLS_CACHE", str(tmp_path))
    renderer = Renderer.from_spec("qwen3", "qwen3")
    path = renderer._runner_verdict_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"native": False}))
    text = renderer._apply_template(CONVERSATION, TOOLS, True, {})
    assert isinstance(renderer._jinja, TemplateRunner) and isinstance(renderer._jinja.steps, TransformersSteps)
    assert text == _reference(renderer, CONVERSATION, TOOLS, True)


def test_once_the_verdict_is_stored_a_process_renders_without_transformers(tmp_path):
    script = (
        "import sys\n"
        "from trace_tools.render.renderer import Renderer\n"
        "r = Renderer.from_spec('qwen3', 'qwen3')\n"
        "ids = r.render([{'role': 'user', 'content': 'hi'}])\n"
        "print(len(ids), r._jinja.steps.name, 'transformers' in sys.modules)\n"
    )
    env = {**__import__("os").environ, "TRACE_TOOLS_CACHE": str(tmp_path)}

    def run() -> str:
        return subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
        ).stdout.split()

    first, second = run(), run()
    assert first[1:] == ["native", "True"]  # the first process checks against transformers
    assert second == [first[0], "native", "False"]
    assert len(list((tmp_path / "render-checks").glob("native-*.json"))) == 1


def test_a_compiled_template_is_kept_in_the_cache_and_read_back_instead_of_compiled(tmp_path, monkeypatch):
    from jinja2 import Environment

    from trace_tools.render import template_runner

    monkeypatch.setenv("TRACE_TOOLS_CACHE", str(tmp_path))
    monkeypatch.setattr(template_runner, "_CODE", {})  # as a fresh process finds it
    expected = Renderer.from_spec("qwen3", "qwen3")._apply_template(CONVERSATION, TOOLS, True, {})
    (stored,) = (tmp_path / "templates").glob("code-*.marshal")

    compiled = []
    original = Environment.compile
    monkeypatch.setattr(Environment, "compile", lambda *a, **k: compiled.append(1) or original(*a, **k))
    monkeypatch.setattr(template_runner, "_CODE", {})
    assert Renderer.from_spec("qwen3", "qwen3")._apply_template(CONVERSATION, TOOLS, True, {}) == expected
    assert not compiled  # read back, not compiled

    stored.write_bytes(b"not marshal data")  # damaged: compiled again, and stored again
    monkeypatch.setattr(template_runner, "_CODE", {})
    assert Renderer.from_spec("qwen3", "qwen3")._apply_template(CONVERSATION, TOOLS, True, {}) == expected
    assert compiled and stored.read_bytes() != b"not marshal data"
