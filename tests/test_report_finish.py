"""The end of a replay (`report.finish`): the report helper writes what this process writes, the
command line's replaying process never imports pandas, and nothing is lost when the helper fails."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from trace_tools.report import finish
from trace_tools.report.finish import ReportHelper, ReportJob, RunFacts, write_run_report

REPORT_FILES = ("report.html", "report.md", "summary.json", "plots")


def _unreported_copy(run_dir: Path, target: Path) -> Path:
    """The run directory as the replay leaves it before its end: tables, no report."""
    shutil.copytree(run_dir, target, ignore=shutil.ignore_patterns(*REPORT_FILES, "shards"))
    return target


def _job(run: Path, sample_run) -> ReportJob:
    summary = sample_run.summary
    facts = RunFacts(summary["sessions_total"], summary["turns_total"], summary["vocab_checked"], summary["warnings"])
    return ReportJob(run, facts, list(summary["strategies"]), summary["reconstruction"])


@pytest.fixture(params=["forked", "spawned"])
def start(request) -> str:
    """How the helper starts: forked from this process (as the command line's replay does where
    its workers could be forked), or a fresh interpreter. This test process keeps idle threads of
    earlier runs (the template watchdog), which the helper's child never uses."""
    return request.param


def _fresh_helper(start: str = "spawned") -> ReportHelper:
    """A ReportHelper as a process without matplotlib gets one (this test process has it loaded)."""
    loaded = sys.modules.pop("matplotlib.figure", None)
    try:
        return ReportHelper(fork=start == "forked")
    finally:
        if loaded is not None:
            sys.modules["matplotlib.figure"] = loaded


def _written(run: Path) -> dict[str, bytes]:
    """The report's files, with the run directory's own path taken out of the pages."""
    files = {name: (run / name).read_bytes() for name in ("report.html", "report.md")}
    files = {name: data.replace(str(run).encode(), b"RUN") for name, data in files.items()}
    files.update({f"plots/{p.name}": p.read_bytes() for p in sorted((run / "plots").iterdir())})
    return files


def test_the_report_helper_writes_what_this_process_writes(sample_run, tmp_path, start):
    helped = _unreported_copy(sample_run.run_dir, tmp_path / "helped" / "run")
    here = _unreported_copy(sample_run.run_dir, tmp_path / "here" / "run")  # the same name: pages show it
    with _fresh_helper(start) as helper:
        kind = finish._ForkedHelper if start == "forked" else subprocess.Popen
        assert isinstance(helper._process, kind)  # a real helper process, not the fallback
        if start == "forked":  # named apart from the replay, whose command line it shares
            assert Path(f"/proc/{helper._process.pid}/comm").read_text().strip() == finish.HELPER_NAME
            assert finish._process_name() != finish.HELPER_NAME
        summary = helper.report(_job(helped, sample_run))
    assert summary == write_run_report(_job(here, sample_run)) == sample_run.summary
    assert _written(helped) == _written(here)
    assert sorted(_written(here)) == [
        "plots/coverage_by_tool.png",
        "plots/drift_start.png",
        "plots/samples_per_session.png",
        "report.html",
        "report.md",
    ]


def _failing_serve(jobs, answers):
    raise RuntimeError("a helper that fails")


@pytest.mark.parametrize(
    "failure",
    [
        ("spawned", "executable", "no-such-python"),  # cannot start
        ("spawned", "executable", "/bin/false"),  # exits 1 without an answer
        ("forked", "fork", None),  # cannot start: fork refused
        ("forked", "serve", None),  # fails in the child
    ],
)
def test_the_report_is_written_here_when_the_helper_cannot_run(sample_run, tmp_path, monkeypatch, failure):
    way, what, value = failure
    if what == "executable":
        monkeypatch.setattr(sys, "executable", value if value.startswith("/") else str(tmp_path / value))
    elif what == "fork":

        def refused():
            raise BlockingIOError("fork: resources temporarily unavailable")

        monkeypatch.setattr(os, "fork", refused)
    else:
        monkeypatch.setattr(finish, "_serve", _failing_serve)
    run = _unreported_copy(sample_run.run_dir, tmp_path / "run")
    with _fresh_helper(way) as helper:
        assert (helper._process is None) == (what == "fork" or value == "no-such-python")
        summary = helper.report(_job(run, sample_run))
    assert summary == sample_run.summary
    assert sorted(p.name for p in (run / "plots").iterdir()) == [
        "coverage_by_tool.png",
        "drift_start.png",
        "samples_per_session.png",
    ]
    assert (run / "report.html").is_file() and (run / "report.md").is_file()


def test_an_unused_report_helper_is_stopped(start):
    with _fresh_helper(start) as helper:
        process = helper._process
    assert process is not None and process.poll() is not None
    assert not Path(f"/proc/{process.pid}").exists()  # reaped, not left a zombie


def test_a_process_with_matplotlib_loaded_writes_its_own_report():
    import matplotlib.figure  # noqa: F401 - what a notebook or an earlier replay has loaded

    with ReportHelper() as helper:
        assert helper._process is None


def test_a_helper_stopped_while_drawing_leaves_no_drawer_behind(sample_run, tmp_path, start):
    def drawers(helper_pid: int) -> list[int]:
        return [
            int(pid) for task in Path(f"/proc/{helper_pid}/task").glob("*/children") for pid in task.read_text().split()
        ]

    run = _unreported_copy(sample_run.run_dir, tmp_path / "run")
    with _fresh_helper(start) as helper:
        process = helper._process
        assert process is not None and process.stdin is not None
        helper._handed = True  # as `report` does, without waiting for the answer
        process.stdin.write(pickle.dumps(_job(run, sample_run)))
        process.stdin.close()
        seen, deadline = [], time.monotonic() + 60
        while not seen and process.poll() is None and time.monotonic() < deadline:
            seen = drawers(process.pid)
            time.sleep(0.001)
    assert seen
    assert [pid for pid in seen if Path(f"/proc/{pid}").exists()] == []


_NO_PANDAS_REPLAY = """
import atexit, runpy, sys
from trace_tools.report import finish
helpers = []
started = finish.ReportHelper.__init__
finish.ReportHelper.__init__ = lambda self, *a, **k: (started(self, *a, **k), helpers.append(type(self._process).__name__))[0]
atexit.register(lambda: print("helper:", *helpers, "pandas imported:", "pandas" in sys.modules))
sys.argv = ["trace-tools", "replay", "--out", sys.argv[1], "-s", "tree", "-s", "linear", "--workers", "1"]
runpy.run_module("trace_tools.cli.main", run_name="__main__")
"""


def test_the_command_line_replay_never_imports_pandas_and_writes_the_whole_report(sample_run, tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "COLUMNS": "80"}
    done = subprocess.run(
        [sys.executable, "-c", _NO_PANDAS_REPLAY, str(run)], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("helper: _ForkedHelper pandas imported: False")  # forked: one thread
    summary = json.loads((run / "summary.json").read_text())
    for name in ("tree", "linear"):
        assert summary["strategies"][name] == sample_run.summary["strategies"][name]
    assert len(list((run / "plots").glob("*.png"))) == 3
    assert "<html" in (run / "report.html").read_text() and (run / "report.md").stat().st_size


_ARROW_WITHOUT_PANDAS = """
import math, sys
import pyarrow as pa
from trace_tools.arrow_pool import arrow_without_pandas, pandas_interop
assert arrow_without_pandas()
table = pa.table({"ids": pa.array([[1, 2], [3]]), "name": ["a", None]})  # rows to Arrow, as replay builds them
assert "pandas" not in sys.modules and table.column("name").null_count == 1
pandas_interop()
import pandas as pd
series = pd.Series([1.5, math.nan])
assert pa.array(series, from_pandas=True).null_count == 1
frame = pd.DataFrame({"x": [1, 2], "y": ["p", None]})
assert pa.Table.from_pandas(frame, preserve_index=False).to_pandas().equals(frame)
print("ok")
"""


def test_arrow_kept_from_pandas_converts_rows_and_pandas_objects_as_before():
    """pyarrow looks for pandas once, on its first conversion; kept from it there, a process still
    converts rows, and once `pandas_interop` ran, pandas objects, as pyarrow always does."""
    done = subprocess.run([sys.executable, "-c", _ARROW_WITHOUT_PANDAS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_session_that_drifted_most_is_read_without_pandas():
    from trace_tools.report.tables import _most_drifted

    rows = [
        ("s2", 4, "tool_call_id", False),  # no token shows it: only where nothing else drifted
        ("s2", 5, "tool_call_id", False),
        ("s2", 6, "tool_call_id", False),
        ("s1", 7, "json_format", True),
        ("s1", 3, "whitespace", True),
        ("s0", 2, "json_format", True),
        ("s0", 9, "json_format", True),
        ("s3", 1, None, False),  # echoed, not drifted
    ]
    drift = pa.table(dict(zip(("session_id", "turn_index", "cause", "token_drift"), map(list, zip(*rows)))))
    assert _most_drifted(drift) == ("s0", 2, "json_format")  # a tie on two turns: the first id
    assert _most_drifted(drift.filter(pa.compute.field("token_drift") == False)) == ("s2", 4, "tool_call_id")  # noqa: E712
    assert _most_drifted(None) is None
    assert _most_drifted(drift.drop_columns(["cause"])) is None


@pytest.mark.parametrize("gathered", [False, True])
def test_a_job_pickles_whole(sample_run, tmp_path, gathered):
    """What the helper is sent arrives as it was: the sample bars too (without their lock)."""
    from trace_tools.report.sample_bars import GatheredBars

    bars = GatheredBars()
    if gathered:
        from trace_tools.io.sample_parts import read_samples

        bars.add(read_samples(sample_run.run_dir))
    job = _job(tmp_path, sample_run)
    job.gathered = bars
    copy = pickle.loads(pickle.dumps(job))
    wanted = {sid for _, sid in bars._bars or {}}
    assert copy.facts == job.facts and copy.reconstruction == job.reconstruction
    assert copy.gathered.bars(wanted) == bars.bars(wanted)
    copy.gathered.add(pa.table({"session_id": pa.array([], pa.string())}))  # its lock works
