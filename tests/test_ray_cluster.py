"""A real Ray cluster of two raylets on this machine: `ray start --head` and `ray start --address`
for a second node, token authentication on (as a local Ray now defaults to), the driver started
with `trace-tools replay --executor ray --address`, or as a job with `ray job submit` (the
recipe of docs/scale.md). Workers on both nodes read the dump from S3 (the local server of
conftest) themselves; the run directory equals `--workers 1`'s.

Both nodes run with `--block`, each in its own process group, so the test stops exactly the
processes it started (never `ray stop`, which would stop every Ray on the machine)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from io_support import free_port, run_contents
from trace_tools.api import replay
from trace_tools.io import storage

pytestmark = pytest.mark.slow
STRATEGIES = ["tree", "linear+restore", "checkpoint-tree"]


def _node_ports() -> list[str]:
    """Every port a node opens, chosen free, so two nodes on one machine do not collide."""
    names = (
        "node-manager",
        "object-manager",
        "dashboard-agent-listen",
        "dashboard-agent-grpc",
        "runtime-env-agent",
        "metrics-export",
    )
    return [arg for name in names for arg in (f"--{name}-port", str(free_port()))]


def _start_node(arguments: list[str], log: Path, env: dict) -> subprocess.Popen:
    ray = Path(sys.executable).with_name("ray")
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--disable-usage-stats", "--block"]
    with open(log, "wb") as out:
        return subprocess.Popen(
            [str(ray), "start", *arguments, *common, *_node_ports()],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def _wait_for(log: Path, node: subprocess.Popen, text: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        if node.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"a Ray node did not start: {log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.25)


def _stop(node: subprocess.Popen) -> None:
    if node.poll() is None:
        node.send_signal(signal.SIGTERM)  # `ray start --block` stops its node's processes on SIGTERM
        try:
            node.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(node.pid, signal.SIGKILL)  # the group this test created for that node
            node.wait()


@dataclass
class Cluster:
    address: str  # HOST:PORT of the head, for --address
    dashboard: str  # http://HOST:PORT of the head's job server, for `ray job submit`
    env: dict  # this process's environment with the cluster's token


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, s3_server):
    """A head node (with the dashboard, which serves jobs) and one worker node."""
    folder = tmp_path_factory.mktemp("ray-cluster")
    sessions = Path(tempfile.mkdtemp(prefix="tt-ray-"))  # short: Ray's socket paths must fit in 107 bytes
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    port, dashboard = free_port(), free_port()
    head = _start_node(
        [
            "--head",
            "--port",
            str(port),
            "--include-dashboard",
            "true",
            "--dashboard-host",
            "127.0.0.1",
            "--dashboard-port",
            str(dashboard),
            "--temp-dir",
            str(sessions),
        ],
        folder / "head.log",
        env,
    )
    nodes = [head]
    try:
        _wait_for(folder / "head.log", head, "Ray runtime started")
        worker = _start_node(["--address", f"127.0.0.1:{port}"], folder / "worker.log", env)
        nodes.append(worker)
        _wait_for(folder / "worker.log", worker, "Ray runtime started")
        yield Cluster(f"127.0.0.1:{port}", f"http://127.0.0.1:{dashboard}", env)
    finally:
        for node in reversed(nodes):
            _stop(node)
        shutil.rmtree(sessions, ignore_errors=True)


@pytest.fixture(scope="module")
def one_worker_run(simulated_dump, tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "run"
    replay(simulated_dump, out=out, strategies=STRATEGIES, workers=1)
    return run_contents(out)


def test_a_two_raylet_cluster_replays_like_one_worker(cluster, s3_server, simulated_dump, tmp_path, one_worker_run):
    bucket = s3_server()
    storage.upload(simulated_dump.parent, bucket, [simulated_dump.name])
    command = [
        sys.executable,
        "-m",
        "trace_tools.cli.main",
        "replay",
        f"{bucket}/{simulated_dump.name}",
        "--executor",
        "ray",
        "--address",
        cluster.address,
        "--out",
        str(tmp_path / "cluster"),
    ]
    done = subprocess.run(
        [*command, *(f"--strategy={name}" for name in STRATEGIES)],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "on 2 node(s)" in done.stdout + done.stderr  # both raylets replayed sessions
    assert run_contents(tmp_path / "cluster") == one_worker_run


def test_a_job_submitted_to_the_cluster_writes_the_run_to_object_storage(
    cluster, s3_server, simulated_dump, tmp_path, one_worker_run
):
    """docs/scale.md's `ray job submit` line: the token in the submitter's environment, the storage
    endpoint in the job's runtime environment (as the recipe has it; these nodes have it in their
    own environment too), `--address auto` in the job (it runs on the head), dump and run
    directory in S3."""
    bucket = s3_server()
    storage.upload(simulated_dump.parent, bucket, [simulated_dump.name])
    runtime_env = {"env_vars": {"AWS_ENDPOINT_URL": os.environ["AWS_ENDPOINT_URL"]}}
    entrypoint = [str(Path(sys.executable).with_name("trace-tools")), "replay", f"{bucket}/{simulated_dump.name}"]
    entrypoint += ["--executor", "ray", "--address", "auto", "--out", f"{bucket}/runs/job"]
    entrypoint += [f"--strategy={name}" for name in STRATEGIES]
    ray = Path(sys.executable).with_name("ray")
    submit = [str(ray), "job", "submit", "--address", cluster.dashboard, "--runtime-env-json", json.dumps(runtime_env)]
    done = subprocess.run([*submit, "--", *entrypoint], env=cluster.env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "succeeded" in done.stdout + done.stderr and "on 2 node(s)" in done.stdout
    storage.download(f"{bucket}/runs/job", tmp_path / "job")
    assert run_contents(tmp_path / "job") == one_worker_run


def test_a_driver_without_the_token_is_refused_with_the_fix(cluster, simulated_dump, tmp_path):
    env = {**cluster.env, "RAY_AUTH_TOKEN": "not-the-token"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trace_tools.cli.main",
            "replay",
            str(simulated_dump),
            "-s",
            "tree",
            "--executor",
            "ray",
            "--address",
            cluster.address,
            "--out",
            str(tmp_path / "refused"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "RAY_AUTH_TOKEN" in done.stderr and "Traceback" not in done.stderr
