"""Issue 40's papercuts, each as a new user meets it: in a pipe, at 80 columns, with a typo or a label
copied from the terminal."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trace_tools.cli.main import app
from trace_tools.io.bundled import sample_dir, shown_dump
from trace_tools.replay import executors
from trace_tools.replay.executors import SMALL_REPLAY, auto_workers, default_workers
from trace_tools.strategies.registry import available_strategies

REPO = Path(__file__).parents[1]


def _cli(*argv, cwd=None):
    """The console script as a user runs it (through `main`, not the test runner), at 80 columns."""
    env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-c", "from trace_tools.cli.main import main; main()", *map(str, argv)]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


def test_a_closed_pipe_exits_0(sample_run):
    """`trace-tools compare RUN RUN | head -2`: the reader stops early; that is no failure (1 = check failed)."""
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(REPO)}
    script = "from trace_tools.cli.main import main; main()"
    shell = f'"{sys.executable}" -c "{script}" compare "{sample_run.run_dir}" "{sample_run.run_dir}" | head -2'
    result = subprocess.run(
        ["bash", "-c", f"{shell}; echo rc=${{PIPESTATUS[0]}}"], capture_output=True, text=True, env=env
    )
    assert result.stdout.strip().endswith("rc=0"), result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "Error" not in result.stderr


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["replay", "--bogus"], "No such option '--bogus'"),
        (["compare"], "Missing argument 'RUN_A'"),
        (["export", "somewhere"], "Missing option '--strategy'"),
    ],
)
def test_framework_usage_errors_are_one_line(argv, needle):
    result = _cli(*argv)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and needle in lines[0], result.stderr
    assert "-h`" in lines[0] and "╭" not in result.stderr


def test_a_misspelt_strategy_gets_a_valid_suggestion(sample_run):
    result = CliRunner().invoke(app, ["compare", str(sample_run.run_dir), "-s", "chekpoint-tree", "-s", "tree"])
    assert result.exit_code == 2
    assert "did you mean 'checkpoint-tree'" in result.output and "--strategy chekpoint-tree" not in result.output


def test_short_labels_are_accepted_where_they_are_printed(sample_run, tmp_path):
    runner = CliRunner()
    exported = runner.invoke(
        app, ["export", str(sample_run.run_dir), "--strategy", "ckpt", "--out", str(tmp_path / "ckpt.parquet")]
    )
    assert exported.exit_code == 0 and "of checkpoint-tree" in exported.output, exported.output
    compared = runner.invoke(app, ["compare", str(sample_run.run_dir), "-s", "ckpt", "-s", "lin+rst"])
    assert compared.exit_code == 0 and "A = checkpoint-tree, B = linear+restore" in compared.output


@pytest.mark.parametrize("forks", [True, False])
def test_small_replays_run_in_one_process(simulated_dump, monkeypatch, forks):
    """The default worker count weighs the turns by the strategies replayed, against the threshold
    of the way workers start (executors.SMALL_REPLAY): forked ones pay sooner."""
    monkeypatch.delenv("TRACE_TOOLS_WORKERS", raising=False)
    monkeypatch.setattr(executors, "can_fork", lambda: forks)
    import pyarrow.parquet as pq

    turns = pq.read_metadata(simulated_dump).num_rows
    every = len(available_strategies())
    shared, small = SMALL_REPLAY["fork" if forks else "spawn"]
    assert turns * (shared + every) < small
    assert auto_workers(Path(simulated_dump), every) == 1
    # the bundled sample (330 turns), every strategy: two forked workers pay, two spawned ones do not
    assert auto_workers(sample_dir(), every) == (default_workers() if forks else 1)
    work = turns * (shared + 1)  # one strategy: less work than two
    monkeypatch.setitem(SMALL_REPLAY, "fork" if forks else "spawn", (shared, work + 1))
    assert auto_workers(Path(simulated_dump), 1) == 1
    assert auto_workers(Path(simulated_dump), 2) == default_workers()  # more strategies, more work
    monkeypatch.setenv("TRACE_TOOLS_WORKERS", "3")
    monkeypatch.setitem(SMALL_REPLAY, "fork" if forks else "spawn", (shared, 10**9))
    assert auto_workers(Path(simulated_dump), every) == 3  # the user's choice wins


def test_the_bundled_sample_is_shown_and_taken_as_sample_traces(sample_run, tmp_path):
    from trace_tools.report.tables import next_steps

    assert shown_dump(str(sample_dir())) == "sample_traces/"
    hint = next(line for line in next_steps(sample_run.run_dir) if "trace-tools explain" in line)
    assert "trace-tools explain sample_traces/ --session" in hint and "site-packages" not in hint
    assert "dump sample_traces/ · created" in (sample_run.run_dir / "report.html").read_text()
    # the hint works from any directory: `sample_traces/` names the bundled sample where no such path exists
    result = _cli(*hint.split()[1:], cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_install_hints_use_the_repository_not_a_package_index():
    """trace-tools is not on a package index: no hint, doc or CI example may say `pip install "trace-tools[...]"`."""
    index_install = re.compile(r"pip install\s+['\"]?trace-tools\[")
    files = [
        *(REPO / "trace_tools").rglob("*.py"),
        *(REPO / "docs").rglob("*.md"),
        *(REPO / "docs" / "ci").glob("*.yml"),
    ]
    offenders = [str(f.relative_to(REPO)) for f in [*files, REPO / "README.md"] if index_install.search(f.read_text())]
    assert offenders == []
    for example in (REPO / "docs" / "ci").glob("*.yml"):
        text = example.read_text()
        assert 'pip install "./trace-tools[templates]"' in text and "download.pytorch.org/whl/cpu" in text
        assert text.index("whl/cpu") < text.index("./trace-tools[templates]")  # the CPU torch first


def test_the_command_line_exits_without_teardown_yet_runs_exit_handlers(tmp_path):
    """`cli.main._exit`: the interpreter's teardown is skipped, not the exit handlers, the exit
    code or output still buffered in a pipe."""
    script = (
        "import atexit, sys; atexit.register(lambda: print('exit handler ran', flush=True)); "
        "from trace_tools.cli.main import main; main()"
    )
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(REPO)}
    ok = subprocess.run([sys.executable, "-c", script, "--version"], capture_output=True, text=True, env=env)
    assert ok.returncode == 0 and ok.stdout.splitlines()[-1] == "exit handler ran", ok.stdout + ok.stderr
    assert ok.stdout.splitlines()[0].startswith("trace-tools")
    bad = subprocess.run([sys.executable, "-c", script, "replay", "--bogus"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "No such option" in bad.stderr and "exit handler ran" in bad.stdout


def test_a_running_non_daemon_thread_is_waited_for(tmp_path):
    """The fast exit would kill it: the ordinary exit joins it first."""
    marker = tmp_path / "thread-finished"
    script = (
        "import threading, time, pathlib\n"
        "def work():\n"
        "    time.sleep(0.5)\n"
        f"    pathlib.Path({str(marker)!r}).write_text('done')\n"
        "threading.Thread(target=work).start()\n"
        "from trace_tools.cli.main import main; main()\n"
    )
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script, "--version"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "done"
