"""The command line's processes allocate Arrow's buffers with jemalloc (trace_tools.arrow_pool),
unless the user chose an allocator; run.json says which one the run used."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from trace_tools.arrow_pool import POOL_VARIABLE, prefer_jemalloc

needs_jemalloc = pytest.mark.skipif(
    "jemalloc" not in pa.supported_memory_backends(), reason="this pyarrow was built without jemalloc"
)


@pytest.fixture
def own_pool():
    """Restore this process's pool and the variable after the test changes them (prefer_jemalloc
    sets the variable itself, which monkeypatch would not undo when it was unset before)."""
    before, variable = pa.default_memory_pool(), os.environ.pop(POOL_VARIABLE, None)
    yield
    pa.set_memory_pool(before)
    os.environ.pop(POOL_VARIABLE, None)
    if variable is not None:
        os.environ[POOL_VARIABLE] = variable


def _child_pool(queue) -> None:
    queue.put(pa.default_memory_pool().backend_name)


@needs_jemalloc
def test_jemalloc_becomes_the_pool_here_and_in_spawned_processes(own_pool):
    assert prefer_jemalloc() == "jemalloc"
    assert pa.default_memory_pool().backend_name == "jemalloc"
    assert os.environ[POOL_VARIABLE] == "jemalloc"
    context = multiprocessing.get_context("spawn")  # how replay workers and the plot helper start
    queue = context.Queue()
    child = context.Process(target=_child_pool, args=(queue,))
    child.start()
    assert queue.get(timeout=60) == "jemalloc"
    child.join()


def test_a_users_choice_of_allocator_is_kept(own_pool, monkeypatch):
    monkeypatch.setenv(POOL_VARIABLE, "system")
    before = pa.default_memory_pool().backend_name
    assert prefer_jemalloc() is None
    assert pa.default_memory_pool().backend_name == before
    assert os.environ[POOL_VARIABLE] == "system"


@needs_jemalloc
@pytest.mark.parametrize("chosen", [None, "system"])
def test_run_json_names_the_allocator_the_command_used(simulated_dump, tmp_path, chosen):
    env = {key: value for key, value in os.environ.items() if key != POOL_VARIABLE}
    if chosen:
        env[POOL_VARIABLE] = chosen
    out = tmp_path / "run"
    command = [sys.executable, "-m", "trace_tools.cli.main", "replay", str(simulated_dump), "-s", "tree"]
    subprocess.run([*command, "--workers", "1", "--out", str(out)], env=env, check=True, capture_output=True)
    assert json.loads((out / "run.json").read_text())["arrow_memory_pool"] == (chosen or "jemalloc")


# The command line as a user runs it, and at its exit (`cli.main._exit` runs the exit handlers):
# which pool is pyarrow's, and whether Arrow ever allocated through mimalloc.
COMMAND_LINE_POOLS = """
import atexit, runpy, sys
def report():
    import pyarrow as pa
    print(pa.default_memory_pool().backend_name, pa.mimalloc_memory_pool().max_memory(), file=sys.stderr)
atexit.register(report)
sys.argv = ["trace-tools", *sys.argv[1:]]
runpy.run_module("trace_tools.cli.main", run_name="__main__")
"""


@needs_jemalloc
def test_the_command_line_sets_the_pool_before_arrow_loads_so_arrows_own_buffers_use_it_too():
    """Arrow's C++ reads the variable once, as pyarrow loads: set afterwards, the buffers Arrow
    allocates inside a call (reading Parquet pages here, Parquet's and IPC's when writing) stayed
    on mimalloc (docs/performance.md#arrows-allocator). `reconstruct`'s dump argument loads pyarrow
    while the arguments are parsed, before the command runs."""
    env = {key: value for key, value in os.environ.items() if key != POOL_VARIABLE}
    sample = Path(__file__).resolve().parents[1] / "sample_traces"
    command = [sys.executable, "-c", COMMAND_LINE_POOLS, "reconstruct", str(sample), "--workers", "1"]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr.split()[-2:] == ["jemalloc", "0"]
