"""Rebuild report.md and plots of a finished run from its files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from trace_tools.io import storage
from trace_tools.io.rundir import load_summary, read_table, require_run
from trace_tools.io.sample_parts import read_samples
from trace_tools.report.plots import plot_tables
from trace_tools.report.render import write_report


def read_run(run: str | Path) -> dict[str, pd.DataFrame]:
    """The run's tables as DataFrames (samples only when present)."""
    location = require_run(run)
    samples = read_samples(location)
    tables = {name: read_table(location, name) for name in ("turns", "sessions", "quarantine")}
    return tables | {"samples": samples.to_pandas() if samples is not None else pd.DataFrame()}


def rerender(run: str | Path, html: bool = False) -> dict[str, Any]:
    """Rewrite report.md and the plots (and report.html when `html`) from the run's files; a run in
    object storage is copied here (its shards left out) and what was rewritten is uploaded."""

    with storage.local_run(storage.location(run), write_back=True) as path:
        summary = load_summary(path)
        write_report(path, summary, plot_tables(path))
        if html:
            from trace_tools.report.html import write_html_report

            write_html_report(path)
    return summary
