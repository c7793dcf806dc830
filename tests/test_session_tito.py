"""TITO tokenizer and request preparation (docs/upstream_session.md#request-preparation-and-the-tito-tokenizer) on the toy renderer."""

from __future__ import annotations

import pytest

from session_fakes import IM_END, NEWLINE, ToyRenderer, assistant, call, output_for, system, tool, user
from trace_tools.errors import UnknownName
from trace_tools.strategies.session_core.errors import RequestRejected, ServerError
from trace_tools.strategies.session_core.tito import (
    FAMILIES,
    TitoTokenizer,
    family_for,
    sglang_tools,
    template_messages,
)

TOOLS = [{"type": "function", "function": {"name": "Read", "parameters": {"type": "object"}, "description": "read"}}]


def tito(family: str = "qwen3", **renderer_options) -> TitoTokenizer:
    renderer = ToyRenderer(family="qwen3", **renderer_options)
    return TitoTokenizer(renderer, FAMILIES[family])


def test_tools_take_the_sglang_model_shape():
    """SGLang v0.5.16 `Tool.model_dump()`: the tool-level defer_loading is always dumped (null when
    unset), the function-level one only when set; strict defaults to false (docs/upstream_session.md)."""
    bare = {"name": "Bash", "parameters": {"type": "object"}, "x-extra": 1}
    shaped = sglang_tools([TOOLS[0], bare])
    assert shaped[0] == {
        "type": "function",
        "function": {"description": "read", "name": "Read", "parameters": {"type": "object"}, "strict": False},
        "defer_loading": None,
    }
    assert list(shaped[0]) == ["type", "function", "defer_loading"]
    assert list(shaped[0]["function"]) == ["description", "name", "parameters", "strict"]
    assert shaped[1] == {
        "type": "function",
        "function": {"description": None, "name": "Bash", "parameters": {"type": "object"}, "strict": False},
        "defer_loading": None,
    }
    kept = sglang_tools([{"type": "function", "function": {"name": "W", "strict": "true"}}])
    assert kept[0]["function"]["strict"] is True


def test_defer_loading_is_dumped_as_the_sglang_model_does():
    tool_level = sglang_tools([{"type": "function", "function": {"name": "W"}, "defer_loading": "yes"}])[0]
    assert tool_level["defer_loading"] is True and tool_level["function"]["defer_loading"] is True  # propagated
    assert list(tool_level["function"]) == ["description", "name", "parameters", "strict", "defer_loading"]
    function_level = sglang_tools([{"type": "function", "function": {"name": "W", "defer_loading": False}}])[0]
    assert function_level["defer_loading"] is None and function_level["function"]["defer_loading"] is False
    with pytest.raises(ServerError, match="booleans"):
        sglang_tools([{"type": "function", "function": {"name": "W"}, "defer_loading": "later"}])
    assert sglang_tools([]) is None and sglang_tools(None) is None
    with pytest.raises(ServerError):
        sglang_tools([{"type": "function", "function": {"description": "no name"}}])


def test_template_messages_fill_content_and_parse_arguments():
    original = [user("q"), assistant(None, call("Read", '{"path":"a"}')), assistant(None)]
    prepared = template_messages(original)
    assert prepared[1]["content"] == "" and prepared[2]["content"] == ""
    assert prepared[1]["tool_calls"][0]["function"]["arguments"] == {"path": "a"}
    assert original[1]["content"] is None  # the caller's messages are untouched
    assert original[1]["tool_calls"][0]["function"]["arguments"] == '{"path":"a"}'
    with pytest.raises(ServerError, match="not JSON"):
        template_messages([assistant("", call("Read", "{path: a}"))])


def test_full_render_sees_prepared_messages_tools_and_family_kwargs():
    t = tito()
    ids = t.full_render([user("hi"), assistant(None), user("again")], TOOLS)
    text = t.renderer.decode(ids)
    assert "None" not in text  # content None was rendered as ""
    assert '"strict":false' in text and text.index('"description"') < text.index('"name"')
    assert t.renderer.calls[-1]["kwargs"] == {"clear_thinking": False}
    assert text.endswith("<|im_start|>assistant\n")


def test_incremental_prompt_equals_full_render_on_an_append_only_template():
    t = tito()
    first = [user("list files")]
    answer = assistant("", call("Bash", '{"cmd":"ls"}', call_id="b1"))
    checkpoint = t.full_render(first, TOOLS) + output_for(answer)
    grown = first + [answer, tool("a.py")]
    merged = t.merge_tokens(first + [answer], grown, checkpoint, TOOLS)
    assert merged == t.full_render(grown, TOOLS)
    assert merged[len(checkpoint)] == NEWLINE  # the boundary fix after the stop token


def test_suffix_is_only_the_appended_messages_and_generation_prompt():
    t = tito()
    old = [user("q"), assistant("a")]
    suffix = t.tokenize_additional(old, old + [user("more")], None)
    assert t.renderer.decode(suffix) == "<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"
    assert t.renderer.decode(t.tokenize_additional(old, old, None)) == "<|im_start|>assistant\n"


def test_dummy_base_carries_the_last_stored_tool_calls():
    t = tito()
    calls = [call("Read", '{"p":"x"}', call_id="r")]
    old = [user("q"), assistant("", *calls)]
    t.tokenize_additional(old, old + [tool("data")], None)
    base_assistant = t.renderer.calls[-1]["messages"][1]
    assert base_assistant["tool_calls"][0]["function"]["arguments"] == {"p": "x"}
    assert t.renderer.calls[-1]["messages"][0] == system("dummy system")
    assert base_assistant["reasoning_content"] == " "


def test_history_rewriting_template_fails_the_suffix_diff():
    t = tito(reasoning="last_only")  # the base assistant's reasoning vanishes once it is not last
    old = [user("q"), assistant("a")]
    with pytest.raises(ServerError, match="rendered suffix diff failed"):
        t.tokenize_additional(old, old + [tool("r")], None)


def test_template_error_retries_with_bare_functions_then_fails():
    t = tito(require_user=True)
    old = [user("q"), assistant("a")]
    with pytest.raises(ServerError, match="tool format fallback"):
        t.tokenize_additional(old, old + [tool("r")], TOOLS)
    assert t.renderer.calls[-1]["tools"] == [sglang_tools(TOOLS)[0]["function"]]
    with pytest.raises(ServerError, match="rendering failed"):
        t.tokenize_additional(old, old + [tool("r")], None)


def test_qwen_boundary_fix_and_default_identity():
    qwen, plain = tito("qwen3"), tito("default")
    assert qwen.fix_boundary([5, IM_END]) == [5, IM_END, NEWLINE]
    assert qwen.fix_boundary([5, 6]) == [5, 6]
    assert qwen.fix_boundary([]) == []
    assert plain.fix_boundary([5, IM_END]) == [5, IM_END]


def test_family_table():
    assert family_for(ToyRenderer(family="qwen3")).name == "qwen3"
    assert family_for(ToyRenderer(family="qwen3.5")).name == "qwen35"
    assert family_for(ToyRenderer(family="llama")).name == "default"
    assert family_for(ToyRenderer(family="qwen3"), "default").name == "default"
    with pytest.raises(UnknownName):
        family_for(ToyRenderer(), "glm99")
    assert family_for(ToyRenderer(family="glm4.5")).name == "glm47"
    assert all(f.max_trim_tokens == 0 for name, f in FAMILIES.items() if name != "glm47")
    assert FAMILIES["glm47"].max_trim_tokens == 1 and "<|observation|>" in FAMILIES["glm47"].dropped_boundaries
    assert "system" not in FAMILIES["qwen35"].allowed_append_roles
    assert "system" in FAMILIES["qwen3"].allowed_append_roles
    assert dict(FAMILIES["qwen35"].extra_kwargs) == {"clear_thinking": False}
    assert dict(FAMILIES["default"].extra_kwargs) == {}


def test_request_kwargs_merge_but_cannot_override_family_constants():
    t = tito()
    assert t.for_request(None) is t and t.for_request({}) is t
    merged = t.for_request({"enable_thinking": False, "clear_thinking": False})
    assert merged.template_kwargs == {"clear_thinking": False, "enable_thinking": False}
    with pytest.raises(RequestRejected, match="clear_thinking"):
        t.for_request({"clear_thinking": True})
    with pytest.raises(RequestRejected):
        t.for_request(["not", "an", "object"])
    assert tito("default").for_request({"clear_thinking": True}).template_kwargs == {"clear_thinking": True}


def test_the_dummy_base_renders_as_an_extension_of_the_dummy_system(tmp_path, monkeypatch):
    """The base changes every turn (it carries the last tool calls), the dummy system and the
    tools do not: after the first request only windows without the tools are rendered, and the
    suffix ids are those of full renders."""
    from trace_tools.render.renderer import Renderer
    from trace_tools.render.templates import resolve_template

    monkeypatch.setenv("TRACE_TOOLS_CACHE", str(tmp_path))
    renderer = Renderer("qwen3", resolve_template("qwen3")[0])
    t = TitoTokenizer(renderer, FAMILIES["qwen3"])
    history = [user("fix the bug")]
    fulls = []
    for turn in range(4):
        calls = [call("Read", f'{{"path": "f{turn}.py"}}', call_id=f"r{turn}")]
        old = [*history, assistant("", *calls)]
        new = [*old, tool(f"contents {turn}")]
        suffix = t.tokenize_additional(old, new, TOOLS)
        base = [system("dummy system"), template_messages([assistant("", *calls)])[0]]
        base[1]["reasoning_content"] = " "
        before = renderer._apply_template(template_messages(base), sglang_tools(TOOLS), False, {})
        after = renderer._apply_template(
            template_messages(base + [tool(f"contents {turn}")]), sglang_tools(TOOLS), True, {}
        )
        assert suffix == renderer.encode(after[len(before) :])
        fulls.append(renderer.engine.stats["full"])
        history = new
    assert fulls[0] >= 1 and fulls[-1] == fulls[0]  # nothing rendered in full after the first request
