"""Seeded corruption fuzz: bad input is quarantined exactly, never crashes, never leaks into other sessions.

A small simulated dump is corrupted 48 ways (each variant spoils 1–3 sessions with one class of
problem from issue 12 and docs/trace_schema.md#loading-validation-and-quarantine; every class occurs). For each variant, in-process:

* nothing raises except the usage error of an unusable dump (exit 2, docs/commands.md#exit-codes-and-errors);
* `validate` and `replay` quarantine exactly the corrupted sessions, with the class's reason;
* every session the corruption did not touch replays bit-identically to the clean run
  (sessions, turns and samples tables).

A few variants also go through the CLI (`validate --strict`, `replay --strict`) for exit codes,
two of them in a subprocess through the real entry point, to show no traceback reaches the user.
"""

from __future__ import annotations

import math
import random
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from io_support import read_like_workers
from trace_tools.api import replay
from trace_tools.cli.main import app
from trace_tools.errors import TraceToolsError
from trace_tools.io import iter_sessions, validate
from trace_tools.io.sample_parts import read_samples

pytestmark = pytest.mark.slow

SEED = 12
VARIANTS = 48
STRATEGIES = ["tree", "linear"]
QWEN3_VOCAB = 151_669
BEHAVIOURS = ["byte-exact", "claude-code", "json-reserialize", "retry"]
SPOILER = b"\xc3\x28"  # a two-byte UTF-8 sequence cut short: not valid UTF-8


# -- building corrupted tables -----------------------------------------------------------------------
def _set(table: pa.Table, column: str, row: int, value) -> pa.Table:
    values = table.column(column).to_pylist()
    values[row] = value
    index = table.schema.get_field_index(column)
    return table.set_column(index, table.schema.field(index), pa.array(values, table.schema.field(index).type))


def _first(table: pa.Table, column: str, row: int, value) -> pa.Table:
    """The row's list cell with its first item replaced by `value`."""
    return _set(table, column, row, [value, *table[column][row].as_py()[1:]])


def _invalid_utf8(table: pa.Table, column: str, row: int) -> pa.Table:
    values = table.column(column).cast(pa.binary()).to_pylist()  # bytes, even where already spoiled
    values[row] = values[row][:5] + SPOILER + values[row][5:]
    index = table.schema.get_field_index(column)
    return table.set_column(index, table.schema.field(index), pa.array(values, pa.binary()).view(pa.string()))


def _edit_message(table: pa.Table, row: int, change: Callable[[dict], None]) -> pa.Table:
    import json

    messages = json.loads(table.column("messages")[row].as_py())
    change(messages[-1])
    return _set(table, "messages", row, json.dumps(messages))


def _logprob(table: pa.Table, row: int, value: float) -> pa.Table:
    logprobs = table.column("output_logprobs")[row].as_py()
    logprobs[len(logprobs) // 2] = value
    return _set(table, "output_logprobs", row, logprobs)


def _drop_rows(table: pa.Table, rows: list[int]) -> pa.Table:
    return table.filter(pa.array([i not in rows for i in range(table.num_rows)]))


@dataclass(frozen=True)
class Corruption:
    """One class of bad input. `effect`: `quarantine` (the row's session is quarantined with `reason`),
    `orphan` (the row leaves its session; `reason` is an entry without a session, or the bad id's own),
    `warning` (legal: counted, nothing quarantined) or `unusable` (the dump as a whole: exit 2)."""

    name: str
    reason: str | None
    spoil: Callable[[pa.Table, int], pa.Table]
    effect: str = "quarantine"
    rows: str = "any"  # which row of a session may be spoiled: any | later (not its first) | middle


ROW_CLASSES = [
    Corruption("messages not JSON", "bad_json", lambda t, r: _set(t, "messages", r, '[{"role": "user"')),
    Corruption("messages an object", "bad_json", lambda t, r: _set(t, "messages", r, '{"role": "user"}')),
    Corruption("messages empty", "empty_messages", lambda t, r: _set(t, "messages", r, "[]")),
    Corruption("messages null", "empty_messages", lambda t, r: _set(t, "messages", r, None)),
    Corruption("output_ids null", "missing_column", lambda t, r: _set(t, "output_ids", r, None)),
    Corruption("null token id", "wrong_type", lambda t, r: _first(t, "output_ids", r, None)),
    Corruption(
        "logprobs too short",
        "logprobs_length",
        lambda t, r: _set(t, "output_logprobs", r, t["output_logprobs"][r].as_py()[1:]),
    ),
    Corruption("id beyond the vocabulary", "out_of_vocab", lambda t, r: _first(t, "output_ids", r, QWEN3_VOCAB)),
    Corruption("negative token id", "out_of_vocab", lambda t, r: _first(t, "prompt_ids", r, -1)),
    Corruption(
        "duplicate turn_index",
        "duplicate_turn",
        lambda t, r: _set(t, "turn_index", r, t["turn_index"][r - 1].as_py()),
        rows="later",
    ),
    Corruption("negative turn_index", "negative_turn", lambda t, r: _set(t, "turn_index", r, -1)),
    Corruption("invalid UTF-8 in messages", "bad_text", lambda t, r: _invalid_utf8(t, "messages", r)),
    Corruption("invalid UTF-8 in the response", "bad_text", lambda t, r: _invalid_utf8(t, "response", r)),
    Corruption("lone surrogate", "bad_text", lambda t, r: _edit_message(t, r, lambda m: m.update(content="x\udc80y"))),
    Corruption("message without role", "bad_message", lambda t, r: _edit_message(t, r, lambda m: m.pop("role"))),
    Corruption("role not a name", "bad_message", lambda t, r: _edit_message(t, r, lambda m: m.update(role=["tool"]))),
    Corruption("content a number", "bad_message", lambda t, r: _edit_message(t, r, lambda m: m.update(content=3.5))),
    Corruption("NaN logprob", "bad_logprob", lambda t, r: _logprob(t, r, math.nan)),
    Corruption("+inf logprob", "bad_logprob", lambda t, r: _logprob(t, r, math.inf)),
    Corruption("-inf logprob", "bad_logprob", lambda t, r: _logprob(t, r, -math.inf)),
    Corruption("positive logprob", "bad_logprob", lambda t, r: _logprob(t, r, 0.5)),
    Corruption("tools not JSON", "bad_json", lambda t, r: _set(t, "tools", r, "[{")),
    Corruption("response an array", "bad_json", lambda t, r: _set(t, "response", r, "[]")),
    Corruption("template kwargs not an object", "bad_json", lambda t, r: _set(t, "chat_template_kwargs", r, '"think"')),
    Corruption("empty session_id", "bad_message", lambda t, r: _set(t, "session_id", r, ""), effect="orphan"),
    Corruption("invalid UTF-8 session_id", "bad_text", lambda t, r: _invalid_utf8(t, "session_id", r), effect="orphan"),
    Corruption("turn_index gap", None, lambda t, r: _drop_rows(t, [r]), effect="warning", rows="middle"),
    Corruption(
        "empty generation",
        None,
        lambda t, r: _set(_set(t, "output_ids", r, []), "output_logprobs", r, []),
        effect="warning",
    ),
]
FILE_CLASSES = [
    Corruption("required column missing", None, lambda t, r: t.drop_columns(["output_ids"]), effect="unusable"),
    Corruption(
        "column of the wrong type",
        None,
        lambda t, r: t.set_column(
            t.schema.get_field_index("output_ids"),
            "output_ids",
            pa.array([str(v) for v in t["output_ids"].to_pylist()]),
        ),
        effect="unusable",
    ),
    Corruption("no rows", None, lambda t, r: t.slice(0, 0), effect="unusable"),
]


@dataclass
class Variant:
    number: int
    corruption: Corruption
    path: Path
    quarantined: set[str]  # sessions validate and replay must quarantine
    touched: set[str]  # sessions whose results may differ from the clean run
    orphans: int = 0  # quarantine entries that belong to no session


def _rows_by_session(table: pa.Table) -> dict[str, list[int]]:
    rows: dict[str, list[int]] = {}
    for index, session_id in enumerate(table.column("session_id").to_pylist()):
        rows.setdefault(session_id, []).append(index)
    return rows


def _pick_row(rows: list[int], which: str, rng: random.Random) -> int:
    if which == "later":
        return rng.choice(rows[1:])
    if which == "middle":
        return rng.choice(rows[:-1])
    return rng.choice(rows)


def _make_variant(number: int, corruption: Corruption, clean: pa.Table, directory: Path, rng: random.Random) -> Variant:
    by_session = _rows_by_session(clean)
    if corruption.effect == "unusable":
        table, chosen = corruption.spoil(clean, 0), []
    else:
        candidates = [s for s, rows in by_session.items() if len(rows) >= 3]
        chosen = rng.sample(candidates, rng.randint(1, 3))
        rows = sorted(_pick_row(by_session[s], corruption.rows, rng) for s in chosen)
        table = clean
        for row in reversed(rows):  # from the end, so dropping a row keeps the others' positions
            table = corruption.spoil(table, row)
    path = directory / f"variant-{number:02d}.parquet"
    pq.write_table(table.replace_schema_metadata(clean.schema.metadata), path)
    quarantined = set(chosen) if corruption.effect == "quarantine" else set()
    orphans = 1 if corruption.effect == "orphan" and corruption.reason == "bad_message" else 0  # one per file
    if corruption.effect == "orphan" and corruption.reason == "bad_text":
        quarantined = {_lossy_id(s) for s in chosen}
    return Variant(number, corruption, path, quarantined, set(chosen), orphans)


def _lossy_id(original: str) -> str:
    """The printable id the loader gives a session id that `_invalid_utf8` spoiled."""
    raw = original.encode()
    return (raw[:5] + SPOILER + raw[5:]).decode("utf-8", "backslashreplace")


def _variants(clean: pa.Table, directory: Path) -> list[Variant]:
    rng = random.Random(SEED)
    classes = ROW_CLASSES + FILE_CLASSES
    return [_make_variant(n, classes[n % len(classes)], clean, directory, rng) for n in range(VARIANTS)]


# -- fixtures ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fuzz(tmp_path_factory):
    """The clean dump, its replayed tables, and every corrupted variant."""
    import trace_tools.report.plots as plots
    from trace_tools.simulate import simulate

    directory = tmp_path_factory.mktemp("fuzz")
    clean_path = directory / "clean.parquet"
    simulate(sessions=10, seed=SEED, template="qwen3", behaviours=BEHAVIOURS, max_turns=3, out=str(clean_path))
    clean = pq.read_table(clean_path)
    original, plots.FIGURES = plots.FIGURES, ()  # plots are not under test here
    try:
        baseline = _replayed(replay(clean_path, out=directory / "clean-run", strategies=STRATEGIES))
        yield clean, baseline, _variants(clean, directory), directory
    finally:
        plots.FIGURES = original


def _replayed(result) -> dict[str, pd.DataFrame]:
    tables = {name: pd.read_parquet(result.run_dir / f"{name}.parquet") for name in ("sessions", "turns")}
    tables["samples"] = read_samples(result.run_dir).to_pandas()
    tables["sessions"] = tables["sessions"].drop(columns=["elapsed_s"])
    tables["quarantine"] = pd.read_parquet(result.run_dir / "quarantine.parquet")
    return tables


# -- the checks --------------------------------------------------------------------------------------------------
def test_every_class_is_exercised(fuzz):
    _, _, variants, _ = fuzz
    assert len(variants) >= 40
    assert {v.corruption.name for v in variants} == {c.name for c in ROW_CLASSES + FILE_CLASSES}
    reasons = {v.corruption.reason for v in variants} - {None}
    assert reasons >= {
        "missing_column",
        "wrong_type",
        "bad_json",
        "logprobs_length",
        "out_of_vocab",
        "duplicate_turn",
        "negative_turn",
        "empty_messages",
        "bad_text",
        "bad_message",
        "bad_logprob",
    }


@pytest.mark.parametrize("number", range(VARIANTS))
def test_validate_and_replay_quarantine_exactly_the_corrupted_sessions(fuzz, number, monkeypatch):
    clean, baseline, variants, directory = fuzz
    variant = variants[number]
    corruption = variant.corruption
    if corruption.effect == "unusable":
        for call in (
            lambda: validate(variant.path),
            lambda: replay(variant.path, out=directory / f"run-{number}", strategies=STRATEGIES),
        ):
            with pytest.raises(TraceToolsError) as raised:
                call()
            assert raised.value.exit_code == 2 and str(raised.value)
        return

    report = validate(variant.path)
    assert {e.session_id for e in report.entries if e.session_id is not None} == variant.quarantined
    assert {e.reason for e in report.entries} == ({corruption.reason} if corruption.effect != "warning" else set())
    assert report.unattributed == variant.orphans
    if corruption.effect == "warning":
        assert report.clean and sum(report.data_warnings.values()) >= len(variant.touched)

    result = replay(variant.path, out=directory / f"run-{number}", strategies=STRATEGIES)
    tables = _replayed(result)
    quarantine = tables["quarantine"]
    assert set(quarantine["session_id"].dropna()) == variant.quarantined
    assert set(quarantine["reason"]) <= {corruption.reason}
    assert "replay_error" not in set(quarantine["reason"])
    if corruption.effect == "warning":
        assert sum(result.summary["warnings"].values()) == sum(report.data_warnings.values())
    untouched = set(baseline["sessions"]["session_id"]) - variant.touched
    for name in ("sessions", "turns", "samples"):
        before = _only(baseline[name], untouched)
        after = _only(tables[name], untouched)
        pd.testing.assert_frame_equal(before, after, check_dtype=False)


@pytest.mark.parametrize("number", range(VARIANTS))
def test_workers_reading_their_own_rows_quarantine_the_same(fuzz, number):
    """What a Ray worker reads from pass 1's description of a session equals what the stream hands
    out: same sessions, same quarantine entries, same details (the whole dump is one row group here)."""
    _, _, variants, _ = fuzz
    variant = variants[number]
    if variant.corruption.effect == "unusable":
        return
    stream = iter_sessions(variant.path)
    by_workers = read_like_workers(stream)
    assert by_workers == list(stream.positioned())
    quarantined = {item[0].session_id for _, item in by_workers if isinstance(item, list)}
    assert quarantined == variant.quarantined


def _only(frame: pd.DataFrame, sessions: set[str]) -> pd.DataFrame:
    """The rows of `sessions`, in a fixed order, missing values as None (an all-null column reads as None,
    a partly null one as NaN: the same value)."""
    keys = [c for c in ("strategy", "session_id", "turn_index", "sample_index") if c in frame]
    rows = frame[frame["session_id"].isin(sessions)].sort_values(keys).reset_index(drop=True).astype(object)
    return rows.where(rows.notna(), None)


CLI_VARIANTS = {
    "messages not JSON": 1,
    "invalid UTF-8 in messages": 1,
    "turn_index gap": 0,
    "empty session_id": 1,
    "required column missing": 2,
    "no rows": 2,
}


@pytest.mark.parametrize("name", list(CLI_VARIANTS))
def test_cli_exit_codes_follow_design_section_10(fuzz, name):
    _, _, variants, directory = fuzz
    variant = next(v for v in variants if v.corruption.name == name)
    strict = CLI_VARIANTS[name]
    runner = CliRunner()
    checks = [
        (["validate", str(variant.path)], 0 if strict == 1 else strict),
        (["validate", str(variant.path), "--strict"], strict),
        (
            [
                "replay",
                str(variant.path),
                "-s",
                "tree",
                "--out",
                str(directory / f"cli-{variant.number}"),
                "--strict",
                "--no-samples",
            ],
            strict,
        ),
    ]
    for argv, code in checks:
        result = runner.invoke(app, argv)
        assert result.exit_code == code, (argv, result.output)
        assert "Traceback" not in result.output


@pytest.mark.parametrize("name", ["invalid UTF-8 in messages", "required column missing"])
def test_the_real_entry_point_shows_no_traceback(fuzz, name):
    _, _, variants, _ = fuzz
    variant = next(v for v in variants if v.corruption.name == name)
    done = subprocess.run(
        [sys.executable, "-m", "trace_tools.cli.main", "validate", str(variant.path), "--strict"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == (1 if variant.corruption.effect == "quarantine" else 2)
    assert "Traceback" not in done.stdout + done.stderr
    assert (variant.corruption.reason or "missing") in done.stdout + done.stderr
