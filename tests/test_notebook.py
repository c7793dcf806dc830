"""The analysis notebook executes headlessly, replaying a small simulated dump itself."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "analysis.ipynb"


def test_notebook_has_no_committed_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code")


def test_analysis_notebook_runs_and_shows_its_plots(simulated_dump, monkeypatch, tmp_path):
    """Run as the README says: the notebook replays a dump itself, and writing the run's report must
    not switch the kernel's matplotlib backend away from inline (which would hide every plot)."""
    monkeypatch.delenv("TRACE_TOOLS_RUN", raising=False)
    monkeypatch.setenv("TRACE_TOOLS_DUMP", str(simulated_dump))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 2  # coverage by tool and drift causes
    text = "\n".join(str(o.get("data", {}).get("text/plain", "")) for o in outputs)
    assert "Edit" in text and "cause" in text
    # the fork drill-down shows the samples tree split the session into, each with its turns
    plain = [str(o["data"]["text/plain"]) for o in outputs if "text/plain" in o.get("data", {})]
    forks = next(t for t in plain if t.splitlines()[0].split() == ["turns"])
    assert [line.split()[:2] for line in forks.splitlines() if line.startswith("tree")][0] == ["tree", "0"]
    assert any(line.split()[0] == "1" for line in forks.splitlines()[1:] if line.split())  # a second sample: a fork
    # the run it replayed lived in a temporary directory that is gone once the kernel stopped
    streams = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    run_dir = Path(streams.split("run directory: ", 1)[1].split()[0])
    assert run_dir.name == "run" and not run_dir.parent.exists()
