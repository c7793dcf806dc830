"""Run plots: drawn without pyplot's global backend, legends beside the bars, every strategy shown."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from trace_tools.report.plots import coverage_figure, drift_figure, samples_figure
from trace_tools.report.rerender import read_run


def test_writing_plots_keeps_the_callers_matplotlib_backend(sample_run, tmp_path):
    """A notebook's inline backend must survive a replay that writes plots (it used to become Agg)."""
    code = (
        "import pathlib, matplotlib; matplotlib.use('svg'); "
        "from trace_tools.report.plots import write_plots, plot_tables; "
        f"written = write_plots(pathlib.Path({str(tmp_path)!r}), plot_tables({str(sample_run.run_dir)!r})); "
        "print(matplotlib.get_backend(), len(written))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["svg", "3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "coverage_by_tool.png",
        "drift_start.png",
        "samples_per_session.png",
    ]


def _legend_overlaps_axes(figure) -> bool:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure).draw()
    ax = figure.axes[0]
    return ax.get_legend().get_window_extent().overlaps(ax.get_window_extent())


def test_legends_sit_beside_the_bars(sample_run):
    tables = read_run(sample_run.run_dir)
    for figure in (coverage_figure(tables), samples_figure(tables)):
        assert not _legend_overlaps_axes(figure)
        labels = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
        assert labels == list(sample_run.summary["strategies"])


def test_samples_axis_shows_every_count(sample_run):
    tables = read_run(sample_run.run_dir)
    figure = samples_figure(tables)
    ticks = [t.get_text() for t in figure.axes[0].get_xticklabels()]
    most = int(tables["sessions"]["samples"].max())
    assert ticks == [str(n) for n in range(int(tables["sessions"]["samples"].min()), most + 1)]


def test_each_bar_stands_for_its_cell():
    """The coverage bars are the table's cells: a bar per tool and strategy at its coverage, and
    none where the tool generated no token (no coverage to show)."""
    import pandas as pd

    turns = pd.DataFrame(
        {
            "tool": ["Edit", "Edit", "Bash", "Bash"],
            "strategy": ["tree", "linear", "tree", "linear"],
            "trained_tokens": [3, 4, 0, 5],
            "generated_tokens": [4, 4, 0, 10],
        }
    )
    ax = coverage_figure({"turns": turns}).axes[0]
    bars = {
        collection.get_label(): sorted(round(path.vertices[:, 1].max(), 3) for path in collection.get_paths())
        for collection in ax.collections
    }
    assert bars == {"tree": [0.75], "linear": [0.5, 1.0]}
    assert [t.get_text() for t in ax.get_xticklabels()] == ["Bash", "Edit"]


def test_drift_plot_agrees_with_the_drift_cause_table(sample_run):
    """Drawn from the drift findings the cause table counts: each cause's count in the legend is its
    drifted turns there, and the title names the turns whose ids did not drift."""
    from trace_tools.report.plots import plot_tables

    figure = drift_figure(plot_tables(sample_run.run_dir))
    ax = figure.axes[0]
    assert not _legend_overlaps_axes(figure)
    legend = dict(t.get_text().rsplit(" ", 1) for t in ax.get_legend().get_texts())
    table = {cause: v["turns"] for cause, v in sample_run.summary["drift_causes"]["tree"].items()}
    placed = {cause: int(n.strip("()")) for cause, n in legend.items()}
    quiet = {cause: n for cause, n in table.items() if cause not in placed}
    assert placed == {cause: table[cause] for cause in placed} and set(quiet) == {"tool_call_id"}
    total = sum(table.values())
    assert ax.get_title() == (
        f"Where drift starts: {total - sum(quiet.values())} of {total} drifted turns; "
        f"{sum(quiet.values())} more differ in the messages only"
    )
    heights = [np.ptp(path.vertices[:, 1]) for collection in ax.collections for path in collection.get_paths()]
    assert sum(heights) == sum(placed.values())


def test_the_stacked_histogram_has_the_bars_of_matplotlibs_own():
    """`_stacked_histogram` draws each series as one collection; its rectangles are the bars
    `ax.hist(stacked=True)` draws for the same series (empty bars left out), and so are the limits."""
    from matplotlib.figure import Figure

    from trace_tools.report.plots import _stacked_histogram

    rng = np.random.default_rng(7)
    series = [rng.random(40), rng.random(9) ** 3, np.array([0.0, 1.0, 0.5])]
    ours, theirs = Figure().add_subplot(), Figure().add_subplot()
    _stacked_histogram(ours, series, ["red", "green", "blue"], ["a", "b", "c"])
    theirs.hist(series, bins=20, range=(0, 1), stacked=True)
    drawn = sorted(
        tuple(np.round([p.vertices[:, 0].min(), p.vertices[:, 1].min(), np.ptp(p.vertices[:, 1])], 9))
        for c in ours.collections
        for p in c.get_paths()
    )
    expected = sorted(
        tuple(np.round([bar.get_x(), bar.get_y(), bar.get_height()], 9)) for bar in theirs.patches if bar.get_height()
    )
    assert drawn == expected
    assert ours.get_xlim() == pytest.approx(theirs.get_xlim()) and ours.get_ylim() == pytest.approx(theirs.get_ylim())


def test_a_saved_figure_has_the_pixels_of_a_tight_savefig(sample_run, tmp_path):
    """`_save` measures the cropped area itself, skipping the dry run of the drawing that
    `savefig(bbox_inches="tight")` makes first; the PNG holds the same pixels, of the same size."""
    import matplotlib.image

    from trace_tools.report import plots

    tables = plots.plot_tables(sample_run.run_dir)
    for name, draw in plots.FIGURES:
        plots._save(draw(tables), tmp_path / f"{name}.png")
        draw(tables).savefig(tmp_path / f"{name}-tight.png", dpi=100, bbox_inches="tight")
        ours, tight = (matplotlib.image.imread(tmp_path / f) for f in (f"{name}.png", f"{name}-tight.png"))
        assert ours.shape == tight.shape and np.array_equal(ours, tight), name


def _drawn(paths: list[str]) -> dict[str, bytes]:
    return {path.rsplit("/", 1)[1]: open(path, "rb").read() for path in paths}


def _forked(plot_dir, tables) -> list[str]:
    """The second and third figures drawn in forked processes, the first here (`PendingPlots`)."""
    from trace_tools.report import plots

    return plots.PendingPlots(plot_dir, tables, fork=["samples_per_session", "drift_start"]).result()


def test_forked_drawers_write_what_one_process_writes(sample_run, tmp_path, monkeypatch):
    """Figures drawn in processes forked at once (the report helper forks every figure) are the
    bytes one process writes; a figure with nothing to show is written by none."""
    from trace_tools.report import plots

    tables = plots.plot_tables(sample_run.run_dir)
    forks = []
    fork = os.fork
    monkeypatch.setattr(os, "fork", lambda: (forks.append(1), fork())[1])
    assert _drawn(_forked(tmp_path / "forked", tables)) == _drawn(plots.write_plots(tmp_path / "here", tables))
    assert len(forks) == 2
    quiet = {**tables, "drift": tables["drift"].iloc[0:0]}
    assert [p.rsplit("/", 1)[1] for p in _forked(tmp_path / "quiet", quiet)] == [
        "coverage_by_tool.png",
        "samples_per_session.png",
    ]


def test_a_figure_whose_forked_drawer_fails_is_drawn_by_the_forking_process(sample_run, tmp_path, monkeypatch):
    from trace_tools.report import plots

    tables = plots.plot_tables(sample_run.run_dir)
    here, save = os.getpid(), plots._save

    def fails_in_a_child(figure, path):
        if os.getpid() != here:
            raise OSError("disk full")
        save(figure, path)

    monkeypatch.setattr(plots, "_save", fails_in_a_child)
    written = _forked(tmp_path / "forked", tables)
    monkeypatch.setattr(plots, "_save", save)
    assert _drawn(written) == _drawn(plots.write_plots(tmp_path / "here", tables))


def test_interrupted_drawing_ends_and_reaps_its_drawers(sample_run, tmp_path, monkeypatch):
    """A Ctrl-C in the helper while its forked drawers draw: they are ended and reaped before it
    goes, none left a zombie for init to collect."""
    from trace_tools.report import plots

    tables = plots.plot_tables(sample_run.run_dir)
    here, fork, drawers = os.getpid(), os.fork, []

    def forking():
        pid = fork()
        if pid:
            drawers.append(pid)
        return pid

    def interrupted(figure, path):
        if os.getpid() != here:
            time.sleep(60)  # a drawer still drawing
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fork", forking)
    monkeypatch.setattr(plots, "_save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _forked(tmp_path, tables)
    assert len(drawers) == 2
    assert [pid for pid in drawers if Path(f"/proc/{pid}").exists()] == []


def test_a_ctrl_c_between_two_forks_ends_the_drawers_forked_so_far(sample_run, tmp_path, monkeypatch):
    """The helper forks its drawers one after another: interrupted after the first, before the
    second, it still ends and reaps the first (it had been left to finish drawing on its own)."""
    from trace_tools.report import plots

    tables = plots.plot_tables(sample_run.run_dir)
    here, draw_forked, drawers = os.getpid(), plots._draw_forked, []

    def slow_drawer(figure, path):
        if os.getpid() != here:
            time.sleep(60)

    def interrupted_after_the_first(path, draw, tables):
        if drawers:
            raise KeyboardInterrupt
        drawers.append(draw_forked(path, draw, tables))
        return drawers[-1]

    monkeypatch.setattr(plots, "_save", slow_drawer)
    monkeypatch.setattr(plots, "_draw_forked", interrupted_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        _forked(tmp_path, tables)
    assert len(drawers) == 1 and not Path(f"/proc/{drawers[0]}").exists()


def test_a_ctrl_c_during_a_fork_lands_once_the_drawers_pid_is_kept():
    """SIGINT is held back while a drawer is forked and its pid recorded, then delivered: an
    interrupt can never fall between the two and leave a drawer nobody ends."""
    import signal

    from trace_tools.process_pool import interrupts_held

    landed = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts_held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # a signal not held would have interrupted this sleep
            landed.append("the pid kept")
    assert landed == ["the pid kept"]
