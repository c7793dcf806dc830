"""`replay --overwrite` replaces the whole previous run: nothing it wrote survives to be read as
the new run's (`gate`, `report`, `export`, `open_run`), locally and in object storage (a real S3
server on loopback, `s3_server` in conftest)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import trace_tools.api as api
from trace_tools.api import open_run, replay
from trace_tools.cli.main import app
from trace_tools.io import storage
from trace_tools.replay.engine import default_dump

STRATEGIES = ["tree"]
QWEN3 = default_dump() / "qwen3.parquet"
QWEN3_5 = default_dump() / "qwen3_5.parquet"
runner = CliRunner()


def _session_ids(dump) -> set[str]:
    return set(pq.read_table(dump, columns=["session_id"]).column("session_id").to_pylist())


def _export_has_no_samples(run: str) -> None:
    result = runner.invoke(app, ["export", run, "-s", "tree"])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "Traceback" not in text and "--no-samples" in text and "holds no samples" in text


def test_an_overwrite_without_samples_leaves_no_samples_of_the_previous_run(tmp_path):
    """The previous run's samples (other sessions) must not be exported as this run's."""
    run = tmp_path / "run"
    replay(QWEN3, out=run, strategies=STRATEGIES, workers=1)
    assert (run / "samples" / "manifest.json").is_file()
    assert not _session_ids(QWEN3) & _session_ids(QWEN3_5)  # the two runs share no session
    result = runner.invoke(
        app, ["replay", str(QWEN3_5), "-s", "tree", "--workers", "1", "--out", str(run), "--overwrite", "--no-samples"]
    )
    assert result.exit_code == 0, result.output
    assert not (run / "samples").exists()
    _export_has_no_samples(str(run))
    opened = open_run(run)
    assert opened.samples.empty and set(opened.sessions["session_id"]) == _session_ids(QWEN3_5)


def test_an_overwrite_removes_every_file_of_the_previous_run_it_does_not_write_again(tmp_path):
    """A file of the previous run the new one would not write (here an export of its samples) is
    removed too; a file of the user's in a directory that was not a run is left alone."""
    run = tmp_path / "run"
    replay(QWEN3, out=run, strategies=STRATEGIES, workers=1)
    assert runner.invoke(app, ["export", str(run), "-s", "tree"]).exit_code == 0
    replay(QWEN3_5, out=run, strategies=STRATEGIES, workers=1, overwrite=True, write_samples=False)
    assert not (run / "export").exists() and (run / "summary.json").is_file()
    mine = tmp_path / "mine"
    (mine / "export").mkdir(parents=True)
    (mine / "export" / "notes.txt").write_text("kept")
    replay(QWEN3_5, out=mine, strategies=STRATEGIES, workers=1, overwrite=True, write_samples=False)
    assert (mine / "export" / "notes.txt").read_text() == "kept"


@pytest.fixture(scope="module")
def s3_runs(s3_server):
    """Two dumps in S3 and a finished run of the first, with samples."""
    bucket = s3_server()
    storage.upload(QWEN3.parent, f"{bucket}/dumps", [QWEN3.name, QWEN3_5.name])
    first, second = f"{bucket}/dumps/{QWEN3.name}", f"{bucket}/dumps/{QWEN3_5.name}"
    return bucket, first, second


def test_an_overwrite_without_samples_into_s3_replaces_the_previous_run(s3_runs):
    bucket, first, second = s3_runs
    out = f"{bucket}/runs/overwritten"
    replay(first, out=out, strategies=STRATEGIES, workers=1)
    assert storage.is_file(f"{out}/samples/manifest.json")
    result = runner.invoke(
        app, ["replay", second, "-s", "tree", "--workers", "1", "--out", out, "--overwrite", "--no-samples"]
    )
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert not storage.exists(f"{out}/samples/manifest.json")
    assert set(open_run(out).sessions["session_id"]) == _session_ids(QWEN3_5)
    _export_has_no_samples(out)


def test_gate_never_passes_on_the_previous_run_of_an_interrupted_overwrite_in_s3(s3_runs, tmp_path, monkeypatch):
    """An overwrite that stops after its new shards are uploaded leaves no summary.json of the
    previous run behind: `gate` refuses the unfinished run (exit 2) instead of passing on it."""
    bucket, first, second = s3_runs
    out = f"{bucket}/runs/interrupted"
    replay(first, out=out, strategies=STRATEGIES, workers=1)
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nmetric = "samples"\nstrategy = "tree"\nop = ">="\nvalue = 1\n')
    assert runner.invoke(app, ["gate", out, "--rules", str(rules)]).exit_code == 0

    def interrupted(engine, plots, bars):
        raise KeyboardInterrupt  # every shard written and uploaded, the summary not yet

    monkeypatch.setattr(api, "_finish", interrupted)
    with pytest.raises(KeyboardInterrupt):
        replay(second, out=out, strategies=STRATEGIES, workers=1, overwrite=True, write_samples=False)
    assert storage.is_file(f"{out}/shards/FINGERPRINT") and not storage.exists(f"{out}/summary.json")
    gated = runner.invoke(app, ["gate", out, "--rules", str(rules)])
    assert gated.exit_code == 2 and "not a finished run directory" in gated.output, gated.output
