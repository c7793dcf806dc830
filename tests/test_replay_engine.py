"""The replay engine and the run directory contract (docs/run_directory.md#what-the-files-hold)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from trace_tools.api import replay
from trace_tools.cli.main import app
from trace_tools.data import COUNTERS, ReplayResult
from trace_tools.errors import UsageError
from trace_tools.io.sample_parts import read_samples
from trace_tools.strategies.base import Strategy
from trace_tools.strategies.declarations import Declaration
from trace_tools.strategies.registry import REGISTRY, register

SESSION_COLUMNS = [
    "strategy",
    "session_id",
    "samples",
    "forks",
    "generated_tokens",
    "trained_tokens",
    "forwarded_tokens",
    "context_tokens",
    *COUNTERS,
]
TURN_COLUMNS = [
    "strategy",
    "session_id",
    "turn_index",
    "tool",
    "tool_names",
    "generated_tokens",
    "trained_tokens",
    "event",
    "prompt_event",
]
SAMPLE_COLUMNS = [
    "strategy",
    "session_id",
    "sample_index",
    "token_ids",
    "response_length",
    "loss_mask",
    "logprobs",
    "source_turn",
    "reward",
]


def test_run_directory_contract(sample_run):
    run = sample_run.run_dir
    for name in (
        "run.json",
        "turns.parquet",
        "sessions.parquet",
        "samples/manifest.json",
        "quarantine.parquet",
        "summary.json",
        "report.md",
    ):
        assert (run / name).is_file(), name
    assert list((run / "plots").glob("*.png"))
    assert set(SESSION_COLUMNS) <= set(pd.read_parquet(run / "sessions.parquet").columns)
    assert set(TURN_COLUMNS) <= set(pd.read_parquet(run / "turns.parquet").columns)
    assert set(SAMPLE_COLUMNS) <= set(read_samples(run).column_names)
    assert list(pd.read_parquet(run / "quarantine.parquet").columns) == ["session_id", "turn_index", "reason", "detail"]


def test_samples_parts_carry_statistics_for_the_one_value_columns_only(sample_run):
    """docs/run_directory.md#samples: a reader can filter a part's row groups on strategy, session,
    sample index, response length, reward and step; the token lists carry no min/max."""
    import pyarrow.parquet as pq

    from trace_tools.io.sample_parts import samples_files

    one_value = {"strategy", "session_id", "sample_index", "response_length", "reward", "step"}
    for part in samples_files(sample_run.run_dir):
        metadata = pq.ParquetFile(part).metadata
        for group in range(metadata.num_row_groups):
            columns = [metadata.row_group(group).column(i) for i in range(metadata.num_columns)]
            with_statistics = {c.path_in_schema for c in columns if c.is_stats_set}  # step: its null count
            assert with_statistics == one_value
            strategy = next(c for c in columns if c.path_in_schema == "strategy").statistics
            assert strategy.min <= strategy.max  # real bounds a filter can use


def test_summary_numbers_match_the_tables(sample_run):
    run = sample_run.run_dir
    summary = json.loads((run / "summary.json").read_text())
    sessions = pd.read_parquet(run / "sessions.parquet")
    turns = pd.read_parquet(run / "turns.parquet")
    for name, block in summary["strategies"].items():
        s = sessions[sessions["strategy"] == name]
        t = turns[turns["strategy"] == name]
        assert block["samples"] == s["samples"].sum()
        assert block["trained_tokens"] == t["trained_tokens"].sum() == s["trained_tokens"].sum()
        assert block["forks"]["max"] == s["forks"].max()
        assert 0.0 <= block["coverage"] <= 1.0
        for tool, frac in block["coverage_by_tool"].items():
            g = t[t["tool"] == tool]
            assert frac == pytest.approx(g["trained_tokens"].sum() / g["generated_tokens"].sum())


def test_every_session_is_accounted_for(sample_run):
    summary = sample_run.summary
    sessions = pd.read_parquet(sample_run.run_dir / "sessions.parquet")
    for name in summary["strategies"]:
        assert (
            sessions[sessions["strategy"] == name]["session_id"].nunique() + summary["quarantined"]
            >= summary["sessions_total"]
        )


def test_shards_of_another_format_are_never_resumed(simulated_dump, tmp_path, monkeypatch):
    """A run written with an earlier shard layout (samples as Parquet) must not lend its shards to
    this one, whose merge reads Arrow IPC: it is refused, then replayed in full under --overwrite."""
    from trace_tools.io import shards

    out = tmp_path / "run"
    monkeypatch.setattr(shards, "SHARD_FORMAT", shards.SHARD_FORMAT - 1)
    replay(simulated_dump, out=out, strategies=["tree"])
    monkeypatch.undo()
    with pytest.raises(UsageError, match="an earlier trace-tools shard format"):
        replay(simulated_dump, out=out, strategies=["tree"])
    again = replay(simulated_dump, out=out, strategies=["tree"], overwrite=True)
    fresh = replay(simulated_dump, out=tmp_path / "fresh", strategies=["tree"])
    assert again.resumed_shards == 0
    assert read_samples(out).equals(read_samples(tmp_path / "fresh"))
    assert again.summary["strategies"] == fresh.summary["strategies"]


def test_rerun_resumes_finished_shards(simulated_dump, tmp_path):
    out = tmp_path / "run"
    first = replay(simulated_dump, out=out, strategies=["tree"])
    shard = out / "shards" / "0000000.sessions.parquet"
    stamp = shard.stat().st_mtime_ns
    second = replay(simulated_dump, out=out, strategies=["tree"])
    assert shard.stat().st_mtime_ns == stamp
    assert second.summary == first.summary
    assert (first.resumed_shards, second.resumed_shards) == (0, 1)
    with pytest.raises(UsageError, match=r"other options \(params: \{\} → \{'fork_threshold': 0\}\); pass --overw"):
        replay(simulated_dump, out=out, strategies=["tree"], params={"fork_threshold": "0"})
    assert shard.stat().st_mtime_ns == stamp  # the finished run was left alone
    third = replay(simulated_dump, out=out, strategies=["tree"], params={"fork_threshold": 0}, overwrite=True)
    assert shard.stat().st_mtime_ns != stamp  # other options: the shard was recomputed
    assert third.summary["strategies"]["tree"]["counters"]["rewrite_merges"] == 0


class _Exploding(Strategy):
    declaration = Declaration("test-exploding", "explode", "raises on every session whose id ends in 1")

    def replay(self, session):
        if session.session_id.endswith("1"):
            raise RuntimeError("boom")
        return ReplayResult()


def test_a_failing_session_is_quarantined_and_the_run_goes_on(simulated_dump, tmp_path):
    register(_Exploding)
    try:
        result = replay(simulated_dump, out=tmp_path / "run", strategies=["tree", "test-exploding"])
    finally:
        REGISTRY.pop("test-exploding")
    quarantine = pd.read_parquet(result.run_dir / "quarantine.parquet")
    assert (quarantine["reason"] == "replay_error").any()
    assert quarantine["detail"].str.contains("boom").all()
    tree = result.summary["strategies"]["tree"]
    assert tree["sessions"] == result.sessions_replayed  # tree still replayed every session


def test_strict_exits_1_when_quarantined(tmp_path, simulated_dump):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(simulated_dump)
    messages = table.column("messages").to_pylist()
    broken = table.set_column(
        table.schema.get_field_index("messages"), "messages", pa.array(["not json"] + messages[1:], pa.string())
    )
    path = tmp_path / "broken.parquet"
    pq.write_table(broken.replace_schema_metadata(table.schema.metadata), path)
    runner = CliRunner()
    args = ["replay", str(path), "--strategy", "tree", "--out", str(tmp_path / "run")]
    assert runner.invoke(app, args).exit_code == 0
    strict = runner.invoke(app, args + ["--strict"])
    assert strict.exit_code == 1
    assert "bad_json" in strict.output


def test_replay_prints_the_dumps_warnings_with_their_fix(tmp_path, monkeypatch):
    """A warning the loader raises about the dump (here: a row group read as several row ranges)
    reaches the user, not only `validate`."""
    import pyarrow.parquet as pq

    from trace_tools.io import dump_files
    from trace_tools.io.bundled import sample_dir

    monkeypatch.setattr(dump_files, "PIECE_ROWS", 64)
    path = tmp_path / "one-group.parquet"
    table = pq.read_table(next(sample_dir().glob("*.parquet")))
    pq.write_table(table, path, row_group_size=table.num_rows)
    args = ["replay", str(path), "--strategy", "tree", "--no-samples", "--out", str(tmp_path / "run")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"row group 0 holds {table.num_rows} rows" in result.output and "row_group_size=" in result.output


def test_replay_without_argument_runs_on_sample_traces(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["replay", "--strategy", "tree", "--no-samples"])
    assert result.exit_code == 0, result.output
    runs = list((tmp_path / "trace-tools-runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "summary.json").is_file()
    assert "What each strategy would train" in result.output


def test_report_rerenders_a_finished_run(sample_run):
    (sample_run.run_dir / "report.md").unlink()
    result = CliRunner().invoke(app, ["report", str(sample_run.run_dir), "--json"])
    assert result.exit_code == 0
    assert json.loads(result.output) == sample_run.summary
    assert (sample_run.run_dir / "report.md").read_text().startswith("# trace-tools replay report")


def test_samples_table_converts_shared_lists_and_prefixes_once_and_equals_a_plain_conversion():
    import pyarrow as pa

    from trace_tools.io.rundir import SAMPLES_SCHEMA, samples_table

    ids = list(range(5000))
    rows = [
        {
            "strategy": s,
            "session_id": "a",
            "sample_index": i,
            "token_ids": tokens,
            "response_length": 2,
            "loss_mask": [1, 0],
            "logprobs": [-0.5, 0.0],
            "source_turn": [-1] * (len(tokens) - 1) + [3],
            "reward": 0.0,
            "metadata": "{}",
            "step": 3 if s == "x" else None,
        }
        for i, (s, tokens) in enumerate(
            [
                ("tree", ids),
                ("linear", list(ids)),
                ("chains", ids[:-1] + [7]),  # converts only what follows the prefix it shares with the last one
                ("areal", ids[:-1] + [7, 8, 9]),  # longer than the list it shares a prefix with
                ("continuation", ids[:4500]),  # shorter
                ("message-graph", [9] + ids[1:]),  # parts at once: converted whole
                ("x", []),
            ]
        )
    ]
    table = samples_table(rows)
    assert table.equals(pa.Table.from_pylist(rows, schema=SAMPLES_SCHEMA))
    assert table.column("token_ids").to_pylist()[2][-1] == 7 and samples_table([]).num_rows == 0


def test_integer_lists_convert_through_numpy_as_arrow_converts_them_nulls_and_overflow_included():
    import pyarrow as pa
    import pytest

    from trace_tools.io.rundir import _arrow_values

    for values, kind in [
        ([5, 0, 151_935], pa.int32()),
        ([1, 0, 1], pa.int8()),
        ([], pa.int32()),
        ([-0.5], pa.float64()),
    ]:
        converted = _arrow_values(values, kind)
        assert converted.type == kind and converted.equals(pa.array(values, kind))
    assert _arrow_values([1, None, 3], pa.int32()).to_pylist() == [1, None, 3]  # a null stays a null
    with pytest.raises(pa.ArrowInvalid):  # an id past int32 is named, as Arrow names it
        _arrow_values([1, 2**40], pa.int32())
