"""`reconstruct` on worker processes gives the rows, summary and identity one process gives: on
drifting sessions, two recordings in one directory, sessions interleaved across small row groups,
and sessions quarantined in either pass; forked and spawned."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from run_support import REPORT_COMPILES
from trace_tools.errors import UsageError
from trace_tools.reconstruct import reconstruct
from trace_tools.reconstruct.workers import SMALL_RECONSTRUCT, _batches, auto_workers

# The module itself: `trace_tools.reconstruct` names the function on the package (`trace_tools.__init__`).
WORKERS = importlib.import_module("trace_tools.reconstruct.workers")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def interleaved_dump(simulated_dump, tmp_path_factory) -> Path:
    """The simulated dump's rows dealt out so that sessions interleave, in row groups of 5 rows
    (each session spans many, most shared with other sessions), one session quarantined while its
    rows are read (an out-of-vocabulary prompt id), one for a turn index it repeats, one whose
    recorded prompts differ from the render half-way (every later turn diverges), and one whose
    rows lie among the others' in the middle of the file (it starts after them and ends first)."""
    table = pq.read_table(simulated_dump)
    order = sorted(range(table.num_rows), key=lambda i: (i % 3, i))
    table = table.take(order)
    rows = table.to_pylist()
    sessions = list(dict.fromkeys(row["session_id"] for row in rows))
    bad_ids = next(row for row in rows if row["session_id"] == sessions[1])
    bad_ids["prompt_ids"] = [*bad_ids["prompt_ids"][:-1], 10**9]
    repeated = [row for row in rows if row["session_id"] == sessions[2]]
    repeated[1]["turn_index"] = repeated[0]["turn_index"]
    for row in rows:
        if row["session_id"] == sessions[3] and len(row["prompt_ids"]) > 200:
            row["prompt_ids"][200] = (row["prompt_ids"][200] + 1) % 1000
    inside = [row for row in rows if row["session_id"] == sessions[4]]
    rows = [row for row in rows if row["session_id"] != sessions[4]]
    for k, row in enumerate(inside):  # every other row, sharing its row groups with the others
        rows.insert(len(rows) // 3 + 2 * k, row)
    path = tmp_path_factory.mktemp("interleaved") / "dump.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path, row_group_size=5)
    return path


def _same_in_workers(dump: Path, **options) -> dict:
    one = reconstruct(dump, workers=1, **options)
    for workers in (2, 3):
        many = reconstruct(dump, workers=workers, **options)
        assert many.rows == one.rows
        assert many.summary == one.summary
        assert many.renderer_identity == one.renderer_identity
    return one.summary


def test_two_recordings_in_a_directory_give_the_same_rows_and_identities_in_workers():
    summary = _same_in_workers(ROOT / "sample_traces")
    assert summary["sessions"] == 32 and summary["rate"] == 1.0


@pytest.mark.parametrize("tasks_per_worker", [1, 4])  # 1: tasks of several sessions each
def test_interleaved_sessions_quarantines_and_divergences_give_the_same_rows_in_workers(
    interleaved_dump, monkeypatch, tasks_per_worker
):
    monkeypatch.setattr(WORKERS, "TASKS_PER_WORKER", tasks_per_worker)
    summary = _same_in_workers(interleaved_dump)
    assert summary["quarantined_sessions"] == 2
    assert 0 < summary["exact"] < summary["turns_compared"]  # divergences and their contexts compared too


def test_verify_counts_every_workers_checks(simulated_dump):
    summary = _same_in_workers(simulated_dump, render_path="verify")
    assert summary["verify"]["checked"] == summary["turns"]  # one render checked a turn, whichever worker ran it


def test_progress_counts_every_session_once_in_workers(interleaved_dump):
    seen: list[tuple[int, int]] = []
    reconstruct(interleaved_dump, workers=2, progress=lambda done, total: seen.append((done, total)))
    done = [d for d, _ in seen]
    assert done == sorted(done) and seen[-1] == (12, 12)


def test_workers_must_be_at_least_one(simulated_dump):
    with pytest.raises(UsageError, match="--workers must be at least 1"):
        reconstruct(simulated_dump, workers=0)


def test_a_small_dump_reconstructs_in_this_process_by_default(monkeypatch):
    monkeypatch.delenv("TRACE_TOOLS_WORKERS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    for method, small in SMALL_RECONSTRUCT.items():
        monkeypatch.setattr(WORKERS, "can_fork", lambda method=method: method == "fork")
        assert auto_workers(small - 1) == 1 and auto_workers(small) == 4
    monkeypatch.setenv("TRACE_TOOLS_WORKERS", "3")
    assert auto_workers(10) == 3


def test_tasks_are_consecutive_sessions_within_a_share_of_the_turns_left(interleaved_dump):
    from trace_tools.io.load import iter_sessions

    slots = [slot for slot in iter_sessions(interleaved_dump).slots() if not slot.problems]
    batches = list(_batches(slots, 1))  # one worker: its tasks hold several of these short sessions
    assert [slot for batch in batches for slot in batch] == slots
    left = sum(slot.rows for slot in slots)
    for batch in batches:
        turns = sum(slot.rows for slot in batch)
        assert len(batch) == 1 or turns <= left // WORKERS.TASKS_PER_WORKER  # one worker's share of what is left
        left -= turns
    assert len(batches[0]) > 1 and len(batches[-1]) == 1  # they shrink: no worker waits long at the end


@pytest.mark.parametrize("start", ["auto", "spawn"])
def test_the_command_line_forks_its_workers_and_prints_what_one_process_does(interleaved_dump, start):
    """In a fresh process (one thread) the workers fork, sharing the encoder built and the template
    compiled before (only this process compiles it); with `$TRACE_TOOLS_WORKER_START=spawn` they
    are spawned and build their own (unseen here: a spawned worker does not run this patch). The
    summary is the same either way, and as `--workers 1` prints it."""
    code = (
        "import importlib, os, sys; rw = importlib.import_module('trace_tools.reconstruct.workers'); made = rw.WorkerPool.__init__; "
        "rw.WorkerPool.__init__ = lambda self, n: (made(self, n), print(type(self.context).__name__, file=sys.stderr))[0]; "
        + REPORT_COMPILES
        + "print('driver', os.getpid(), file=sys.stderr, flush=True); "
        "from trace_tools.cli.main import main; sys.argv = ['trace-tools', *sys.argv[1:]]; main()"
    )
    env = {**os.environ, "TRACE_TOOLS_WORKER_START": start}
    runs = {
        workers: subprocess.run(
            [sys.executable, "-c", code, "reconstruct", str(interleaved_dump), "--json", "--workers", workers],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        for workers in ("1", "2")
    }
    assert all(run.returncode == 0 for run in runs.values()), runs
    assert json.loads(runs["2"].stdout) == json.loads(runs["1"].stdout)
    lines = {workers: [line.split() for line in run.stderr.splitlines()] for workers, run in runs.items()}
    assert [line for line in lines["2"] if len(line) == 1] == [["_QuietFork" if start == "auto" else "_QuietSpawn"]]
    if start == "auto":
        for said in lines.values():
            driver = next(line[1] for line in said if line[0] == "driver")
            assert {line[1] for line in said if line[0] == "compile"} == {driver}


def test_a_task_reads_each_row_group_once_and_hands_each_session_its_rows_in_file_order(interleaved_dump):
    from trace_tools.io.load import ROW_COLUMN, iter_sessions

    stream = iter_sessions(interleaved_dump)
    slots = [slot for slot in stream.slots() if not slot.problems]
    parts = WORKERS._read_parts(stream.context(), slots)  # one task of every session
    for slot in slots:
        rows = [row for table in parts[slot.position] for row in table.column(ROW_COLUMN).to_pylist()]
        assert rows == sorted(rows) and len(rows) == slot.rows


def test_a_callers_renderer_is_shared_with_forked_workers_only(interleaved_dump, monkeypatch):
    """Forked workers inherit the caller's renderer object; where they would be spawned, which
    could not rebuild it, this process reconstructs (no pool is made)."""
    from trace_tools.io.load import read_dump_meta
    from trace_tools.render.renderer import Renderer

    code = (
        "import importlib, json, sys; from pathlib import Path; from trace_tools.reconstruct import reconstruct; "
        "from trace_tools.render.renderer import Renderer; from trace_tools.io.load import read_dump_meta; "
        "rw = importlib.import_module('trace_tools.reconstruct.workers'); made = rw.WorkerPool.__init__; "
        "rw.WorkerPool.__init__ = lambda self, n: (made(self, n), print(type(self.context).__name__, file=sys.stderr))[0]; "
        "meta = read_dump_meta(Path(sys.argv[1])); renderer = Renderer.from_spec(meta.tokenizer, dump_meta=meta); "
        # workers first: a render in this process starts the template watchdog's thread, and a
        # process running two threads spawns its workers
        "print(json.dumps([reconstruct(sys.argv[1], renderer=renderer, workers=w).rows for w in (2, 1)]))"
    )
    ran = subprocess.run(
        [sys.executable, "-c", code, str(interleaved_dump)], capture_output=True, text=True, timeout=300
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stderr.split() == ["_QuietFork"]
    two, one = json.loads(ran.stdout)
    assert two == one and any(row["exact"] is False for row in one)

    monkeypatch.setattr("trace_tools.process_pool.can_fork", lambda: False)
    monkeypatch.setattr(WORKERS, "WorkerPool", None)  # made, it would fail the test
    meta = read_dump_meta(interleaved_dump)
    renderer = Renderer.from_spec(meta.tokenizer, dump_meta=meta)
    assert reconstruct(interleaved_dump, renderer=renderer, workers=2).rows == one


def test_no_more_workers_start_than_there_are_sessions(interleaved_dump, monkeypatch):
    started = []
    made = WORKERS.WorkerPool.__init__
    monkeypatch.setattr(WORKERS.WorkerPool, "__init__", lambda self, n: (started.append(n), made(self, n))[1])
    from trace_tools.io.load import iter_sessions

    sessions = iter_sessions(interleaved_dump).session_count
    summary = reconstruct(interleaved_dump, workers=64).summary
    assert started == [sessions] == [summary["sessions"] + summary["quarantined_sessions"]]


def test_a_dump_whose_every_session_pass_1_quarantines_starts_no_worker(tmp_path, monkeypatch):
    from io_support import baseline_table, write_dump

    table = baseline_table()
    dump = write_dump(tmp_path / "dump.parquet", table.drop_columns(["messages"]))  # condemns every session
    monkeypatch.setattr(WORKERS, "WorkerPool", None)  # made, it would fail the test
    summary = reconstruct(dump, workers=2).summary
    assert summary["turns"] == 0 and summary["quarantined_sessions"] == len(set(table.column("session_id").to_pylist()))
    assert summary == reconstruct(dump, workers=1).summary


def _prompt_pairs(seed: int, turns: int = 40, grow: int = 12, vocab: int = 50) -> list[tuple[list[int], list[int]]]:
    """A session's (recorded, rendered) prompts, turn by turn, in the shapes a comparison meets:
    both growing by appending (up to `grow` ids of `vocab` a turn), the render drifting at a token
    before, at or after the last turn's divergence, history rewritten on either side, one prompt a
    prefix of the other, either side shrinking, and both equal again after a drift."""
    import random

    rng = random.Random(seed)
    recorded: list[int] = [rng.randrange(vocab) for _ in range(rng.randrange(0, 30))]
    rendered = list(recorded)
    pairs = []
    for _ in range(turns):
        grown = [rng.randrange(vocab) for _ in range(rng.randrange(0, grow))]
        recorded, rendered = recorded + grown, rendered + grown
        shape = rng.randrange(8)
        if shape == 1 and rendered:  # the render drifts somewhere
            at = rng.randrange(len(rendered))
            rendered = [*rendered[:at], rendered[at] + 1, *rendered[at + 1 :]]
        elif shape == 2 and recorded:  # the recording rewrites its history
            at = rng.randrange(len(recorded))
            recorded = [*recorded[:at], *(rng.randrange(50) for _ in range(rng.randrange(0, 8)))]
        elif shape == 3:  # one ends before the other
            cut = rng.randrange(len(rendered) + 1)
            if rng.random() < 0.5:
                rendered = rendered[:cut]
            else:
                recorded = recorded[:cut]
        elif shape == 4:  # the two agree again
            rendered = list(recorded)
        elif shape == 5 and rendered:  # the render's own history changes (another template's choice)
            rendered = [*rendered[: rng.randrange(len(rendered))], 7]
        pairs.append((recorded, rendered))
    return pairs


@pytest.mark.parametrize("seed", range(60))
def test_recorded_arrays_compare_as_lists_turn_by_turn(seed):
    """Recorded ids are int32 arrays, compared with each rendered list starting from what the
    turn before decided (`Comparison`): every first divergence equals a plain list comparison's,
    whatever the turns before looked like. Half the seeds grow by hundreds of ids of a large
    vocabulary a turn (a real session's shape); a third comparison meets lists where some ids are
    int objects of their own (a tokenizer's) rather than the shared ones."""
    import random

    import numpy as np

    from trace_tools.ids import interned
    from trace_tools.pipeline.recorded import Comparison

    long = seed % 2 == 1
    pairs = _prompt_pairs(seed, grow=700, vocab=150_000) if long else _prompt_pairs(seed)
    comparison, by_lists, own_ints = Comparison(), Comparison(), Comparison()
    rng = random.Random(seed)
    for recorded, rendered in pairs:
        expected = next(
            (i for i, (a, b) in enumerate(zip(recorded, rendered)) if a != b), min(len(recorded), len(rendered))
        )
        shared_ints = interned(rendered, 150_000)  # as the renderer hands them out
        array = np.array(recorded, dtype=np.int32)
        assert comparison.common_prefix(array, shared_ints) == expected
        assert by_lists.common_prefix(recorded, shared_ints) == expected
        mixed = [int(str(i)) if rng.random() < 0.01 else i for i in shared_ints]  # equal values, other objects
        assert own_ints.common_prefix(array, mixed) == expected
