"""The analysis notebook executes headlessly on a run of the bundled sample_traces/."""
from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "analysis.ipynb"


def test_notebook_has_no_committed_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code")


def test_analysis_notebook_runs(sample_run, monkeypatch, tmp_path):
    monkeypatch.setenv("TRACE_TOOLS_RUN", str(sample_run.run_dir))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 2  # coverage by tool and drift causes
    text = "\n".join(str(o.get("data", {}).get("text/plain", "")) for o in outputs)
    assert "Edit" in text and "cause" in text
