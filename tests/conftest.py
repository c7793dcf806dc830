"""Shared fixtures: real runs over real dumps (the bundled sample and small simulated ones)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from io_support import free_port

# Tests replay in-process (`--workers 1` is the plain path, docs/pipeline.md#every-core-and-many-machines); the executor tests ask
# for process pools and Ray explicitly.
os.environ.setdefault("TRACE_TOOLS_WORKERS", "1")


# The integration extra's tests: each marker names the packages it needs. Without them a marked test
# is skipped, naming the extra; .ci/run installs the extra and sets TRACE_TOOLS_REQUIRE_INTEGRATION,
# which turns a missing package into a failure. `-m "not cluster and not object_storage"` leaves them out.
INTEGRATION_PACKAGES = {
    "cluster": ("ray",),
    "object_storage": ("moto", "boto3", "gcp_storage_emulator"),
    "trackers": ("tensorboard", "wandb"),
}
# Tests that use these fixtures carry the marker without saying so.
MARKER_OF_FIXTURE = {
    "s3_server": "object_storage",
    "gcs_server": "object_storage",
    "local_ray": "cluster",
    "cluster": "cluster",
}


def pytest_collection_modifyitems(items):
    for item in items:
        for fixture in set(MARKER_OF_FIXTURE) & set(getattr(item, "fixturenames", ())):
            item.add_marker(MARKER_OF_FIXTURE[fixture])


def pytest_runtest_setup(item):
    for marker in INTEGRATION_PACKAGES:
        if item.get_closest_marker(marker) is not None:
            require_integration(marker)


def require_integration(marker: str) -> None:
    """Skip (or, under TRACE_TOOLS_REQUIRE_INTEGRATION, fail) unless the marker's packages import."""
    import importlib.util

    missing = [name for name in INTEGRATION_PACKAGES[marker] if importlib.util.find_spec(name) is None]
    if not missing:
        return
    reason = (
        f'{marker} test: {", ".join(missing)} missing; install the integration extra: pip install -e ".[integration]"'
    )
    if os.environ.get("TRACE_TOOLS_REQUIRE_INTEGRATION"):
        pytest.fail(f"TRACE_TOOLS_REQUIRE_INTEGRATION is set but this {reason}")
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def _ctrl_c_handler_restored():
    """A CLI command run in-process that handles Ctrl-C ignores further ones while it exits (as a
    real process would, right before exiting); put Python's handler back, or every process the
    suite starts afterwards would inherit an ignored SIGINT."""
    import signal

    yield
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def sample_run(tmp_path_factory):
    """One replay of the bundled sample_traces/ through every strategy (shared by report/gate/compare tests)."""
    from trace_tools.api import replay

    return replay(None, out=tmp_path_factory.mktemp("runs") / "sample")


@pytest.fixture(scope="session")
def chromium_binary():
    """Headless Chromium for the report.html tests; skipped (with the reason) only where it is not installed.

    .ci/run installs Debian's package and sets TRACE_TOOLS_REQUIRE_CHROMIUM, turning a missing browser into a failure.
    """
    import os

    from trace_tools.report.html.chromium import find_chromium

    binary = find_chromium()
    if binary is None:
        if os.environ.get("TRACE_TOOLS_REQUIRE_CHROMIUM"):
            pytest.fail("TRACE_TOOLS_REQUIRE_CHROMIUM is set but no Chromium binary was found")
        pytest.skip("Chromium is not installed (`apt-get install chromium`; .ci/run installs it)")
    return binary


@pytest.fixture(scope="session")
def simulated_dump(tmp_path_factory):
    """A small simulated qwen3 dump mixing every behaviour."""
    from trace_tools.simulate import simulate

    path = tmp_path_factory.mktemp("dumps") / "sim.parquet"
    simulate(sessions=12, seed=3, template="qwen3", out=str(path))
    return path


@contextmanager
def _local_server(command: list[str], port: int, env: dict[str, str], log: Path, what: str) -> Iterator[None]:
    """A server process listening on `port` of loopback, `env` set in this process (and so in
    every process the tests start) while it runs; ready once it accepts connections."""
    import socket
    import subprocess
    import time

    with open(log, "wb") as out:
        server = subprocess.Popen(command, stdout=out, stderr=out)
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    pytest.fail(f"the local {what} server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)
        yield
    finally:
        server.terminate()
        server.wait(timeout=30)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 server on loopback (moto's server mode, from the integration extra), with the usual
    environment pointing at it: `AWS_ENDPOINT_URL` and dummy credentials. Yields a function that
    makes a fresh bucket and returns its `s3://` URI."""
    import sys
    import uuid

    require_integration("object_storage")
    port = free_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with _local_server(command, port, env, tmp_path_factory.mktemp("s3") / "moto.log", "S3"):
        import boto3

        client = boto3.client("s3")

        def bucket() -> str:
            name = f"trace-tools-{uuid.uuid4().hex[:12]}"
            client.create_bucket(Bucket=name)
            return f"s3://{name}"

        yield bucket


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """A Google Cloud Storage emulator on loopback (gcp-storage-emulator, from the integration extra),
    with `CLOUD_STORAGE_EMULATOR_ENDPOINT` pointing at it (the variable Google's C++ client, and
    so pyarrow, reads). Yields a function that makes a fresh bucket and returns its URI:
    `gs://anonymous@BUCKET`, pyarrow's spelling of a bucket read without credentials."""
    import sys
    import uuid
    from pathlib import Path

    import pyarrow.fs as pafs

    require_integration("object_storage")
    emulator = Path(sys.executable).with_name("gcp-storage-emulator")
    if not emulator.exists():
        pytest.fail(f"gcp-storage-emulator is importable but {emulator} is missing; reinstall the integration extra")
    port = free_port()
    env = {"CLOUD_STORAGE_EMULATOR_ENDPOINT": f"http://127.0.0.1:{port}"}
    command = [str(emulator), "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"]
    with _local_server(command, port, env, tmp_path_factory.mktemp("gcs") / "emulator.log", "Cloud Storage"):
        client = pafs.GcsFileSystem(anonymous=True, project_id="trace-tools-tests")

        def bucket() -> str:
            name = f"trace-tools-{uuid.uuid4().hex[:12]}"
            client.create_dir(name)
            return f"gs://anonymous@{name}"

        yield bucket
