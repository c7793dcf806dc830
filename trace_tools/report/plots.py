"""Matplotlib plots of a run, drawn on standalone figures.

The figures never touch pyplot or its global backend, so writing a report inside a notebook
leaves the notebook's inline plots working. Each strategy keeps one colour in every plot.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, Callable, Iterable

import pandas as pd

from trace_tools.report.palette import STRATEGY_COLOURS
from trace_tools.strategies.declarations import NAMES, in_column_order

MAX_SAMPLE_BARS = 40  # beyond this many samples per session, the axis bins counts


def write_plots(plot_dir: Path, tables: dict[str, pd.DataFrame]) -> list[str]:
    """The run's figures as PNGs in `plot_dir`, drawn here; the paths written."""
    return PendingPlots(plot_dir, tables).result()


class PendingPlots:
    """The run's figures being drawn: those named in `fork` at once, in processes forked from this
    one; the others, and any whose drawer failed, here when `result` is asked for. The report
    helper (`report.finish`) forks every figure and builds the report while they are drawn."""

    def __init__(self, plot_dir: Path, tables: dict[str, pd.DataFrame], fork: Iterable[str] = ()) -> None:
        plot_dir.mkdir(parents=True, exist_ok=True)
        self._dir, self._tables = plot_dir, tables
        self._children: dict[str, int | None] = {}
        forked = set(fork)
        if forked:
            from trace_tools.process_pool import interrupts_held
        try:
            for name, draw in FIGURES:
                if name in forked:
                    with interrupts_held():  # a Ctrl-C lands once the drawer's pid is kept, not before
                        self._children[name] = _draw_forked(plot_dir / f"{name}.png", draw, tables)
        except BaseException:  # interrupted between two forks: end the drawers forked so far
            self.close()
            raise

    def result(self) -> list[str]:
        """The paths written, in the figures' order, once every figure is drawn."""
        written = []
        try:
            for name, draw in FIGURES:
                path = self._dir / f"{name}.png"
                drawn = _drawn_by(self._children.get(name))
                self._children.pop(name, None)  # reaped: only after the wait, which a Ctrl-C may cut short
                if drawn is None:
                    drawn = _draw(path, draw, self._tables)
                if drawn:
                    written.append(str(path))
        finally:
            self.close()
        return written

    def close(self) -> None:
        """End the drawers not reaped yet (a Ctrl-C, an error before `result`), so none is left a
        zombie for init to collect."""
        for pid in self._children.values():
            _end(pid)
        self._children = {}


def _end(pid: int | None) -> None:
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _draw(path: Path, draw: Callable[[dict[str, pd.DataFrame]], Any], tables: dict[str, pd.DataFrame]) -> bool:
    """Whether `draw` had a figure to save (as `path`)."""
    figure = draw(tables)
    if figure is not None:
        _save(figure, path)
    return figure is not None


_NO_FIGURE = 3  # a forked drawer's exit code when its figure has nothing to show


def _draw_forked(
    path: Path, draw: Callable[[dict[str, pd.DataFrame]], Any], tables: dict[str, pd.DataFrame]
) -> int | None:
    """A process forked to draw one figure (its pid), or None where it could not be forked."""
    try:
        pid = os.fork()
    except OSError:
        return None
    if pid == 0:
        code = 1
        try:
            code = 0 if _draw(path, draw, tables) else _NO_FIGURE
        finally:
            os._exit(code)
    return pid


def _drawn_by(pid: int | None) -> bool | None:
    """Whether a forked drawer saved its figure; None when it failed (or never ran)."""
    if pid is None:
        return None
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return True if code == 0 else False if code == _NO_FIGURE else None


DRIFT_COLUMNS = ["cause", "token_drift", "divergence", "served_len"]
_TOOL_COLUMNS = ["tool", "strategy", "trained_tokens", "generated_tokens"]


def plot_tables(run_dir: str | Path) -> dict[str, pd.DataFrame]:
    """What the figures read, from a run directory in one bounded pass: token sums per tool and
    strategy (`turns`), sessions counted per samples and strategy (`sessions`, a `count` column),
    and the drifted turns' findings without their id lists (`drift`)."""
    from trace_tools.report.aggregate import table_batches

    run = Path(run_dir)
    tools = [
        b.groupby(_TOOL_COLUMNS[:2])[_TOOL_COLUMNS[2:]].sum()
        for b in table_batches(run / "turns.parquet", _TOOL_COLUMNS)
    ]
    counts = [
        b.groupby(["samples", "strategy"]).size()
        for b in table_batches(run / "sessions.parquet", ["samples", "strategy"])
    ]
    drift = [b[b["cause"].notna()] for b in table_batches(run / "drift.parquet", DRIFT_COLUMNS) if "cause" in b]
    return {
        "turns": _summed(tools).reset_index() if tools else pd.DataFrame(),
        "sessions": _summed(counts).rename("count").reset_index() if counts else pd.DataFrame(),
        "drift": pd.concat(drift, ignore_index=True) if drift else pd.DataFrame(),
    }


def _summed(parts: list[Any]) -> Any:
    """Per-batch sums (one row per group each) added up."""
    return pd.concat(parts).groupby(level=[0, 1]).sum()


def coverage_figure(tables: dict[str, pd.DataFrame]) -> Any:
    from matplotlib.ticker import PercentFormatter

    turns = tables["turns"]
    if not len(turns):
        return None
    grouped = turns.groupby(["tool", "strategy"])[["trained_tokens", "generated_tokens"]].sum()
    generated = grouped["generated_tokens"]
    coverage = (grouped["trained_tokens"] / generated.where(generated > 0)).unstack()
    coverage = coverage[in_column_order(coverage.columns)]
    figure, ax = _figure(min(14.0, max(7.0, 0.9 * len(coverage) + 2.5)), 4.5)
    _grouped_bars(ax, coverage)
    ax.set_ylabel("token coverage (trained / generated)", fontsize=10)
    ax.set_ylim(0, 1.05)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("")
    ax.tick_params(axis="x", labelsize=10, labelrotation=0 if len(coverage) <= 10 else 30)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.set_title("Loss-mask coverage by tool")
    _legend_outside(ax)
    return figure


def samples_figure(tables: dict[str, pd.DataFrame]) -> Any:
    sessions = tables["sessions"]
    if not len(sessions):
        return None
    # a row per session, or (plot_tables) a row per samples value and strategy with its `count`
    weights = sessions["count"] if "count" in sessions else pd.Series(1, index=sessions.index)
    counts = weights.groupby([sessions["samples"], sessions["strategy"]]).sum().unstack(fill_value=0)
    counts = counts[in_column_order(counts.columns)]
    low, high = int(counts.index.min()), int(counts.index.max())
    if high - low < MAX_SAMPLE_BARS:  # every value on the axis, none skipped
        counts = counts.reindex(range(low, high + 1), fill_value=0)
    else:
        edges = pd.interval_range(start=low - 0.5, end=high + 0.5, periods=MAX_SAMPLE_BARS // 2)
        counts = counts.groupby(pd.cut(counts.index, edges), observed=False).sum()
        counts.index = [f"{int(i.left + 0.5)}–{int(i.right - 0.5)}" for i in counts.index]
    figure, ax = _figure(max(7.0, 0.45 * len(counts) + 2.5), 4.5)
    _grouped_bars(ax, counts)
    ax.set_xlabel("samples per session")
    ax.set_ylabel("sessions")
    ax.set_title("Samples per session")
    _legend_outside(ax)
    return figure


def drift_figure(tables: dict[str, pd.DataFrame]) -> Any:
    """Where in the served ids drift starts, from the same findings as the drift-cause table
    (drift.parquet): one histogram stacked by cause, each cause's count in the legend, and the
    drifted turns whose ids did not drift (the messages differ only) named in the title."""
    drift = tables.get("drift")
    if drift is None or not len(drift) or "cause" not in drift:
        return None
    drifted = drift[drift["cause"].notna()]
    placed = drifted[drifted["token_drift"].astype(bool) & (drifted["served_len"] > 0)]
    if not len(placed):
        return None
    causes = sorted(placed["cause"].unique(), key=lambda c: (-int((placed["cause"] == c).sum()), c))
    positions = [(placed["divergence"] / placed["served_len"])[placed["cause"] == c] for c in causes]
    figure, ax = _figure(9.0, 4.0)
    labels = [f"{c} ({len(p)})" for c, p in zip(causes, positions)]
    _stacked_histogram(ax, positions, _cause_colours(len(causes)), labels)
    ax.set_xlabel("first divergence / ids served for the echoed turn (0 = conversation start, 1 = its end)")
    ax.set_ylabel("drifted turns")
    quiet = len(drifted) - len(placed)
    note = f"; {quiet} more differ in the messages only" if quiet else ""
    ax.set_title(f"Where drift starts: {len(placed)} of {len(drifted)} drifted turns{note}", fontsize=11)
    _legend_outside(ax)
    return figure


def _grouped_bars(ax: Any, table: pd.DataFrame, width: float = 0.85) -> None:
    """A bar per cell of `table`: its rows side by side along x (labelled by the index), its
    columns (strategies) as the bars of each group, in their colours, named in the legend.

    Each column is one collection of rectangles, not a patch per bar (as `DataFrame.plot.bar`
    draws it): matplotlib updates the axes' limits and draws artist by artist, and twelve
    strategies over forty sample counts made the run's slowest figure. A missing value draws no bar."""
    import numpy as np

    groups, bars = len(table.index), len(table.columns)
    bar = width / max(bars, 1)
    centres = np.arange(groups)
    for n, (name, colour) in enumerate(zip(table.columns, _colours(table.columns))):
        heights = table[name].to_numpy(dtype=float)
        left = centres - width / 2 + n * bar
        drawn = ~np.isnan(heights)
        boxes = [(x, x + bar, 0.0, h) for x, h in zip(left[drawn], heights[drawn])]
        _add_boxes(ax, boxes, colour, str(name))
    ax.set_xticks(centres, [str(label) for label in table.index], rotation=90)
    ax.set_xlim(-0.5, groups - 0.5)
    top = np.nanmax(table.to_numpy(dtype=float), initial=0.0)  # 0 for an empty or all-missing table
    ax.set_ylim(0, (top or 1.0) * 1.05)


def _stacked_histogram(ax: Any, values: list[Any], colours: list[Any], labels: list[str], bins: int = 20) -> None:
    """A histogram of each series over [0, 1], stacked in order, as `ax.hist(stacked=True)` draws
    it, but each series one collection of rectangles (as `_grouped_bars`): the drift figure was
    the slowest of a `tree` run's three, its 80 patches laid out and drawn one by one."""
    import numpy as np

    edges = np.linspace(0.0, 1.0, bins + 1)
    bottom = np.zeros(bins)
    for series, colour, label in zip(values, colours, labels):
        counts, _ = np.histogram(np.asarray(series, dtype=float), bins=edges)
        top = bottom + counts
        boxes = [box for box in zip(edges[:-1], edges[1:], bottom, top) if box[3] > box[2]]
        _add_boxes(ax, boxes, colour, label)
        bottom = top
    ax.set_xlim(-0.05, 1.05)  # hist's margins
    ax.set_ylim(0, (bottom.max() or 1.0) * 1.05)


def _add_boxes(ax: Any, boxes: Any, colour: Any, label: str) -> None:
    """Rectangles (left, right, bottom, top) of one colour as one collection, one legend entry:
    matplotlib lays out and draws a collection at once, and a patch per bar one by one."""
    from matplotlib.collections import PolyCollection

    corners = [[(left, low), (left, high), (right, high), (right, low)] for left, right, low, high in boxes]
    ax.add_collection(PolyCollection(corners, facecolors=[colour], edgecolors="none", label=label))


FIGURES = (
    ("coverage_by_tool", coverage_figure),
    ("samples_per_session", samples_figure),
    ("drift_start", drift_figure),
)


def _figure(width: float, height: float) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height))
    return figure, figure.add_subplot()


def _legend_outside(ax: Any) -> None:
    """The legend right of the axes, where it can cover no bar."""
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)


def _cause_colours(n: int) -> list[Any]:
    from matplotlib import colormaps

    palette = colormaps["Dark2"]
    return [palette(k % palette.N) for k in range(n)]


def _colours(names: Any) -> list[Any]:
    palette = STRATEGY_COLOURS
    order = {name: n for n, name in enumerate(NAMES)}
    return [palette[order.get(name, len(order) + n) % len(palette)] for n, name in enumerate(names)]


def _save(figure: Any, path: Path) -> None:
    from matplotlib import rcParams
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    tmp = path.with_suffix(".tmp.png")
    # The saved area is cropped to every artist (the legend right of the axes, rotated labels):
    # that needs no tight_layout() before it, a third layout pass over every text (a quarter of
    # the time a figure took to save, and the end of a run waits for the plots). The area is
    # measured here, as `bbox_inches="tight"` measures it, but without the dry run of the whole
    # drawing that savefig makes first for "tight": 15–25 % of a figure's save, the same pixels.
    renderer = FigureCanvasAgg(figure).get_renderer()
    area = figure.get_tightbbox(renderer).padded(rcParams["savefig.pad_inches"])
    figure.savefig(tmp, dpi=100, bbox_inches=area)
    tmp.replace(path)
