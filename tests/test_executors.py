"""Output never depends on the worker count or the executor, and a killed run resumes (DESIGN §8)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trace_tools.api import replay
from io_support import run_contents

@pytest.fixture(scope="module")
def single_process_run(simulated_dump, tmp_path_factory):
    out = tmp_path_factory.mktemp("w1") / "run"
    replay(simulated_dump, out=out, workers=1)
    return run_contents(out)


def test_two_workers_give_the_same_run_directory(simulated_dump, tmp_path, single_process_run):
    replay(simulated_dump, out=tmp_path / "run", workers=2)
    assert run_contents(tmp_path / "run") == single_process_run


def test_ray_gives_the_same_run_directory(simulated_dump, tmp_path, single_process_run):
    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        replay(simulated_dump, out=tmp_path / "run", executor="ray", workers=2)
    finally:
        ray.shutdown()
    assert run_contents(tmp_path / "run") == single_process_run


def test_a_killed_run_resumes_to_the_same_result(simulated_dump, tmp_path, single_process_run):
    out = tmp_path / "run"
    env = {**os.environ, "TRACE_TOOLS_SHARD_SIZE": "3", "TRACE_TOOLS_WORKERS": "1"}
    code = f"from trace_tools.api import replay; replay({str(simulated_dump)!r}, out={str(out)!r})"
    process = subprocess.Popen([sys.executable, "-c", code], env=env)
    deadline = time.monotonic() + 300
    while not (out / "shards" / "00001.done").exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    process.kill()
    process.wait()
    finished = sorted(p.name for p in (out / "shards").glob("*.done"))
    assert "00000.done" in finished and not (out / "summary.json").exists()
    os.environ["TRACE_TOOLS_SHARD_SIZE"] = "3"
    try:
        result = replay(simulated_dump, out=out, workers=1)
    finally:
        del os.environ["TRACE_TOOLS_SHARD_SIZE"]
    assert result.resumed_shards >= 2
    assert run_contents(out) == single_process_run
