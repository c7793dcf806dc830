"""The on-disk cache (`io.cache`): explicit keys, one location, `trace-tools cache info|clear`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from trace_tools.cli.main import app
from trace_tools.io import cache, shards
from trace_tools.render import tokenizer_files
from trace_tools.replay.engine import default_dump

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


def test_library_versions_read_off_folder_names_are_what_importlib_metadata_says(tmp_path, monkeypatch):
    """Every distribution installed here, by its own spelling of its name; then one found only
    through importlib.metadata (an egg-info folder, no dist-info), and one not installed."""
    from importlib.metadata import distributions

    installed: dict[str, str] = {}
    for dist in distributions():  # in sys.path order: the first of a name is the one imported
        installed.setdefault(dist.metadata["Name"], dist.version)
    assert len(installed) > 20
    assert {name: cache.library_version(name) for name in installed} == installed
    assert cache.library_version("Jinja2") == cache.library_version("jinja2") == cache.library_version("JINJA2")
    egg = tmp_path / "old_style-1.2.3-py3.11.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 1.1\nName: old-style\nVersion: 1.2.3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cache.library_version.cache_clear()
    cache._dist_infos.cache_clear()
    try:
        assert "old-style" not in cache._dist_infos()
        assert cache.library_version("old-style") == "1.2.3"
        assert cache.library_version("no-such-distribution-here") == "absent"
    finally:
        cache.library_version.cache_clear()
        cache._dist_infos.cache_clear()


def test_run_json_records_the_versions_importlib_metadata_reports():
    """run.json's library versions, read as the cache keys read them: the same as
    importlib.metadata's, a library not installed left out."""
    import importlib.metadata as md

    from trace_tools import api

    expected = {}
    for package in ("pandas", "pyarrow", "tokenizers", "transformers", "jinja2", "tiktoken"):
        try:
            expected[package] = md.version(package)
        except md.PackageNotFoundError:
            pass
    assert api._versions() == expected and "pyarrow" in expected


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
    verdict = cache.CacheKey("render-checks", "rules", ("template",)).path(".json")
    verdict.parent.mkdir(parents=True)
    verdict.write_text('{"rules": null}')
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
    import trace_tools

    root = Path(trace_tools.__file__).parent
    needles = ('environ.get("TRACE_TOOLS_CACHE"', 'environ["TRACE_TOOLS_CACHE"', "XDG_CACHE_HOME", "cache_dir() /")
    readers = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if path.name != "cache.py" and any(needle in path.read_text() for needle in needles)
    ]
    assert readers == []


def test_clear_in_a_shared_folder_deletes_only_what_trace_tools_wrote(cache_root):
    """`$TRACE_TOOLS_CACHE` may point at a folder that holds other things, even in subfolders
    named like a kind: `cache clear` removes its own artefacts (by their `CacheKey` names) and
    nothing else."""
    theirs = {
        "models/llama-3-8b/weights.safetensors": "user's model",
        "bench/results.csv": "user's numbers",
        "tokenizers/notes.txt": "user's notes",
        "notes.txt": "kept",
    }
    for relative, text in theirs.items():
        (cache_root / relative).parent.mkdir(parents=True, exist_ok=True)
        (cache_root / relative).write_text(text)
    ours = [
        cache.CacheKey("models", "tiny-qwen3", ("recipe",)).path("/model.safetensors"),
        cache.CacheKey("bench", "one-turn-10").path(".parquet"),
        cache.CacheKey("render-checks", "rules", ("template",)).path(".json"),
    ]
    for path in ours:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("artefact")
    shown = {kind.kind: kind.entries for kind in cache.info().kinds}

    result = runner.invoke(app, ["cache", "clear"])
    assert result.exit_code == 0, result.output
    assert {relative: (cache_root / relative).read_text() for relative in theirs} == theirs
    assert not any(path.exists() for path in ours) and not (cache_root / "render-checks").exists()
    assert shown == {"render-checks": 1, "tokenizers": 0, "templates": 0, "models": 1, "bench": 1}  # what `info` counts


def _one_warning(stderr: str, folder) -> None:
    lines = [line for line in stderr.splitlines() if "trace-tools cache" in line and "cannot be written" in line]
    assert len(lines) == 1 and str(folder) in lines[0], stderr
    assert "one-message conversation" not in stderr and "Traceback" not in stderr


def _validate_and_replay(folder, tmp_path, wrap=(), workers=1, env=None) -> None:
    """`validate` and `replay` on the bundled sample with the cache at `folder` (an unusable one):
    both succeed, each warning once (worker processes included) that the cache is not kept."""
    sample = default_dump()
    env = {**os.environ, "TRACE_TOOLS_CACHE": str(folder), **(env or {})}
    env.pop("TRACE_TOOLS_CACHE_WARNED", None)
    base = [*wrap, sys.executable, "-m", "trace_tools.cli.main"]
    checked = subprocess.run([*base, "validate", str(sample)], env=env, capture_output=True, text=True, timeout=600)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    _one_warning(checked.stderr, folder)
    out = tmp_path / "run"
    argv = ["replay", str(sample), "-s", "tree", "--workers", str(workers), "--out", str(out)]
    replayed = subprocess.run([*base, *argv], env=env, capture_output=True, text=True, timeout=600)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    _one_warning(replayed.stderr, folder)
    sessions = {s for f in sample.glob("*.parquet") for s in pq.read_table(f, columns=["session_id"])[0].to_pylist()}
    assert json.loads((out / "summary.json").read_text())["strategies"]["tree"]["sessions"] == len(sessions)


@pytest.mark.slow  # a replay with nothing cached: every process builds its tokenizers
def test_a_cache_path_that_is_a_file_costs_only_recomputation(tmp_path):
    folder = tmp_path / "cache-file"
    folder.write_text("not a folder")
    _validate_and_replay(folder, tmp_path, workers=2)
    assert folder.read_text() == "not a folder"


@pytest.mark.slow  # a replay with nothing cached: every process builds its tokenizers
def test_a_tokenizer_json_that_is_a_folder_costs_only_recomputation(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("TRACE_TOOLS_CACHE", str(folder))
    for name in tokenizer_files.RECIPES:
        (tokenizer_files.tokenizer_json_key(name, tokenizer_files.ranks_path(name)).path("/tokenizer.json")).mkdir(
            parents=True
        )
    _validate_and_replay(folder, tmp_path)


@pytest.mark.slow  # a replay with nothing cached: every process builds its tokenizers
def test_a_read_only_cache_costs_only_recomputation(tmp_path):
    """An empty cache folder on a read-only mount (a bind mount in a user namespace: tests run as
    root, whom file permissions do not stop)."""
    folder = tmp_path / "cache"
    folder.mkdir()
    remount = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    wrap = ["unshare", "-rm", "sh", "-c", remount, str(folder)]
    if shutil.which("unshare") is None or subprocess.run([*wrap, "true"], capture_output=True).returncode != 0:
        pytest.skip("needs unshare with user and mount namespaces to make a read-only mount")
    probe = subprocess.run([*wrap, "touch", str(folder / "x")], capture_output=True, text=True)
    assert probe.returncode != 0 and "Read-only file system" in probe.stderr
    _validate_and_replay(folder, tmp_path, wrap)
    assert not any(folder.iterdir())


@pytest.mark.slow  # a replay with nothing cached: every process builds its tokenizers
def test_a_cache_folder_the_user_cannot_write_costs_only_recomputation():
    """The same as a user other than root (`setpriv`), for whom the folder's mode 0555 holds."""
    if shutil.which("setpriv") is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv to run as another user")
    home = Path(tempfile.mkdtemp(prefix="trace-tools-nobody-"))  # outside pytest's private tmp folders
    try:
        home.chmod(0o777)
        folder = home / "cache"
        folder.mkdir(mode=0o555)
        wrap = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        _validate_and_replay(folder, home, wrap, env={"HOME": str(home), "TMPDIR": str(home)})
        assert not any(folder.iterdir())
    finally:
        shutil.rmtree(home, ignore_errors=True)
