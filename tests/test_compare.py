"""`compare`: two strategies of one run, two runs, strategies by simulated behaviour; and its errors."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from trace_tools.api import replay
from trace_tools.cli.main import app
from trace_tools.errors import UsageError
from trace_tools.report.compare import compare, compare_by_behaviour

runner = CliRunner()


@pytest.fixture(scope="module")
def two_runs(simulated_dump, tmp_path_factory):
    """The simulated dump replayed by tree with slime's threshold and with agentcore's (0)."""
    base = tmp_path_factory.mktemp("compare")
    first = replay(simulated_dump, out=base / "slime", strategies=["tree", "linear"])
    second = replay(simulated_dump, out=base / "agentcore", strategies=["tree"], params={"fork_threshold": 0})
    return first, second


def test_two_strategies_of_one_run(sample_run):
    result = compare(sample_run.run_dir, strategies=["tree", "checkpoint-tree"])
    tree, ckpt = (sample_run.summary["strategies"][name] for name in ("tree", "checkpoint-tree"))
    metrics = result.metrics.set_index(["pair", "metric"])
    row = metrics.loc[("tree → checkpoint-tree", "coverage")]
    assert (row["a"], row["b"]) == (tree["coverage"], ckpt["coverage"])
    assert row["delta"] == pytest.approx(ckpt["coverage"] - tree["coverage"])
    sessions = pd.read_parquet(sample_run.run_dir / "sessions.parquet").set_index(["strategy", "session_id"])
    outcome = ["samples", "trained_tokens", "forwarded_tokens"]
    changed = {
        sid
        for sid in sessions.loc["tree"].index
        if (sessions.loc[("tree", sid), outcome] != sessions.loc[("checkpoint-tree", sid), outcome]).any()
    }
    assert set(result.sessions["session_id"]) == changed and changed


def test_two_runs_pair_their_common_strategies(two_runs):
    slime, agentcore = two_runs
    result = compare(slime.run_dir, agentcore.run_dir)
    assert set(result.metrics["pair"]) == {"tree", "run"}  # linear is only in the first run
    assert (result.only_a, result.only_b) == (["linear"], [])  # ... and the comparison says so
    shown = runner.invoke(app, ["compare", str(slime.run_dir), str(agentcore.run_dir)], env={"COLUMNS": "80"})
    assert "not compared, only in A: linear" in shown.output
    data = json.loads(runner.invoke(app, ["compare", str(agentcore.run_dir), str(slime.run_dir), "--json"]).output)
    assert (data["only_in_a"], data["only_in_b"]) == ([], ["linear"])
    merges = result.metrics.set_index("metric").loc["counters.rewrite_merges"]
    assert merges["b"] == 0 and merges["a"] == slime.summary["strategies"]["tree"]["counters"]["rewrite_merges"]
    same = compare(slime.run_dir, slime.run_dir)
    assert (same.metrics["delta"].fillna(0) == 0).all() and len(same.sessions) == 0


def test_a_strategy_missing_from_the_run_is_a_usage_error(two_runs):
    slime, agentcore = two_runs
    with pytest.raises(UsageError, match=r"has no strategy 'checkpoint-tree' \(it has: tree, linear\)"):
        compare(slime.run_dir, strategies=["tree", "checkpoint-tree"])
    with pytest.raises(UsageError, match="has no strategy 'linear'"):
        compare(slime.run_dir, agentcore.run_dir, strategies=["linear"])
    with pytest.raises(UsageError, match="naming two strategies"):
        compare(slime.run_dir, strategies=["tree"])


def test_cli_missing_strategy_exits_2_without_traceback(two_runs):
    """README tour line on a run without checkpoint-tree: a KeyError traceback and exit 1 before."""
    slime, _ = two_runs
    result = runner.invoke(app, ["compare", str(slime.run_dir), "-s", "tree", "-s", "checkpoint-tree"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "replay it with --strategy checkpoint-tree" in " ".join(result.output.split())


def test_cli_compare_fits_80_columns_and_shows_whole_ids(sample_run):
    result = runner.invoke(
        app, ["compare", str(sample_run.run_dir), "-s", "tree", "-s", "session-v2"], env={"COLUMNS": "80"}
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    ids = [line.split()[0] for line in lines if line.startswith("sim-")]
    assert len(ids) == len(set(ids)) > 1 and not any("…" in i for i in ids)


def test_cli_json_carries_every_table(two_runs):
    slime, agentcore = two_runs
    result = runner.invoke(app, ["compare", str(slime.run_dir), str(agentcore.run_dir), "--json"])
    data = json.loads(result.output)
    assert data["a"] == str(slime.run_dir) and {"metrics", "tools", "sessions"} <= set(data)


def test_by_behaviour_scores_against_ground_truth(sample_run):
    frame = compare_by_behaviour(sample_run.run_dir)
    assert len(frame) == 16 * len(sample_run.summary["strategies"])
    assert frame["trained_share"].between(0, 1).all()
    byte_exact = frame[frame["behaviour"] == "byte-exact"].set_index("strategy")
    assert byte_exact.loc["tree", "trained_share"] == 1.0  # a byte-exact echo loses nothing


def test_by_behaviour_needs_a_simulated_run_and_a_known_mode(simulated_dump, sample_run, tmp_path):
    import pyarrow.parquet as pq

    result = runner.invoke(app, ["compare", str(sample_run.run_dir), "--by", "tool"])
    assert result.exit_code == 2 and "choose one of: behaviour" in result.output
    table = pq.read_table(simulated_dump)
    pq.write_table(table.drop_columns(["metadata"]), tmp_path / "recorded.parquet")  # no ground truth
    run = replay(tmp_path / "recorded.parquet", out=tmp_path / "run", strategies=["tree"], write_samples=False)
    result = runner.invoke(app, ["compare", str(run.run_dir), "--by", "behaviour"])
    assert result.exit_code == 2 and "no simulator ground truth" in result.output
