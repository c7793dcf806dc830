"""Template resolution: names, TRL files, paths, the dump's own template, and the errors' fixes."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from trace_tools.errors import TemplateNotFound
from trace_tools.render import templates
from trace_tools.render.templates import resolve_template

MINI = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def _trl_file(name: str) -> str:
    return (templates.trl_template_dir() / name).read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "spec, file_name",
    [
        ("qwen3", "qwen3.jinja"),
        ("qwen3.5", "qwen3_5_think.jinja"),
        ("trl:llama3_1", "llama3_1.jinja"),
        ("trl:qwen3_5_nothink.jinja", "qwen3_5_nothink.jinja"),
    ],
)
def test_named_and_trl_templates_come_from_the_installed_trl(spec, file_name):
    text, identity = resolve_template(spec)
    assert text == _trl_file(file_name)
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    assert identity == f"trl:{file_name} sha256={digest}"


def test_trl_is_located_without_importing_it():
    # importing trl is slow and pulls torch; resolution must only locate its files
    code = (
        "import sys; from trace_tools.render.templates import resolve_template; "
        "resolve_template('qwen3'); resolve_template('trl:gptoss'); print('trl' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


def test_xml_template_is_the_think_variant():
    text, _ = resolve_template("qwen3.5")
    assert "<function=" in text and "'<think>\\n'" in text


def test_no_spec_prefers_the_dump_template_then_the_tokenizer_default():
    text, identity = resolve_template(None, tokenizer_name="qwen3", dump_template=MINI)
    assert (text, identity.split()[0]) == (MINI, "dump")
    text, identity = resolve_template(None, tokenizer_name="qwen3", dump_template=None)
    assert text == _trl_file("qwen3.jinja")


def test_explicit_spec_overrides_the_dump(tmp_path):
    path = tmp_path / "mine.jinja"
    path.write_text(MINI + "{# mine #}")
    text, identity = resolve_template(str(path), tokenizer_name="qwen3", dump_template=MINI)
    assert text.endswith("{# mine #}")
    assert identity.startswith(f"file:{path.resolve()} sha256=")


def test_dump_template_stands_in_for_named_templates_without_trl(monkeypatch):
    monkeypatch.setattr(templates, "trl_template_dir", lambda: None)
    text, identity = resolve_template("qwen3", dump_template=MINI)
    assert text == MINI and identity.startswith("dump ")
    # no dump template: the copy of TRL's file that the bundled sample embeds (docs/rendering.md#chat-templates-and-the-response-parser)
    text, identity = resolve_template("qwen3.5", dump_template=None)
    assert identity.startswith("sample_traces:qwen3.5 ") and "<tool_call>" in text
    import trace_tools.io.bundled as bundled

    monkeypatch.setattr(bundled, "sample_template", lambda name: None)
    with pytest.raises(TemplateNotFound) as info:
        resolve_template("qwen3.5", dump_template=None)
    assert "pip install --no-deps trl==1.16.0" in str(info.value) and "--chat-template FILE" in str(info.value)
    with pytest.raises(TemplateNotFound, match="trl==1.16.0"):
        resolve_template("trl:llama3")


def test_tokenizer_directory_templates(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": MINI}))
    text, identity = resolve_template(str(tmp_path))
    assert text == MINI and identity.startswith("tokenizer:")
    (tmp_path / "chat_template.jinja").write_text(MINI + "x")
    assert resolve_template(None, tokenizer_name=str(tmp_path))[0] == MINI + "x"
    named = tmp_path / "named"
    named.mkdir()
    (named / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": MINI}]})
    )
    assert resolve_template(str(named))[0] == MINI


def test_errors_name_the_fix(tmp_path):
    with pytest.raises(TemplateNotFound, match="--chat-template FILE"):
        resolve_template("no/such/file.jinja")
    with pytest.raises(TemplateNotFound, match="available: .*qwen3"):
        resolve_template("trl:qwen99")
    with pytest.raises(TemplateNotFound, match="--chat-template FILE"):
        resolve_template(None, tokenizer_name=None, dump_template=None)
    with pytest.raises(TemplateNotFound, match="carries no chat template"):
        resolve_template("dump", dump_template=None)
    with pytest.raises(TemplateNotFound, match="has no chat template"):
        resolve_template(str(tmp_path))


def test_inline_template_text_is_accepted():
    text, identity = resolve_template(MINI)
    assert text == MINI and identity.startswith("inline ")
