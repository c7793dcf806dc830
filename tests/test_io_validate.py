"""`validate` (library) and `trace-tools validate` (CLI): counts, quarantine list, exit codes."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from io_support import VOCAB, baseline_table, distinct_session_ids, with_cell, write_dump
from trace_tools.cli.cmd_validate import validate_cmd
from trace_tools.errors import UnusableInput
from trace_tools.io import validate

app = typer.Typer()
app.command("validate")(validate_cmd)


@app.callback()
def _root() -> None:
    """Keeps `validate` a named subcommand, as in the real CLI."""


def run_cli(*args: str):
    return CliRunner().invoke(app, ["validate", *map(str, args)])


@pytest.fixture
def spoiled(tmp_path):
    """alpha: bad JSON; beta: clean; gamma: an out-of-vocab id AND a short logprobs list."""
    table = with_cell(baseline_table(), "messages", 1, "{oops")
    table = with_cell(table, "output_ids", 6, [1, 2, 3, VOCAB + 1])
    write_dump(tmp_path / "dump" / "a.parquet", table.slice(0, 7))
    write_dump(tmp_path / "dump" / "b.parquet", with_cell(table, "output_logprobs", 8, [-1.0]).slice(7))
    return tmp_path / "dump"


# --------------------------------------------------------------------------------------------
# Library


def test_report_counts(spoiled):
    report = validate(spoiled, vocab_size=VOCAB)
    assert (report.sessions, report.turns, report.valid_sessions, report.quarantined) == (3, 9, 1, 2)
    assert report.by_reason == {"bad_json": 1, "out_of_vocab": 1}  # gamma's later row is not examined
    assert [(e.session_id, e.turn_index) for e in report.entries] == [("alpha", 1), ("gamma", 0)]
    assert report.vocab_checked and not report.clean and len(report.files) == 2


def test_by_reason_counts_sessions_not_rows(tmp_path):
    table = baseline_table()
    write_dump(tmp_path / "dump" / "a.parquet", table.slice(0, 5).drop_columns(["output_ids"]))
    write_dump(tmp_path / "dump" / "b.parquet", table.slice(5).drop_columns(["output_ids", "messages"]))
    delta = table.slice(6).set_column(0, "session_id", pa.array(["delta"] * 3, pa.string()))
    write_dump(tmp_path / "dump" / "c.parquet", delta)  # one usable file, so the dump is not unusable
    report = validate(tmp_path / "dump", vocab_size=VOCAB)
    assert report.quarantined == 3 and report.valid_sessions == 1
    assert report.by_reason == {"missing_column": 3}
    # One entry per session per schema problem of each file holding its rows; beta spans both files.
    assert [e.session_id for e in report.entries] == ["alpha", "beta", "beta", "beta", "gamma", "gamma"]


def test_quarantine_out_is_written_even_when_clean(tmp_path, spoiled):
    report = validate(spoiled, vocab_size=VOCAB, quarantine_out=tmp_path / "q" / "quarantine.parquet")
    table = pq.read_table(tmp_path / "q" / "quarantine.parquet")
    assert table.column_names == ["session_id", "turn_index", "reason", "detail"]
    assert table.column("reason").to_pylist() == [e.reason for e in report.entries]
    clean = write_dump(tmp_path / "clean.parquet")
    validate(clean, vocab_size=VOCAB, quarantine_out=tmp_path / "empty.parquet")
    assert pq.read_table(tmp_path / "empty.parquet").num_rows == 0


def test_unwritable_quarantine_out_is_unusable_input(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UnusableInput, match="cannot write .*; pass a writable --out path"):
        validate(write_dump(tmp_path / "d.parquet"), quarantine_out=blocker / "q.parquet")


CORRUPTIONS = {
    "messages": "[",
    "output_logprobs": [0.0],
    "turn_index": -5,
    "output_ids": [VOCAB],
    "tools": "7",
}


@settings(max_examples=25, deadline=None)
@given(
    spoils=st.lists(st.tuples(st.sampled_from(sorted(CORRUPTIONS)), st.integers(0, 8)), max_size=4),
    order=st.permutations(range(9)),
    split=st.integers(0, 9),
)
def test_no_session_is_ever_lost(spoils, order, split):
    table = baseline_table().take(list(order))
    for column, row in spoils:
        table = with_cell(table, column, row, CORRUPTIONS[column])
    with tempfile.TemporaryDirectory() as directory:
        report = _validate_split(Path(directory), table, split)
    assert report.sessions == len(distinct_session_ids(table)) == report.valid_sessions + report.quarantined
    spoiled_sessions = {table.column("session_id")[row].as_py() for _, row in spoils}
    assert {e.session_id for e in report.entries} == spoiled_sessions


def _validate_split(directory, table, split):
    """Rows in arrival order over two files (either may be empty), two-row row groups."""
    write_dump(directory / "a.parquet", table.slice(0, split))
    write_dump(directory / "b.parquet", table.slice(split))
    return validate(directory, vocab_size=VOCAB)


# --------------------------------------------------------------------------------------------
# CLI


def test_cli_clean_dump_exits_0(tmp_path):
    result = run_cli(write_dump(tmp_path / "d.parquet"), "--strict")
    assert result.exit_code == 0, result.output
    assert "clean" in result.stdout and "sessions" in result.stdout
    assert "skipped: no tokenizer known" in result.stdout


def test_cli_quarantine_is_reported_exit_0_without_strict(spoiled):
    result = run_cli(spoiled)
    assert result.exit_code == 0, result.output
    for text in ("bad_json", "logprobs_length", "alpha", "gamma", "2 of 3 sessions quarantined"):
        assert text in result.stdout


def test_cli_strict_quarantine_exits_1(spoiled):
    assert run_cli(spoiled, "--strict").exit_code == 1


def test_cli_unusable_input_exits_2_with_one_line(tmp_path):
    result = run_cli(tmp_path / "nope")
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0
    assert "no such file or directory:" in result.stderr and "Traceback" not in result.output
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    result = run_cli(tmp_path / "bad.parquet", "--strict")
    assert result.exit_code == 2 and "not a readable Parquet file" in result.stderr
    assert result.stdout == ""


def test_cli_json_and_out(tmp_path, spoiled):
    result = run_cli(spoiled, "--json", "--out", tmp_path / "q.parquet", "--tokenizer", "qwen3")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["vocab_checked"] and report["vocab_size"] == 151669
    # With qwen3's vocabulary gamma's id 501 is fine, so its short logprobs list is what is found.
    assert report["quarantined_by_reason"] == {"bad_json": 1, "logprobs_length": 1}
    assert report["sessions"] == 3 and report["valid_sessions"] == 1
    assert pq.read_table(tmp_path / "q.parquet").num_rows == len(report["entries"]) == 2


def test_cli_lists_the_first_entries_only(tmp_path):
    row = with_cell(baseline_table().slice(0, 1), "messages", 0, "[")
    table = pa.concat_tables([with_cell(row, "session_id", 0, f"s{n:02d}") for n in range(25)])
    result = run_cli(write_dump(tmp_path / "d.parquet", table))
    assert result.exit_code == 0
    assert "s19" in result.stdout and "s20" not in result.stdout
    assert "… and 5 more entries (pass --out FILE to get them all)" in result.stdout


def test_registered_in_the_real_cli(spoiled, tmp_path):
    from trace_tools.cli.main import app as main_app

    runner = CliRunner()
    assert runner.invoke(main_app, ["validate", str(spoiled)]).exit_code == 0
    assert runner.invoke(main_app, ["validate", str(spoiled), "--strict"]).exit_code == 1
    missing = runner.invoke(main_app, ["validate", str(tmp_path / "missing")])
    assert missing.exit_code == 2 and "no such file or directory" in missing.stderr
