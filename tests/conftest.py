"""Shared fixtures: real runs over real dumps (the bundled sample and small simulated ones)."""
from __future__ import annotations

import os

import pytest

# Tests replay in-process (DESIGN §10: `--workers 1` is the plain path); the executor tests ask
# for process pools and Ray explicitly.
os.environ.setdefault("TRACE_TOOLS_WORKERS", "1")


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
