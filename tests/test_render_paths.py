"""The reference path (`--reference`: transformers' apply_chat_template and tokenizer end to end)
and `--verify` (the fast path, every result compared with the reference one) against the fast
path, on the bundled sample."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trace_tools.cli.main import app
from trace_tools.render.fast_encoder import FastEncoder
from trace_tools.render.renderer import Renderer
from trace_tools.render.spec import RenderSpec

ROOT = Path(__file__).parents[1]
SAMPLE = ROOT / "sample_traces"
runner = CliRunner()


def _same_run():
    spec = importlib.util.spec_from_file_location("same_run", ROOT / "benchmarks" / "same_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_reference_replay_of_the_sample_is_the_fast_one(sample_run, tmp_path):
    """Every table, summary.json and report.md of the whole sample (both files, every strategy)
    are the same when every prompt is rendered by transformers' apply_chat_template and every
    text tokenized by transformers' tokenizer; only how prompts were rendered is recorded apart."""
    from trace_tools.api import replay

    reference = replay(None, out=tmp_path / "reference", workers=1, render_path="reference")
    same_run = _same_run()
    assert same_run.differences(Path(sample_run.run_dir), reference.run_dir, across_render_paths=True) == []
    assert reference.reconstruction["reference_renders"] > 1000
    assert reference.reconstruction["incremental_renders"] == 0 < sample_run.reconstruction["incremental_renders"]
    run_json = json.loads((reference.run_dir / "run.json").read_text())
    assert run_json["options"]["render_path"] == "reference"
    assert {r["path"] for r in run_json["renderers"]} == {"reference"}
    default = json.loads((Path(sample_run.run_dir) / "run.json").read_text())
    assert "render_path" not in default["options"] and all("path" not in r for r in default["renderers"])


def _replay_qwen3(out: Path, strategy: str, *flags: str):
    argv = ["replay", str(SAMPLE / "qwen3.parquet"), "-s", strategy, "--workers", "1", "--out", str(out), *flags]
    return runner.invoke(app, argv)


def _verify_counts(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())["reconstruction"]["verify"]


def _break_the_fast_encoder(monkeypatch) -> None:
    """A fast encoder that splits every blank line differently from the tokenizer. Broken above
    its memo, which earlier tests in this process have filled with correct pieces (and which
    then holds only true encodings of the altered pieces)."""
    original = FastEncoder._piece
    monkeypatch.setattr(FastEncoder, "_piece", lambda self, piece: original(self, piece.replace("\n\n", "\n \n")))


def test_verify_finds_a_broken_fast_encoder_keeps_the_reference_results_and_exits_1(tmp_path, monkeypatch):
    assert _replay_qwen3(tmp_path / "fast", "tree").exit_code == 0
    _break_the_fast_encoder(monkeypatch)
    result = _replay_qwen3(tmp_path / "verify", "tree", "--verify")
    assert result.exit_code == 1, result.output
    assert "differ from transformers" in result.output
    verify = _verify_counts(tmp_path / "verify")
    assert verify["differences"] > 0 and verify["by_kind"].get("ids", 0) > 0, verify
    assert _same_run().differences(tmp_path / "fast", tmp_path / "verify", across_render_paths=True) == []


def test_verify_of_a_clean_fast_path_exits_0_and_says_so(tmp_path):
    result = _replay_qwen3(tmp_path / "verify", "linear", "--verify")
    assert result.exit_code == 0, result.output
    assert "none differs" in result.output
    verify = _verify_counts(tmp_path / "verify")
    assert verify["checked"] > 100 and verify["differences"] == 0 and verify["by_kind"] == {}


def test_explain_on_the_reference_path_finds_what_the_fast_path_finds():
    from trace_tools.replay.explain import explain

    session = "sim-qwen3-s7-0001"
    fast = explain(SAMPLE, session, strategy="tree")
    reference = explain(SAMPLE, session, strategy="tree", render_path="reference")
    verified = explain(SAMPLE, session, render_path="verify")
    assert fast.findings and reference.to_dict() == fast.to_dict()
    assert verified.verify["checked"] > 0 and verified.verify["differences"] == 0
    assert "verify" not in fast.to_dict() and verified.to_dict()["verify"] == verified.verify


def test_explain_verify_reports_and_fails_on_a_difference(monkeypatch):
    _break_the_fast_encoder(monkeypatch)
    result = runner.invoke(app, ["explain", str(SAMPLE), "--session", "sim-qwen3-s7-0001", "--verify", "--json"])
    assert result.exit_code == 1, result.output
    assert "differ from transformers" in result.output


@pytest.mark.parametrize("command", ["replay", "explain"])
def test_reference_and_verify_together_are_a_usage_error(command):
    extra = ["--session", "x"] if command == "explain" else []
    result = runner.invoke(app, [command, str(SAMPLE), *extra, "--reference", "--verify"])
    assert result.exit_code == 2
    assert "exclude each other" in result.output


def test_the_render_path_is_part_of_the_render_spec():
    """The pool keys on the spec, so renderers on two paths are never shared; an unknown path is
    refused by name; run.json's identity names the path only off the default."""
    from trace_tools.errors import UnknownName

    fast, reference = (RenderSpec.resolve("qwen3", path=path) for path in ("fast", "reference"))
    assert fast != reference and len({fast, reference}) == 2
    assert "path" not in fast.identity() and reference.identity()["path"] == "reference"
    assert Renderer.from_render_spec(reference).spec == reference
    with pytest.raises(UnknownName, match="render path"):
        RenderSpec.resolve("qwen3", path="quick")


def test_the_reference_renderer_calls_transformers(monkeypatch):
    """The reference path renders through `apply_chat_template` and encodes through transformers'
    tokenizer, not through the fast runner or encoder."""
    renderer = Renderer.from_render_spec(RenderSpec.resolve("qwen3", path="reference"))
    calls = []
    hf = renderer.tokenizer.hf
    monkeypatch.setattr(type(hf), "apply_chat_template", lambda self, *a, **k: calls.append("template") or "x\n")
    monkeypatch.setattr(FastEncoder, "encode", lambda *a: pytest.fail("the fast encoder was used"))
    assert renderer.render([{"role": "user", "content": "hi"}]) == hf.encode("x\n", add_special_tokens=False)
    assert calls == ["template"]


def test_reconstruct_on_the_reference_path_matches_every_recorded_prompt():
    """transformers' own render of every sample turn equals the recorded prompt ids, as the fast
    path's does; --verify counts every turn's checks and finds no difference."""
    from trace_tools.reconstruct import reconstruct

    reference = reconstruct(SAMPLE, render_path="reference")
    assert (reference.summary["exact"], reference.summary["turns_compared"]) == (330, 330)
    verified = reconstruct(SAMPLE / "qwen3.parquet", render_path="verify").summary["verify"]
    # a render a turn (reconstruct parses no response, so decodes nothing on an exact sample)
    assert verified["checked"] >= 165 and verified["differences"] == 0, verified
