"""Issue 40: `--tokenizer` takes what a user has: a built-in name, a directory, a Hugging Face model id
of a known family, or that id's snapshot in the local Hugging Face cache; anything else is refused
up front (exit 2) by every command that takes it, with the list of what would work."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from trace_tools.cli.main import app
from trace_tools.errors import UnknownName
from trace_tools.families import FAMILIES, HUB_IDS
from trace_tools.io.tokenizer_ref import cached_snapshot, find_tokenizer, resolve_tokenizer
from trace_tools.io.vocab import vocab_size_for
from trace_tools.render.tokenizer import load_tokenizer

REPO = Path(__file__).parents[1]
VLLM = REPO / "tests" / "fixtures" / "import" / "vllm_exchanges.jsonl"


def _invoke(*argv):
    return CliRunner().invoke(app, [str(a) for a in argv], env={"COLUMNS": "200", "NO_COLOR": "1"})


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face hub cache, named by $HF_HOME as the hub client does."""
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return tmp_path / "hf" / "hub"


def _cache_model(hub: Path, model_id: str, tokenizer: str = "qwen3", *, template: bool = True) -> Path:
    """Put `model_id` in the cache as the hub client does: a snapshot named by refs/main holding the
    tokenizer files (here the built-in tokenizer's tokenizer.json, plus a chat template)."""
    entry = hub / ("models--" + model_id.replace("/", "--"))
    snapshot = entry / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    shutil.copy(load_tokenizer(tokenizer).tokenizer_json, snapshot / "tokenizer.json")
    if template:
        (snapshot / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text("0123abcd")
    return snapshot


def test_every_listed_model_id_maps_to_its_family_and_is_documented():
    doc = (REPO / "docs" / "model_families.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Model ids") :]
    for family in FAMILIES.values():
        for hub_id in family.hub_ids:
            assert HUB_IDS[hub_id.lower()] == family.name
            assert f"`{hub_id}`" in section, f"{hub_id} is not in docs/model_families.md#model-ids"
    rows = [line for line in section.split("\n## ")[0].splitlines() if line.startswith("| `")]
    documented = {hub_id for row in rows for hub_id in re.findall(r"`([\w.-]+/[\w.-]+)`", row)}
    assert documented == {hub_id for family in FAMILIES.values() for hub_id in family.hub_ids}


def test_a_model_id_without_a_cache_is_its_familys_builtin_tokenizer(hub_cache):
    ref = resolve_tokenizer("Qwen/Qwen3-8B")
    assert (ref.source, ref.family, ref.via) == ("qwen3", "qwen3", "model id")
    assert resolve_tokenizer("qwen/qwen3-8b").source == "qwen3"  # the hub matches ids case-insensitively
    assert resolve_tokenizer("openai/gpt-oss-20b").source == "gpt-oss"
    assert vocab_size_for("Qwen/Qwen3-8B") == 151_669
    assert load_tokenizer("Qwen/Qwen3-8B") is load_tokenizer("qwen3")


@pytest.mark.parametrize("variable", ["HF_HOME", "HF_HUB_CACHE"])
def test_a_cached_model_id_is_its_snapshot(tmp_path, monkeypatch, variable):
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    hub = tmp_path / "hf" / "hub"
    monkeypatch.setenv(variable, str(hub if variable == "HF_HUB_CACHE" else hub.parent))
    snapshot = _cache_model(hub, "Qwen/Qwen3-8B")
    ref = resolve_tokenizer("Qwen/Qwen3-8B")
    assert (Path(ref.source), ref.family, ref.via) == (snapshot, "qwen3", "hub cache")
    assert load_tokenizer("Qwen/Qwen3-8B").encode("hello world") == load_tokenizer("qwen3").encode("hello world")


def test_an_unlisted_model_id_resolves_only_from_the_cache(hub_cache):
    assert find_tokenizer("my-org/my-finetune") is None
    snapshot = _cache_model(hub_cache, "my-org/my-finetune")
    assert cached_snapshot("my-org/my-finetune") == snapshot
    assert resolve_tokenizer("my-org/my-finetune").source == str(snapshot)


def test_a_typo_is_refused_with_what_would_work(hub_cache):
    with pytest.raises(UnknownName) as typo:
        resolve_tokenizer("qwen-3")
    message = str(typo.value)
    assert "did you mean 'qwen3'" in message and "Qwen/Qwen3-8B" in message and "tokenizer.json" in message
    with pytest.raises(UnknownName, match="did you mean 'Qwen/Qwen3-8B'"):
        resolve_tokenizer("Qwen/Qwen3_8B")


def _imported(tmp_path, tokenizer):
    out = tmp_path / "imported.parquet"
    result = _invoke("import", "openai", VLLM, "--session-key", "request.user", "--tokenizer", tokenizer, "--out", out)
    return result, out


def test_import_with_a_model_id_embeds_the_familys_template_and_checks_ids(tmp_path, hub_cache):
    result, out = _imported(tmp_path, "Qwen/Qwen3-8B")
    assert result.exit_code == 0, result.output
    assert "ids < 151669" in result.output and "warning" not in result.output
    metadata = pq.read_schema(out).metadata
    assert metadata[b"trace_tools.tokenizer"] == b"Qwen/Qwen3-8B"  # the dump keeps what the user gave
    replayed = _invoke("replay", out, "-s", "tree", "--out", tmp_path / "run", "--workers", "1")
    assert replayed.exit_code == 0, replayed.output
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert "qwen3" in json.dumps(run)


def test_import_with_a_cached_model_id_uses_the_snapshots_template(tmp_path, hub_cache):
    _cache_model(hub_cache, "Qwen/Qwen3-8B")
    result, out = _imported(tmp_path, "Qwen/Qwen3-8B")
    assert result.exit_code == 0, result.output
    assert "tokenizer:" in result.output  # the template's identity: the snapshot directory's own file


@pytest.mark.parametrize("command", ["import", "validate", "replay", "record"])
def test_every_command_refuses_an_unresolvable_tokenizer_up_front(command, tmp_path, simulated_dump, hub_cache):
    argv = {
        "import": ["import", "openai", VLLM, "--session-key", "request.user", "--out", tmp_path / "x.parquet"],
        "validate": ["validate", simulated_dump],
        "replay": ["replay", simulated_dump, "--out", tmp_path / "run"],
        "record": ["record", "--script", tmp_path / "none.json", "--out", tmp_path / "rec"],
    }[command]
    result = _invoke(*argv, "--tokenizer", "qwen-3")
    assert result.exit_code == 2, result.output
    assert "unknown tokenizer 'qwen-3' (did you mean 'qwen3'" in result.output
    assert "Qwen/Qwen3-8B" in result.output and "chat template" not in result.output
    assert not (tmp_path / "x.parquet").exists() and not (tmp_path / "run").exists()
