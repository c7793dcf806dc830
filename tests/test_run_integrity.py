"""Run directory integrity (docs/run_directory.md#what-a-rerun-reuses): a resume reuses nothing it has not checked, a rerun after
an upgrade merges nothing old, one process writes a run at a time, and a run killed at any point,
or whose shard files were deleted, truncated, swapped or edited, resumes to exactly the run it
would have been, or stops with exit 2 saying why."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from io_support import run_contents
from run_support import one_turn_dump
from trace_tools.api import replay
from trace_tools.cli.main import app
from trace_tools.errors import UnusableInput, UsageError
from trace_tools.io import shards
from trace_tools.io.sample_parts import samples_files

STRATEGIES = ["tree", "checkpoint-tree"]


def _replay(dump: Path, out: Path, **kwargs):
    """Replay with a shard per session, so there are shards to tamper with."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRACE_TOOLS_SHARD_ROWS", "1")
        return replay(dump, out=out, strategies=STRATEGIES, workers=1, **kwargs)


@pytest.fixture(scope="module")
def finished(simulated_dump, tmp_path_factory):
    """An uninterrupted run (a shard per session) and its contents: what every resume must equal."""
    out = tmp_path_factory.mktemp("finished") / "run"
    _replay(simulated_dump, out)
    return out, run_contents(out)


def _copy(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


def _names(run: Path) -> list[str]:
    return [done.stem for done in sorted((run / "shards").glob("*.done"))]


# -- tampered shards ------------------------------------------------------------------------------
def _delete(run: Path, shard: str, other: str) -> None:
    (run / "shards" / f"{shard}.turns.parquet").unlink()


def _truncate(run: Path, shard: str, other: str) -> None:
    path = run / "shards" / f"{shard}.samples.arrows"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _swap_tables(run: Path, shard: str, other: str) -> None:
    a, b = (run / "shards" / f"{name}.sessions.parquet" for name in (shard, other))
    data = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(data)


def _flip_a_byte(run: Path, shard: str, other: str) -> None:
    path = run / "shards" / f"{shard}.drift.parquet"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _delete_marker(run: Path, shard: str, other: str) -> None:
    (run / "shards" / f"{shard}.done").unlink()


def _garble_marker(run: Path, shard: str, other: str) -> None:
    (run / "shards" / f"{shard}.done").write_text('{"start": 0,')


def _marker_of_another_run(run: Path, shard: str, other: str) -> None:
    path = run / "shards" / f"{shard}.done"
    marker = json.loads(path.read_text())
    path.write_text(json.dumps({**marker, "fingerprint": "0" * 16}))


def _swap_whole_shards(run: Path, shard: str, other: str) -> None:
    """Every file of two shards, markers included, exchanged under each other's names."""
    folder = run / "shards"
    for path in [*folder.glob(f"{shard}.*"), *folder.glob(f"{other}.*")]:
        path.rename(path.with_name(path.name + ".x"))
    for path in folder.glob("*.x"):
        name = path.name.removesuffix(".x")
        swapped = other + name[len(shard) :] if name.startswith(shard) else shard + name[len(other) :]
        path.rename(folder / swapped)


def _leftovers(run: Path, shard: str, other: str) -> None:
    """What a killed writer leaves: a temporary samples file, an unmarked shard, a temporary table."""
    (run / "shards" / f".{shard}.samples.abc123.tmp").write_bytes(b"partial")
    (run / "shards" / "9999999.turns.parquet").write_bytes(b"unfinished")
    (run / ".turns.parquet.xyz.tmp").write_bytes(b"partial")


TAMPERING = {  # how, the note naming the shard, how many shards are replayed again
    "a table deleted": (_delete, "turns.parquet is missing", 1),
    "samples truncated": (_truncate, "samples.arrows has", 1),
    "tables swapped between shards": (_swap_tables, "sessions.parquet", 2),  # sizes differ, else checksums
    "a byte flipped": (_flip_a_byte, "does not match its checksum", 1),
    "a marker deleted": (_delete_marker, None, 1),
    "a marker garbled": (_garble_marker, "its marker is unreadable", 1),
    "a marker of another run": (_marker_of_another_run, "belongs to another run or shard", 1),
    "two whole shards swapped": (_swap_whole_shards, "belongs to another run or shard", 2),
    "a killed writer's leftovers": (_leftovers, None, 0),
}


@pytest.mark.parametrize("kind", list(TAMPERING))
def test_resume_replays_a_shard_whose_files_do_not_check_out(kind, simulated_dump, finished, tmp_path):
    run, expected = finished
    copy = _copy(run, tmp_path)
    tamper, reason, replayed = TAMPERING[kind]
    names = _names(copy)
    shard, other = names[2], names[5]
    tamper(copy, shard, other)
    result = _replay(simulated_dump, copy)
    assert run_contents(copy) == expected
    if reason is not None:
        assert any(note.startswith(f"shard {shard}: ") and reason in note for note in result.redone_shards)
    assert result.resumed_shards == len(names) - replayed
    assert not [p for p in (copy / "shards").iterdir() if p.name.endswith(".tmp") or p.name.startswith("9999999")]
    assert not list(copy.glob(".*.tmp"))


def test_a_marker_whose_first_session_differs_is_replayed(simulated_dump, finished, tmp_path):
    run, expected = finished
    copy = _copy(run, tmp_path)
    shard = _names(copy)[3]
    path = copy / "shards" / f"{shard}.done"
    path.write_text(json.dumps({**json.loads(path.read_text()), "first": "someone-else"}))
    result = _replay(simulated_dump, copy)
    assert run_contents(copy) == expected
    assert result.resumed_shards == len(_names(run)) - 1


def test_a_shard_holding_other_sessions_stops_the_run_saying_why(simulated_dump, finished, tmp_path):
    run, _ = finished
    copy = _copy(run, tmp_path)
    shard = _names(copy)[3]
    path = copy / "shards" / f"{shard}.done"
    path.write_text(json.dumps({**json.loads(path.read_text()), "sessions": "0" * 32}))
    with pytest.raises(UnusableInput, match=rf"shard {shard} of .* holds other sessions than the dump has"):
        _replay(simulated_dump, copy)
    assert not (copy / "summary.json").exists()


# -- killed at several points ---------------------------------------------------------------------
KILL_POINTS = {  # where the child process dies: module, attribute, on which call
    "between a shard's files and its marker": ("trace_tools.io.shards", "write_json_atomic", 4),
    "while merging the tables": ("trace_tools.io.shards", "_stream_tables", 4),
    "while encoding a session's samples": ("trace_tools.io.sample_parts", "_PartWriter.add", 3),
    "while finishing a shard's samples part": ("trace_tools.io.sample_parts", "_PartWriter.close", 2),
    "while writing the report": ("trace_tools.report.render", "write_report", 1),
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_a_run_killed_at_any_point_resumes_to_the_uninterrupted_run(point, simulated_dump, finished, tmp_path):
    run, expected = finished
    out = tmp_path / "run"
    _killed_run(simulated_dump, out, *KILL_POINTS[point])
    assert not (out / "summary.json").exists()
    _replay(simulated_dump, out)
    assert run_contents(out) == expected


def _killed_run(dump: Path, out: Path, module: str, attribute: str, calls: int) -> None:
    """Replay in a child process that dies as under SIGKILL (no cleanup at all) on its `calls`-th
    call of `module.attribute`."""
    code = textwrap.dedent(
        f"""
        import importlib, os
        holder = importlib.import_module({module!r})
        *owners, name = {attribute!r}.split(".")
        for owner in owners:
            holder = getattr(holder, owner)
        real, seen = getattr(holder, name), []
        def dying(*args, **kwargs):
            seen.append(1)
            if len(seen) == {calls}:
                os._exit(137)
            return real(*args, **kwargs)
        setattr(holder, name, dying)
        from trace_tools.api import replay
        replay({str(dump)!r}, out={str(out)!r}, strategies={STRATEGIES!r}, workers=1)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TRACE_TOOLS_SHARD_ROWS": "1"})
    assert done.returncode == 137, f"the child finished instead of dying at {module}.{attribute}"


def test_a_sigkilled_run_resumes_to_the_uninterrupted_run(simulated_dump, finished, tmp_path):
    import time

    run, expected = finished
    out = tmp_path / "run"
    code = (
        f"from trace_tools.api import replay; replay({str(simulated_dump)!r}, out={str(out)!r}, "
        f"strategies={STRATEGIES!r}, workers=1)"
    )
    process = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "TRACE_TOOLS_SHARD_ROWS": "1"})
    deadline = time.monotonic() + 300
    while len(list((out / "shards").glob("*.done"))) < 3 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.02)
    process.kill()
    process.wait()
    assert not (out / "summary.json").exists()
    result = _replay(simulated_dump, out)
    assert result.resumed_shards >= 3
    assert run_contents(out) == expected


def test_a_finished_run_rerun_and_killed_no_longer_looks_finished(simulated_dump, finished, tmp_path):
    """summary.json is the run's finished marker: a rerun removes it first and writes it last, so a
    rerun that dies halfway never leaves old numbers beside new tables."""
    run, expected = finished
    copy = _copy(run, tmp_path)
    _killed_run(simulated_dump, copy, "trace_tools.io.shards", "_stream_tables", 2)
    assert not (copy / "summary.json").exists()
    assert CliRunner().invoke(app, ["report", str(copy)]).exit_code == 2
    _replay(simulated_dump, copy)
    assert run_contents(copy) == expected


# -- one writer -------------------------------------------------------------------------------------
def test_a_second_writer_is_refused_naming_the_first(simulated_dump, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    with shards.RunLock(out):
        with pytest.raises(UsageError, match=rf"being written by another trace-tools process \(pid {os.getpid()} on "):
            _replay(simulated_dump, out)
        result = CliRunner().invoke(app, ["replay", str(simulated_dump), "-s", "tree", "--out", str(out)])
        assert result.exit_code == 2 and "being written by another trace-tools process" in result.output
        assert "Traceback" not in result.output
    assert not (out / "shards").exists()  # the refused writer touched nothing
    _replay(simulated_dump, out)  # the lock went with its holder
    assert (out / "summary.json").is_file()


def test_a_resumed_run_reuses_its_sample_parts_and_encodes_only_what_changed(simulated_dump, tmp_path, monkeypatch):
    from trace_tools.io import sample_parts

    out = tmp_path / "run"
    _replay(simulated_dump, out)
    parts = samples_files(out)
    assert len(parts) > 2 and all(path.parent == out / "samples" for path in parts)
    expected = run_contents(out)
    stamps = {path.name: path.stat().st_mtime_ns for path in parts}
    parts[0].unlink()  # lost
    parts[1].write_bytes(parts[2].read_bytes())  # another shard's samples under its name
    encoded: list[str] = []
    real = sample_parts.encode
    monkeypatch.setattr(sample_parts, "encode", lambda *args: encoded.append(args[2].name) or real(*args))
    (out / "summary.json").unlink()
    _replay(simulated_dump, out)
    assert sorted(encoded) == sorted([parts[0].name, parts[1].name])
    assert all(path.stat().st_mtime_ns == stamps[path.name] for path in parts[2:])
    assert run_contents(out) == expected


# -- the fingerprint --------------------------------------------------------------------------------
def test_a_rerun_by_another_version_or_build_never_merges_old_shards(simulated_dump, tmp_path, monkeypatch):
    import trace_tools

    out = tmp_path / "run"
    real_version = trace_tools.__version__
    monkeypatch.setattr(trace_tools, "__version__", "0.0.1")
    replay(simulated_dump, out=out, strategies=["tree"])
    monkeypatch.setattr(trace_tools, "__version__", real_version)
    with pytest.raises(UsageError, match=rf"made with trace-tools 0.0.1, this is {real_version}; pass --overwrite"):
        replay(simulated_dump, out=out, strategies=["tree"])
    again = replay(simulated_dump, out=out, strategies=["tree"], overwrite=True)
    assert again.resumed_shards == 0
    real_digest = shards.code_digest()
    monkeypatch.setattr(shards, "code_digest", lambda: "0123456789abcdef")
    with pytest.raises(UsageError, match=r"another build of trace-tools \(the code that computes results changed\)"):
        replay(simulated_dump, out=out, strategies=["tree"])
    monkeypatch.setattr(shards, "code_digest", lambda: real_digest)
    assert replay(simulated_dump, out=out, strategies=["tree"]).resumed_shards == 1


def test_the_code_digest_covers_the_modules_that_compute_results():
    root = Path(shards.__file__).resolve().parents[1]
    covered = {
        path
        for part in shards.RESULT_CODE
        for path in ((root / part).rglob("*.py") if (root / part).is_dir() else [root / part])
    }
    assert root / "strategies" / "tree_core.py" in covered and root / "render" / "renderer.py" in covered
    assert not any("report" in path.parts or "cli" in path.parts for path in covered)
    assert len(shards.code_digest()) == 16


# -- many tiny sessions -----------------------------------------------------------------------------
def test_many_one_turn_sessions_make_few_shards(tmp_path):
    dump = one_turn_dump(tmp_path / "tiny.parquet", 1500)
    result = replay(dump, out=tmp_path / "run", strategies=["tree"], workers=1)
    assert result.sessions_replayed == 1500
    assert len(list((tmp_path / "run" / "shards").glob("*.done"))) == 1
    assert [pq.ParquetFile(path).metadata.num_row_groups for path in samples_files(tmp_path / "run")] == [1]
    assert pq.read_table(tmp_path / "run" / "turns.parquet").num_rows == 1500


def test_shards_close_at_the_row_limit_and_merge_in_order(tmp_path, monkeypatch):
    dump = one_turn_dump(tmp_path / "tiny.parquet", 300)
    monkeypatch.setenv("TRACE_TOOLS_SHARD_ROWS", "64")
    replay(dump, out=tmp_path / "run", strategies=["tree"], workers=1)
    markers = [json.loads(p.read_text()) for p in sorted((tmp_path / "run" / "shards").glob("*.done"))]
    assert [(m["start"], m["end"]) for m in markers] == [(i, min(i + 64, 300)) for i in range(0, 300, 64)]
    ids = pq.read_table(tmp_path / "run" / "sessions.parquet").column("session_id").to_pylist()
    assert ids == [f"tiny-{i:07d}" for i in range(300)]
