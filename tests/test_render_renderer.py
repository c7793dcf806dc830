"""Renderer.render equals transformers' apply_chat_template; delta renders verify their boundary."""

from __future__ import annotations

import copy
import json
from functools import lru_cache

import pytest

from trace_tools.data import DumpMeta
from trace_tools.errors import ReplayError, TraceToolsError
from trace_tools.render.families import resolve_family
from trace_tools.render.renderer import Renderer
from trace_tools.render.templates import resolve_template
from trace_tools.render.tokenizer import load_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Read",
            "description": "Read a file from disk.",
            "parameters": {
                "type": "object",
                "properties": {"file_path": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["file_path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "Edit",
            "description": "Replace text in a file.",
            "parameters": {
                "type": "object",
                "properties": {
                    "file_path": {"type": "string"},
                    "old_string": {"type": "string"},
                    "new_string": {"type": "string"},
                    "replace_all": {"type": "boolean"},
                },
                "required": ["file_path", "old_string", "new_string"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string"},
                    "timeout": {"type": "number"},
                    "env": {"type": "object"},
                    "args": {"type": "array"},
                },
                "required": ["command"],
            },
        },
    },
]


def _call(name, **arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATION = [
    {"role": "system", "content": "You are a careful coding agent working in /repo."},
    {"role": "user", "content": "The test in tests/test_utils.py fails. Fix utils.py, please."},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Start by reading the module.",
        "tool_calls": [_call("Read", file_path="/repo/utils.py")],
    },
    {"role": "tool", "content": "1\tdef slugify(s):  \n2\t    return s.lower()   \n3\t# 注释：处理空格\n"},
    {
        "role": "assistant",
        "content": "The function ignores spaces; I'll patch it and run the tests.",
        "reasoning_content": "Need to replace spaces with dashes.\nKeep trailing whitespace intact.",
        "tool_calls": [
            _call(
                "Edit",
                file_path="/repo/utils.py",
                old_string="    return s.lower()   \n",
                new_string="    return s.lower().replace(' ', '-')\n",
                replace_all=False,
            ),
            _call("Bash", command="cd /repo && python -m pytest -q tests/test_utils.py", timeout=120),
        ],
    },
    {"role": "tool", "content": "The file /repo/utils.py has been updated."},
    {"role": "tool", "content": "..\n2 passed in 0.03s\n"},
    {
        "role": "assistant",
        "content": "Fixed: `slugify` now turns spaces into dashes; both tests pass.",
        "reasoning_content": "Done.",
    },
    {"role": "user", "content": "Great. Also run the linter with the CI env."},
    {
        "role": "assistant",
        "content": "Running ruff.",
        "tool_calls": [
            _call(
                "Bash",
                command="ruff check .\nruff format --check .  ",
                env={"CI": "1", "PATHS": ["src", "tests"], "nested": {"depth": 2}},
                args=["-q", "--no-cache"],
            )
        ],
    },
    {"role": "tool", "content": "All checks passed!"},
]


@lru_cache(maxsize=None)
def _renderer(name: str) -> Renderer:
    text, identity = resolve_template(name)
    return Renderer(load_tokenizer(name), text, template_identity=identity)


@lru_cache(maxsize=None)
def _reference_tokenizer(name: str):
    """An independent transformers tokenizer over the same tokenizer.json."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(load_tokenizer(name).tokenizer_json))


def _reference(name, messages, tools, generation, **kwargs):
    tok = _reference_tokenizer(name)
    return tok.apply_chat_template(
        copy.deepcopy(messages),
        tools=tools,
        chat_template=_renderer(name).chat_template,
        add_generation_prompt=generation,
        tokenize=True,
        return_dict=False,
        **kwargs,
    )


def _prefixes():
    """Every prompt a gateway renders (ends at a user/tool turn) and every assistant-ending history."""
    for end in range(2, len(CONVERSATION) + 1):
        yield CONVERSATION[:end], CONVERSATION[end - 1]["role"] != "assistant"


@pytest.mark.parametrize("name", ["qwen3", "qwen3.5"])
@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}])
def test_render_equals_apply_chat_template(name, kwargs):
    renderer = _renderer(name)
    for messages, generation in _prefixes():
        ours = renderer.render(messages, TOOLS, generation, **kwargs)
        assert ours == _reference(name, messages, TOOLS, generation, **kwargs)
        assert renderer.decode(ours) == renderer.render_text(messages, TOOLS, generation, **kwargs)


def test_render_handles_wire_shapes_like_transformers():
    """OpenAI wire messages: content None, JSON-string arguments, ids; transformers drops None keys."""
    messages = [
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py\nb.py"},
    ]
    renderer = _renderer("qwen3")
    assert renderer.render(messages, TOOLS) == _reference("qwen3", messages, TOOLS, True)
    assert "None" not in renderer.render_text(messages, TOOLS)


def test_template_kwargs_default_and_override():
    text, _ = resolve_template("qwen3")
    quiet = Renderer("qwen3", text, template_kwargs={"enable_thinking": False})
    prompt = quiet.render_text(CONVERSATION[:2])
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert quiet.render_text(CONVERSATION[:2], enable_thinking=True).endswith("<|im_start|>assistant\n")


def test_cache_hits_return_independent_copies():
    renderer = _renderer("qwen3.5")
    messages = CONVERSATION[:4]
    before = renderer.cache_info().get("cache_hits", 0)
    first = renderer.render(messages, TOOLS)
    first.append(-1)
    second = renderer.render(messages, TOOLS)
    assert second[-1] != -1 and renderer.cache_info()["cache_hits"] > before
    # Argument key order is part of what renders, so it is part of the key.
    swapped = copy.deepcopy(CONVERSATION[:6])
    swapped[4]["tool_calls"][0]["function"]["arguments"] = dict(
        reversed(list(swapped[4]["tool_calls"][0]["function"]["arguments"].items()))
    )
    assert renderer.render(swapped, TOOLS) == _reference("qwen3.5", swapped, TOOLS, True)
    assert renderer.render(swapped, TOOLS) != renderer.render(CONVERSATION[:6], TOOLS)


@pytest.mark.parametrize("name", ["qwen3", "qwen3.5"])
def test_prompts_rendered_turn_by_turn_stay_exact_where_they_share_their_lists(name):
    """Each turn's prompt takes over the list of its own plain render (one copy of the history a
    turn): every prompt handed out stays as it was while later turns render, and the plain
    renders asked for afterwards are the tokenizer's, not the longer list they share."""
    renderer = _renderer(name)
    turns = [end for end in range(2, len(CONVERSATION) + 1) if CONVERSATION[end - 1]["role"] != "assistant"]
    handed = [(end, renderer.render(CONVERSATION[:end], TOOLS)) for end in turns]
    kept = [list(ids) for _, ids in handed]
    assert renderer.cache_info()["incremental"] > 0
    for (end, ids), before in zip(handed, kept):
        assert ids == before == _reference(name, CONVERSATION[:end], TOOLS, True)
        assert renderer.render(CONVERSATION[:end], TOOLS, False) == _reference(name, CONVERSATION[:end], TOOLS, False)


# No end-of-turn token: a plain render's last hard boundary is its last turn's opening token, the
# token its generation prompt opens with again, so a render that took the shared list for the
# plain render's own would cut the next turn's ids at the wrong occurrence.
OPEN_TURNS = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_prompt_that_repeats_the_last_boundary_leaves_the_next_turn_exact():
    renderer = Renderer("qwen3", OPEN_TURNS)
    conversation = [{"role": "user", "content": "Fix the failing test."}] + [
        {"role": "tool" if i % 2 == 0 else "assistant", "content": f"message {i} " + "word " * i} for i in range(1, 12)
    ]
    for end in range(2, len(conversation) + 1, 2):
        text = renderer.render_text(conversation[:end])
        assert renderer.render(conversation[:end]) == renderer.encode(text)
    assert renderer.cache_info()["incremental"] > 0


@pytest.mark.parametrize("name", ["qwen3", "qwen3.5"])
def test_encoding_a_growing_text_reuses_its_last_ids_and_equals_the_tokenizer(name):
    """AReaL's ChatML text grows by a turn each call: only what follows the last added token the
    two texts share is encoded again, and the ids are the tokenizer's whole-text ids, also where a
    text shares no boundary with the last (a BPE merge across the cut would otherwise differ)."""
    from trace_tools.strategies.areal import chatml

    renderer = Renderer(load_tokenizer(name), _renderer(name).chat_template)
    texts = [chatml(CONVERSATION[:end]) for end in range(1, len(CONVERSATION) + 1)]
    texts += ["no boundary at all\n\n", "no boundary at all\n\nextended", texts[2], texts[-1] + "\n\n\n"]
    for text in texts:
        reused = renderer.cache_info().get("tokens_reused", 0)
        assert renderer.encode_growing(text) == _reference_tokenizer(name).encode(text, add_special_tokens=False)
        if text.startswith(texts[0]) and text is not texts[0]:
            assert renderer.cache_info()["tokens_reused"] > reused
    renderer.reset_caches()  # a new session starts from nothing
    assert renderer.encode_growing(texts[1]) == renderer.encode(texts[1])


@pytest.mark.parametrize("name", ["qwen3", "qwen3.5"])
def test_render_delta_appends_tool_results(name):
    renderer = _renderer(name)
    prev, new = CONVERSATION[:5], CONVERSATION[5:7]
    delta = renderer.render_delta(prev, new, TOOLS)
    assert delta is not None
    assert renderer.render(prev, TOOLS, False) + delta == renderer.render(prev + new, TOOLS, True)


def test_render_delta_refuses_when_the_template_rewrites_history():
    # Qwen3 drops the reasoning of assistant turns before the newest user query.
    renderer = _renderer("qwen3")
    prev, new = CONVERSATION[:8], CONVERSATION[8:9]
    assert "Done." in renderer.render_text(prev, TOOLS, False)
    assert renderer.render_delta(prev, new, TOOLS) is None


PLAIN = "{% for m in messages %}{{ m.content }}{% endfor %}"
ANCHORED = "<|im_start|>{% for m in messages %}{{ m.content }}{% endfor %}"


@pytest.mark.parametrize("template", [PLAIN, ANCHORED])
def test_render_delta_detects_tokenizer_boundary_merges(template):
    renderer = Renderer("qwen3", template)
    prev = [{"role": "user", "content": "first line\n"}]
    # "\n" + "\n" would be two 198 tokens apart but is one 271 token together.
    merged = [{"role": "user", "content": "\nsecond"}]
    assert renderer.render_text(prev + merged).startswith(renderer.render_text(prev, add_generation_prompt=False))
    assert renderer.render_delta(prev, merged) is None
    clean = [{"role": "user", "content": "second"}]
    delta = renderer.render_delta(prev, clean)
    assert delta is not None
    assert renderer.render(prev, add_generation_prompt=False) + delta == renderer.render(prev + clean)


def test_family_reasoning_and_stop_tokens():
    qwen3, qwen35 = _renderer("qwen3"), _renderer("qwen3.5")
    assert (qwen3.family, qwen3.tool_format) == ("qwen3", "json")
    assert (qwen35.family, qwen35.tool_format) == ("qwen3.5", "xml")
    llama31 = resolve_family(resolve_template("trl:llama3_1")[0], None)
    assert llama31 is not None and llama31.tool_format == "llama"
    assert resolve_family(resolve_template("trl:llama3")[0], None) is None  # Llama 3.0: no tool calls
    assert qwen35.reasoning_open() and not qwen35.reasoning_open(enable_thinking=False)
    assert not qwen3.reasoning_open()
    assert qwen3.eos_token_id == 151645 and qwen35.eos_token_id == 248046
    assert qwen3.stop_token_ids == [151645, 151643]


def test_identity_and_from_spec():
    mini = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    renderer = Renderer.from_spec(None, dump_meta=DumpMeta(tokenizer="qwen3", chat_template=mini))
    assert renderer.chat_template == mini
    identity = renderer.identity
    assert identity["tokenizer"] == "qwen3" and identity["template"].startswith("dump sha256=")
    assert identity["transformers"]
    assert Renderer.from_spec("qwen3.5").template_identity.startswith("trl:qwen3_5_think.jinja")
    with pytest.raises(TraceToolsError, match="--tokenizer"):
        Renderer.from_spec(None, dump_meta=DumpMeta())


def test_template_failures_are_replay_errors():
    with pytest.raises(ReplayError, match="No user query"):
        _renderer("qwen3.5").render([{"role": "system", "content": "only a system prompt"}])


def test_local_tokenizer_directory_with_its_own_template(tmp_path):
    mini = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    (tmp_path / "tokenizer.json").write_bytes(load_tokenizer("qwen3").tokenizer_json.read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>", "chat_template": mini})
    )
    renderer = Renderer.from_spec(str(tmp_path))
    assert renderer.template_identity.startswith(f"tokenizer:{tmp_path.resolve()}")
    expected = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert renderer.render_text([{"role": "user", "content": "hi"}]) == expected
    assert renderer.render([{"role": "user", "content": "hi"}]) == load_tokenizer("qwen3").encode(expected)


def test_renderer_pickles_for_process_pools():
    import pickle

    text, _ = resolve_template("qwen3.5")
    original = Renderer("qwen3.5", text, template_kwargs={"enable_thinking": False}, template_identity="x")
    original.render(CONVERSATION[:2], TOOLS)  # warm caches and the lazy transformers tokenizer
    clone = pickle.loads(pickle.dumps(original))
    assert clone.render(CONVERSATION[:4], TOOLS) == original.render(CONVERSATION[:4], TOOLS)
    assert (clone.template_kwargs, clone.template_identity, clone.tool_format) == (
        {"enable_thinking": False},
        "x",
        "xml",
    )
