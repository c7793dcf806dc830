"""`trace-tools export`: a strategy's samples leave the run exactly, in the trainers' layout."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
from typer.testing import CliRunner

from trace_tools.cli.main import app
from trace_tools.io.export import export_samples, read_export
from trace_tools.io.sample_parts import read_samples


@pytest.fixture(scope="module")
def run_samples(sample_run):
    return read_samples(sample_run.run_dir).to_pandas()


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
@pytest.mark.parametrize("strategy", ["tree", "linear", "session-v2", "checkpoint-tree"])
def test_export_reloads_equal_to_the_run_samples(tmp_path, sample_run, run_samples, strategy, fmt):
    report = export_samples(sample_run.run_dir, strategy, fmt, tmp_path / f"out.{fmt}")
    rows = read_export(report.out)
    expected = run_samples[run_samples["strategy"] == strategy].to_dict("records")
    assert len(rows) == len(expected) == report.samples > 0
    for row, sample in zip(rows, expected):
        assert row["tokens"] == list(sample["token_ids"])
        assert row["loss_mask"] == list(sample["loss_mask"])
        assert row["rollout_log_probs"] == [lp if m else 0.0 for lp, m in zip(sample["logprobs"], sample["loss_mask"])]
        assert row["turn_of_token"] == list(sample["source_turn"])
        assert (row["session_id"], row["sample_index"], row["response_length"], row["reward"]) == (
            sample["session_id"],
            sample["sample_index"],
            sample["response_length"],
            sample["reward"],
        )
        assert row["metadata"] == {**json.loads(sample["metadata"]), "trace_tools": row["metadata"]["trace_tools"]}
    trained = sum(sum(row["loss_mask"]) for row in rows)
    assert trained == report.trained_tokens == sample_run.summary["strategies"][strategy]["trained_tokens"]


def test_a_trainer_reads_it_with_pandas(tmp_path, sample_run):
    """What the README shows: prompt region, response region, masked logprobs."""
    out = export_samples(sample_run.run_dir, "tree", "parquet", tmp_path / "tree.parquet").out
    frame = pd.read_parquet(out)
    assert list(frame.columns) == [
        "tokens",
        "loss_mask",
        "rollout_log_probs",
        "response_length",
        "reward",
        "session_id",
        "strategy",
        "sample_index",
        "turn_of_token",
        "metadata",
    ]
    for row in frame.itertuples():
        prompt_length = len(row.tokens) - row.response_length
        assert len(row.loss_mask) == len(row.rollout_log_probs) == row.response_length
        assert (row.turn_of_token[:prompt_length] == -1).all()
        assert ((row.loss_mask == 0) <= (row.rollout_log_probs == 0.0)).all()
        trained_turns = json.loads(row.metadata)["trace_tools"]["trained_turns"]
        region = row.turn_of_token[prompt_length:]
        assert sorted(set(region[row.loss_mask == 1])) == trained_turns


def test_default_path_and_usage_errors(sample_run, tmp_path):
    runner = CliRunner()
    run = shutil.copytree(sample_run.run_dir, tmp_path / "run")  # the shared run stays untouched
    result = runner.invoke(app, ["export", str(run), "--strategy", "chains", "--format", "jsonl"])
    assert result.exit_code == 0, result.output
    assert (run / "export" / "chains.jsonl").is_file()
    for args, message in [
        (["--strategy", "nope"], "unknown strategy in this run 'nope'"),
        (["--strategy", "tree", "--format", "csv"], "unknown export format"),
    ]:
        result = runner.invoke(app, ["export", str(sample_run.run_dir), *args])
        assert result.exit_code == 2 and message in result.output
    (tmp_path / "bare").mkdir()
    result = runner.invoke(app, ["export", str(tmp_path / "bare"), "--strategy", "tree"])
    assert result.exit_code == 2 and "is not a finished run directory" in result.output
    shutil.rmtree(run / "samples")
    result = runner.invoke(app, ["export", str(run), "--strategy", "tree"])
    assert result.exit_code == 2 and "replay again without --no-samples" in result.output
