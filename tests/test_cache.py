"""The on-disk cache (`io.cache`): explicit keys, one location, `trace-tools cache info|clear`."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from trace_tools.cli.main import app
from trace_tools.io import cache, shards

runner = CliRunner()


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACE_TOOLS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_key_changes_with_each_thing_it_names(cache_root):
    key = cache.CacheKey("render-checks", "rules", ("template",), "code1", ("jinja2",))
    assert key.path(".json").parent == cache_root / "render-checks"
    assert key.path(".json").name == f"rules-{key.digest()}.json"
    assert key.digest() == cache.CacheKey("render-checks", "rules", ("template",), "code1", ("jinja2",)).digest()
    others = [replace(key, inputs=("other",)), replace(key, code="code2"), replace(key, libraries=("jinja2", "python"))]
    assert len({key.digest(), *(other.digest() for other in others)}) == 4
    with pytest.raises(ValueError, match="unknown cache kind"):
        cache.CacheKey("nowhere", "x").path()


def test_a_library_version_is_part_of_the_key(cache_root, monkeypatch):
    key = cache.CacheKey("tokenizers", "qwen3", ("ranks",), libraries=("tokenizers",))
    before = key.digest()
    monkeypatch.setattr(cache, "library_version", lambda name: "0.0-other")
    assert key.digest() != before


def test_the_location_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("TRACE_TOOLS_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "trace-tools"
    monkeypatch.setenv("TRACE_TOOLS_CACHE", str(tmp_path / "mine"))
    assert cache.cache_dir() == tmp_path / "mine" and cache.info().from_env


def test_the_run_fingerprint_digests_code_with_the_cache_s_code_digest():
    assert shards.code_digest() == cache.code_digest(*shards.RESULT_CODE)
    assert cache.code_digest("render") != cache.code_digest("render", "io")


def test_tokenizer_files_are_keyed_by_recipe_and_ranks(cache_root, monkeypatch):
    """The tokenizer.json of a built-in name moves when its recipe changes (no version to bump)."""
    from trace_tools.render import tokenizer_files

    ranks = tokenizer_files.ranks_path("qwen3")
    before = tokenizer_files.tokenizer_json_key("qwen3", ranks).path()
    recipe = tokenizer_files.RECIPES["qwen3"]
    monkeypatch.setitem(tokenizer_files.RECIPES, "qwen3", replace(recipe, eos="<|endoftext|>"))
    after = tokenizer_files.tokenizer_json_key("qwen3", ranks).path()
    assert before != after and before.parent == after.parent == cache_root / "tokenizers"


def test_every_cached_artefact_of_a_replay_is_listed_and_cleared_by_kind(cache_root, tmp_path):
    """A fresh process (this one keeps its tokenizers loaded) replays into an empty cache."""
    import os
    import subprocess
    import sys

    from trace_tools.replay.engine import default_dump

    dump, out = default_dump() / "qwen3.parquet", tmp_path / "run"
    argv = [sys.executable, "-m", "trace_tools.cli.main", "replay", str(dump), "-s", "tree", "--workers", "1"]
    env = {**os.environ, "TRACE_TOOLS_CACHE": str(cache_root)}
    done = subprocess.run([*argv, "--out", str(out)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (cache_root / "unrelated.txt").write_text("kept")
    found = {kind.kind: kind for kind in cache.info().kinds}
    assert found["render-checks"].entries >= 2 and found["tokenizers"].entries >= 2  # verdicts; json + ranks
    on_disk = sum(p.stat().st_size for p in (cache_root / "tokenizers").rglob("*") if p.is_file())
    assert found["tokenizers"].bytes == on_disk > 1_000_000

    cleared = cache.clear(["render-checks"])
    assert [kind.kind for kind in cleared.kinds] == ["render-checks"]
    assert not (cache_root / "render-checks").exists() and (cache_root / "tokenizers").is_dir()
    cache.clear()
    assert cache.info().bytes == 0 and (cache_root / "unrelated.txt").read_text() == "kept"


def test_cache_commands(cache_root):
    (cache_root / "render-checks").mkdir(parents=True)
    (cache_root / "render-checks" / "rules-0123.json").write_text('{"rules": null}')
    result = runner.invoke(app, ["cache", "info", "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["location"] == str(cache_root) and shown["kinds"]["render-checks"] == {
        "entries": 1,
        "bytes": 15,
        "description": cache.KINDS["render-checks"],
    }
    table = runner.invoke(app, ["cache", "info"])
    assert table.exit_code == 0 and "render-checks" in table.output and "15 B" in table.output

    assert runner.invoke(app, ["cache", "clear", "--kind", "render-checks"]).exit_code == 0
    assert not (cache_root / "render-checks").exists()
    wrong = runner.invoke(app, ["cache", "clear", "--kind", "everything"])
    assert wrong.exit_code == 2 and "unknown cache kind" in wrong.output and "Traceback" not in wrong.output


def test_only_the_cache_module_knows_where_the_cache_is():
    """Every artefact goes through `io.cache` (its location, its keys): no other module reads the
    environment variable or builds a path of its own under the cache folder."""
    from pathlib import Path

    import trace_tools

    root = Path(trace_tools.__file__).parent
    needles = ('environ.get("TRACE_TOOLS_CACHE"', 'environ["TRACE_TOOLS_CACHE"', "XDG_CACHE_HOME", "cache_dir() /")
    readers = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if path.name != "cache.py" and any(needle in path.read_text() for needle in needles)
    ]
    assert readers == []
