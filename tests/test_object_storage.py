"""Dumps and run directories in object storage (`s3://`, `gs://`), against real servers on loopback
(moto's server mode, `s3_server` in conftest; a Cloud Storage emulator, `gcs_server`): the dump is
read in place, the run directory is staged and uploaded shard by shard, and every command that
takes a dump or a run takes a URI."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from io_support import run_contents
from trace_tools.api import open_run, replay
from trace_tools.cli.main import app
from trace_tools.errors import TraceToolsError, UsageError
from trace_tools.io import remote_lock, storage, validate
from trace_tools.io.export import export_samples, read_export
from trace_tools.io.rundir import load_run_info
from trace_tools.reconstruct import reconstruct
from trace_tools.report.compare import compare

pytestmark = pytest.mark.object_storage  # every test here needs the loopback S3 or Cloud Storage server

STRATEGIES = ["tree", "linear", "checkpoint-tree"]


@pytest.fixture(scope="module")
def dumps(s3_server, simulated_dump, tmp_path_factory):
    """The simulated dump as a directory of two files (a session spans them), locally and in S3."""
    local = tmp_path_factory.mktemp("dump-copy") / "sim"
    table = pq.read_table(simulated_dump)
    (local / "nested").mkdir(parents=True)
    pq.write_table(table.slice(0, 70), local / "part-0.parquet", row_group_size=16)
    pq.write_table(table.slice(70), local / "nested" / "part-1.parquet", row_group_size=16)
    bucket = s3_server()
    storage.upload(local, f"{bucket}/dumps/sim", ["part-0.parquet", "nested/part-1.parquet"])
    return local, f"{bucket}/dumps/sim", bucket


@pytest.fixture(scope="module")
def local_run(dumps, tmp_path_factory):
    local, _, _ = dumps
    out = tmp_path_factory.mktemp("local-run") / "run"
    replay(local, out=out, strategies=STRATEGIES, workers=1)
    return out


@pytest.fixture(scope="module")
def s3_run(dumps):
    _, uri, bucket = dumps
    return replay(uri, out=f"{bucket}/runs/r1", strategies=STRATEGIES, workers=1)


def test_an_s3_dump_replays_to_the_same_tables_as_its_local_copy(dumps, local_run, s3_run):
    _, uri, bucket = dumps
    assert s3_run.run_dir == f"{bucket}/runs/r1"
    with storage.local_run(s3_run.run_dir) as copy:
        assert run_contents(copy) == run_contents(local_run)
        assert json.loads((copy / "run.json").read_text())["inputs"]["dump"] == uri
        assert (copy / "report.html").stat().st_size and list((copy / "plots").glob("*.png"))
    assert storage.is_file(f"{bucket}/runs/r1/shards/0000000.done")


def test_validate_and_reconstruct_read_the_dump_in_place(dumps):
    local, uri, _ = dumps
    remote, here = validate(uri).to_dict(), validate(local).to_dict()
    assert remote.pop("files") == [f"{uri}/nested/part-1.parquet", f"{uri}/part-0.parquet"]
    assert (remote.pop("path"), here.pop("path"), here.pop("files")) and remote == here
    assert reconstruct(uri).summary == reconstruct(local).summary == reconstruct(uri, workers=2).summary
    runner = CliRunner()
    for argv in (["validate", uri, "--strict"], ["reconstruct", uri, "--json"]):
        result = runner.invoke(app, argv)
        assert result.exit_code == 0, result.output


def test_report_and_export_take_a_run_in_s3(s3_run, local_run):
    run = s3_run.run_dir
    storage.delete(run, ["report.md", "report.html"])
    result = CliRunner().invoke(app, ["report", run, "--html"])
    assert result.exit_code == 0, result.output
    assert storage.is_file(f"{run}/report.md") and storage.is_file(f"{run}/report.html")
    result = CliRunner().invoke(app, ["export", run, "--strategy", "linear", "--format", "jsonl"])
    assert result.exit_code == 0, result.output
    exported = export_samples(local_run, "linear", "jsonl")
    with storage.local_run(run) as copy:
        remote_rows = read_export(copy / "export" / "linear.jsonl")
    assert exported.samples and [_no_run_name(r) for r in remote_rows] == [
        _no_run_name(r) for r in read_export(exported.out)
    ]


def test_the_next_steps_printed_for_a_run_in_s3_run_as_printed(s3_run, tmp_path, monkeypatch):
    """After a replay into S3, the printed `explain` (the session that drifted most, read from the
    run's drift table in S3) and `gate` (the run in S3) commands work verbatim."""
    from trace_tools.report.tables import next_steps

    monkeypatch.chdir(tmp_path)
    (tmp_path / "rules.toml").write_text('[[rule]]\nmetric = "coverage"\nstrategy = "tree"\nop = ">="\nvalue = 0.1\n')
    printed = [shlex.split(line) for line in next_steps(s3_run.run_dir) if line.strip().startswith("trace-tools ")]
    assert [argv[1] for argv in printed] == ["explain", "gate"]
    assert printed[0][2] == load_run_info(s3_run.run_dir)["inputs"]["dump"]
    for argv in printed:
        result = CliRunner().invoke(app, argv[1:])
        assert result.exit_code == 0, result.output
        assert "PASS" in result.output if argv[1] == "gate" else "first divergence" in result.output


def test_compare_and_the_python_api_take_runs_in_s3(dumps, s3_run, local_run):
    comparison = compare(s3_run.run_dir, local_run)
    assert set(comparison.metrics["pair"]) >= set(STRATEGIES) and comparison.sessions.empty
    assert (comparison.metrics["delta"].fillna(0) == 0).all()
    result = CliRunner().invoke(app, ["compare", s3_run.run_dir, str(local_run)])
    assert result.exit_code == 0, result.output
    remote, here = open_run(s3_run.run_dir), open_run(local_run)
    assert remote.strategy_table().equals(here.strategy_table()) and remote.dump == dumps[1]
    assert remote.turns.equals(here.turns)


def test_a_run_in_s3_that_cannot_be_written_is_named_by_its_uri(dumps):
    """The checks of --out see the local staging directory; the message names the URI."""
    _, uri, _ = dumps
    result = CliRunner().invoke(app, ["replay", uri, "-s", "tree", "--out", uri])
    assert result.exit_code == 2
    assert f"--out {uri} is a directory that holds other files" in " ".join(result.output.split())


def test_a_dump_in_cloud_storage_replays_to_the_same_tables_as_its_local_copy(gcs_server, dumps, local_run, tmp_path):
    """`gs://` through pyarrow's Cloud Storage filesystem, against a local emulator: the dump read
    in place, the run directory written there, and read back by `gate`."""
    local, _, _ = dumps
    bucket = gcs_server()
    storage.upload(local, f"{bucket}/dumps/sim", ["part-0.parquet", "nested/part-1.parquet"])
    result = replay(f"{bucket}/dumps/sim", out=f"{bucket}/runs/r1", strategies=STRATEGIES, workers=1)
    with storage.local_run(result.run_dir) as copy:
        assert run_contents(copy) == run_contents(local_run)
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nmetric = "samples"\nstrategy = "tree"\nop = "<="\nvalue = 1\n')
    gated = CliRunner().invoke(app, ["gate", result.run_dir, "--rules", str(rules)])
    assert gated.exit_code == 1 and "FAIL" in gated.output  # the run has more than one sample: read, not guessed


def _no_run_name(row: dict) -> dict:
    """An exported row without the run's name (the two runs are named differently)."""
    row["metadata"]["trace_tools"].pop("run")
    return row


def test_a_missing_dump_or_bucket_is_a_clear_usage_error(dumps):
    _, _, bucket = dumps
    runner = CliRunner()
    for argv in (["validate", f"{bucket}/no-such-dump"], ["replay", "s3://no-such-bucket-here/dump", "-s", "tree"]):
        result = runner.invoke(app, argv)
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output and ("no such file" in result.output or "cannot" in result.output)


def test_a_killed_driver_resumes_from_the_shards_in_s3(dumps, local_run, monkeypatch, tmp_path):
    """The killed driver's lock and staging directory do not outlive it: the resume takes the lock
    (its holder's pid is gone), removes the staging directory, fetches the markers first and then
    only the files of the shards it reuses."""
    _, uri, bucket = dumps
    out = f"{bucket}/runs/killed"
    # TMPDIR: the killed driver cannot remove its staging directory; keep it in this test's folder
    env = {**os.environ, "TRACE_TOOLS_SHARD_ROWS": "1", "TRACE_TOOLS_WORKERS": "1", "TMPDIR": str(tmp_path)}
    _killed_after_two_shards(uri, out, env)
    assert storage.exists(f"{out}/shards/0000000.done") and not storage.exists(f"{out}/summary.json")
    assert storage.exists(f"{out}/{storage.LOCK_NAME}") and _staging_dirs(tmp_path)
    # a shard of another fingerprint: its marker is read, its files are never downloaded
    (tmp_path / "other" / "shards").mkdir(parents=True)
    (tmp_path / "other" / "shards" / "0000900.turns.parquet").write_bytes(b"x" * 1000)
    (tmp_path / "other" / "shards" / "0000900.done").write_text(
        json.dumps({"fingerprint": "other", "files": {"0000900.turns.parquet": [1000, ""]}})
    )
    storage.upload(tmp_path / "other", out, ["shards/0000900.turns.parquet", "shards/0000900.done"])
    monkeypatch.setenv("TRACE_TOOLS_SHARD_ROWS", "1")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    fetched: list[str] = []
    fetch = storage._fetch
    monkeypatch.setattr(
        storage, "_fetch", lambda uri, relative, target: (fetched.append(relative), fetch(uri, relative, target))
    )
    result = replay(uri, out=out, strategies=STRATEGIES, workers=1)
    assert result.resumed_shards >= 2
    assert not _staging_dirs(tmp_path) and not storage.exists(f"{out}/{storage.LOCK_NAME}")
    data = [name for name in fetched if name.startswith("shards/0")]
    markers = [index for index, name in enumerate(data) if name.endswith(".done")]
    assert markers == list(range(len(markers)))  # the markers first
    assert {name.split("/")[1].split(".")[0] for name in data[len(markers) :]} == {
        f"{position:07d}" for position in range(result.resumed_shards)
    }
    with storage.local_run(out) as copy:
        assert run_contents(copy) == run_contents(local_run)


def _killed_after_two_shards(uri: str, out: str, env: dict[str, str]) -> None:
    code = f"from trace_tools.api import replay; replay({uri!r}, out={out!r}, strategies={STRATEGIES!r})"
    process = subprocess.Popen([sys.executable, "-c", code], env=env)
    deadline = time.monotonic() + 300

    def finished() -> int:
        return sum(name.endswith(".done") for name in storage.list_files(f"{out}/shards")) if storage.exists(out) else 0

    while finished() < 2 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    process.kill()
    process.wait()


def _staging_dirs(root) -> list:
    return list(root.glob(f"{storage.STAGING_PREFIX}*"))


def test_a_second_driver_on_a_run_in_s3_is_refused_in_one_line(dumps, local_run, tmp_path):
    """Two drivers on one s3:// run: the one that comes second (even with other options) is refused
    before it touches anything, and the first one's run is whole."""
    _, uri, bucket = dumps
    out = f"{bucket}/runs/two-drivers"
    env = {**os.environ, "TRACE_TOOLS_SHARD_ROWS": "1", "TRACE_TOOLS_WORKERS": "1"}
    code = f"from trace_tools.api import replay; replay({uri!r}, out={out!r}, strategies={STRATEGIES!r})"
    first = subprocess.Popen([sys.executable, "-c", code], env=env)
    deadline = time.monotonic() + 120
    while not storage.exists(f"{out}/{storage.LOCK_NAME}") and time.monotonic() < deadline:
        assert first.poll() is None, "the first driver ended before it took the lock"
        time.sleep(0.05)
    second = CliRunner().invoke(app, ["replay", uri, "-s", "tree", "--out", out, "--overwrite"])
    assert first.wait(timeout=300) == 0
    lines = [line for line in second.output.splitlines() if line.strip()]
    assert second.exit_code == 2 and "Traceback" not in second.output
    assert f"{out} is being written by another trace-tools process (pid {first.pid} on" in " ".join(lines)
    assert not storage.exists(f"{out}/{storage.LOCK_NAME}")  # released at the first driver's end
    with storage.local_run(out) as copy:
        assert run_contents(copy) == run_contents(local_run)


@pytest.mark.parametrize("server", ["s3_server", "gcs_server"])
def test_the_remote_lock_admits_one_holder_and_takes_over_a_dead_one(server, request, monkeypatch):
    """S3: conditional create (boto3); Cloud Storage: the lease, read back after a pause."""
    monkeypatch.setattr(remote_lock, "SETTLE_SECONDS", 0.2)
    run = f"{request.getfixturevalue(server)()}/runs/locked"
    first, second = storage.remote_lock(run), storage.remote_lock(run)
    first.acquire()
    with pytest.raises(UsageError, match=f"{run} is being written by another trace-tools process"):
        second.acquire()
    first.release()
    second.acquire()  # released: free again
    second.release()
    stale = json.dumps({**remote_lock.this_process(), "pid": 2**22 + 1, "token": "dead", "expires": time.time() + 600})
    _put(run, stale)
    third = storage.remote_lock(run)
    third.acquire()  # its holder's pid is gone on this host
    assert json.loads(_get(run))["token"] == third.token
    third.release()


def _put(run: str, text: str) -> None:
    fs, path = storage._filesystem(f"{run}/{storage.LOCK_NAME}")
    with fs.open_output_stream(path) as out:
        out.write(text.encode())


def _get(run: str) -> str:
    fs, path = storage._filesystem(f"{run}/{storage.LOCK_NAME}")
    with fs.open_input_stream(path) as source:
        return source.read().decode()


def test_a_failed_upload_stops_the_run_at_once_and_a_resume_completes_it(dumps, local_run, monkeypatch, tmp_path):
    """Expired credentials half way: the next result stops the run (not its end), the shards
    uploaded before stay, the staging directory goes; the same command then resumes to the same tables."""
    _, uri, bucket = dumps
    out = f"{bucket}/runs/upload-fails"
    monkeypatch.setenv("TRACE_TOOLS_SHARD_ROWS", "1")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    upload, failed, written_after = storage.upload, threading.Event(), []

    def expiring(local, target, relatives):
        if any(name.startswith("shards/0000003.") for name in relatives):
            failed.set()
            raise OSError("When uploading part: AWS Error ACCESS_DENIED: The provided token has expired.")
        upload(local, target, relatives)

    shard_written = storage.StagedRun.shard_written

    def noting(self, name):
        if failed.is_set():
            written_after.append(name)
        shard_written(self, name)

    monkeypatch.setattr(storage, "upload", expiring)
    monkeypatch.setattr(storage.StagedRun, "shard_written", noting)
    with pytest.raises(TraceToolsError, match=f"uploading to {out} failed .*token has expired.*rerun the same command"):
        replay(uri, out=out, strategies=STRATEGIES, workers=1)
    assert len(written_after) <= 1  # the next shard closed after the failure raised it (one session a shard)
    assert not _staging_dirs(tmp_path) and not storage.exists(f"{out}/{storage.LOCK_NAME}")
    markers = [f for f in storage.list_files(f"{out}/shards") if f.endswith(".done")]
    assert [m.rsplit("/", 1)[1] for m in markers] == ["0000000.done", "0000001.done", "0000002.done"]
    assert not storage.exists(f"{out}/summary.json")
    monkeypatch.setattr(storage, "upload", upload)
    result = replay(uri, out=out, strategies=STRATEGIES, workers=1)
    assert result.resumed_shards == 3
    with storage.local_run(out) as copy:
        assert run_contents(copy) == run_contents(local_run)


def test_an_out_uri_naming_an_object_is_refused(dumps):
    _, uri, _ = dumps
    result = CliRunner().invoke(app, ["replay", uri, "-s", "tree", "--out", f"{uri}/part-0.parquet"])
    assert result.exit_code == 2 and "is a file; pass a directory path" in result.output


def test_local_paths_and_file_uris_stay_local(simulated_dump):
    assert storage.location(f"file://{simulated_dump}") == simulated_dump
    assert not storage.is_uri(str(simulated_dump)) and storage.is_uri("gs://bucket/dump")
    assert validate(f"file://{simulated_dump}").sessions == validate(simulated_dump).sessions
