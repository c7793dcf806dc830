"""The public API: replay a dump into a run directory, explain a session, open a finished run.

    import trace_tools as tt
    result = tt.replay("dump.parquet", out="runs/r1", strategies=["tree", "checkpoint-tree"])
    run = tt.open_run("runs/r1")
    run.coverage_by_tool()          # tool × strategy token coverage
    run.drift_causes()              # strategy × cause: turns and tokens lost
    run.step_metric("coverage_by_tool.Edit")  # a dump with steps: step × strategy curves
    run.session("sim-qwen3-s7-0003")  # one session's turns under every strategy
    run.html()                      # path of the run's report.html (written when missing)

This module sits above both replay and report: `replay` runs the engine (`replay.engine`), then
computes the summary and writes report.md, plots and report.html from the run's tables (`report`).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from trace_tools.errors import UsageError

if TYPE_CHECKING:  # a replay from the command line never imports pandas (`report.finish`)
    import pandas as pd

# The engine, the report writers and the HTML report are imported inside the functions that use
# them: at module top they cost `import trace_tools.api` (and `tt.open_run`) 1.6x the CPU time
# (0.61 s -> 1.08 s, +16 MiB, measured for issue 38).


class UnknownSession(UsageError, LookupError):
    """`Run.session(id)` for an id the run does not hold."""


@dataclass
class RunResult:
    """A finished replay: where it wrote (a path, or the URI of a run in object storage), its
    summary.json, and what it did."""

    run_dir: Path | str
    summary: dict[str, Any]
    sessions_replayed: int
    quarantined: int
    resumed_shards: int = 0
    reconstruction: dict[str, Any] = field(default_factory=dict)
    redone_shards: list[str] = field(default_factory=list)  # finished shards replayed again, and why
    ray: dict[str, Any] = field(default_factory=dict)  # with executor="ray": tasks, nodes, bytes sent, worker CPU
    notes: list[str] = field(default_factory=list)  # one line each, e.g. the harness profile auto could not pick


def replay(
    dump: str | Path | None = None,
    *,
    out: str | Path | None = None,
    strategies: Iterable[str] | None = None,
    prompt_source: str = "auto",
    tokenizer: str | None = None,
    chat_template: str | None = None,
    canonicalization: str = "slime",
    params: dict[str, Any] | None = None,
    write_samples: bool = True,
    workers: int | None = None,
    executor: str = "local",
    address: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    tool_format: str | None = None,
    overwrite: bool = False,
    render_path: str = "fast",
    owns_process: bool = False,
) -> RunResult:
    """Replay a dump (default: the bundled sample_traces/) through strategies (default: all) and
    write the run directory (docs/run_directory.md).

    `workers` defaults to `$TRACE_TOOLS_WORKERS` or the machine's cores, or 1 for a small replay of
    a local dump (`replay.executors.auto_workers`; 1 replays in this process); `executor="ray"`
    runs the same session function on Ray (`address` of a cluster, or a local one). The output
    does not depend on either. `tool_format` overrides the tool-call format detected from the
    chat template (`--tool-format`). A run directory holding a run made with other options is
    refused unless `overwrite`. `dump` and `out` may be object-storage URIs
    (`s3://…`, `gs://…`; `io.storage`). `render_path="reference"` renders and tokenizes with
    transformers end to end; `"verify"` runs the fast path and compares every result with the
    reference (differences in `summary["reconstruction"]["verify"]`; `render.spec.RENDER_PATHS`).
    `owns_process=True` (the command line) lets the replay act on the whole process: run with the
    cyclic garbage collector off (`trace_tools.collector`), keep pyarrow from importing pandas
    (`arrow_pool.arrow_without_pandas`, local executor) and have a helper process started at once
    write the report (`report.finish`); by default (a notebook, a service) it does none of these.
    """
    from trace_tools.replay.engine import run
    from trace_tools.replay.session import ReplayOptions

    if owns_process and executor == "local":  # Ray's driver is Ray's: left as it is
        from trace_tools.arrow_pool import arrow_without_pandas

        arrow_without_pandas()  # nothing in this process uses pandas (`report.finish`)

    options = ReplayOptions(
        list(strategies or []),
        prompt_source,
        tokenizer,
        chat_template,
        canonicalization,
        {k: v for k, v in (params or {}).items() if v is not None},
        write_samples,
        tool_format,
        render_path,
    )
    from trace_tools.io import storage
    from trace_tools.process_pool import can_fork
    from trace_tools.report.finish import ReportHelper
    from trace_tools.report.sample_bars import GatheredBars

    bars = GatheredBars()  # the report's sample bars, gathered as the samples are written
    with ReportHelper(helper=owns_process, fork=can_fork()) as helper, _staged(out) as (local_out, mirror):
        engine, result = run(
            dump,
            options,
            local_out,
            workers=workers,
            executor=executor,
            address=address,
            progress=progress,
            overwrite=overwrite,
            mirror=mirror,
            finish=lambda engine: (engine, _finish(engine, helper, bars)),
            owns_process=owns_process,
            observe_samples=bars.add,
        )
    if executor == "ray":
        stats = engine.ray
        result.ray = {"tasks": stats.tasks, "nodes": len(stats.nodes), "sent_bytes": stats.sent_bytes}
        result.ray["worker_cpu_s"] = stats.worker_cpu_s
        result.ray["niceness"], result.ray["largest_read_rows"] = sorted(stats.niceness), stats.largest_read_rows
    if out is not None and storage.is_uri(out):
        result.run_dir = storage.location(out)
    return result


@contextmanager
def _staged(out: str | Path | None) -> Iterator[tuple[str | Path | None, Any]]:
    """`out` itself, or for a URI a local staging directory that is uploaded as the run goes."""
    from trace_tools.io import storage

    if out is None or not storage.is_uri(out):
        yield out, None
        return
    with storage.StagedRun(str(storage.location(out))) as mirror:
        yield mirror.local, mirror


def _finish(engine: Any, helper: Any, bars: Any) -> RunResult:
    """run.json, then report.html, report.md and plots (written by `helper`, a `ReportHelper`) from
    the merged tables, and summary.json last: it marks the run directory finished. `bars`: the
    sample bars gathered while the samples were written (`GatheredBars`), used if they cover the run."""
    from trace_tools.io.write import write_json_atomic
    from trace_tools.report.finish import ReportJob, RunFacts, reconstruction_summary

    run_dir = engine.run_dir
    reconstruction = reconstruction_summary(engine.render_stats)
    write_json_atomic(_run_info(engine, reconstruction), run_dir / "run.json")
    gathered = bars if engine.samples_observed else None
    job = ReportJob(run_dir, RunFacts.of(engine), engine.options.strategies, reconstruction, gathered)
    summary = helper.report(job)
    write_json_atomic(summary, run_dir / "summary.json")
    return RunResult(
        run_dir,
        summary,
        engine.sessions_replayed,
        summary["quarantined"],
        engine.resumed_shards,
        reconstruction,
        engine.redone_shards,
        notes=[*engine.warnings, *engine.notes],  # the dump's warnings (io.load) too: they name fixes
    )


def _run_info(engine: Any, reconstruction: dict[str, Any]) -> dict[str, Any]:
    import platform

    import pyarrow as pa

    from trace_tools import __version__
    from trace_tools.io import storage

    meta = asdict(engine.meta)
    if meta.get("chat_template"):
        meta["chat_template"] = f"<{len(meta['chat_template'])} chars>"
    return {
        "trace_tools_version": __version__,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "inputs": {
            "dump": str(storage.absolute(engine.dump)),
            "files": [str(f) for f in engine.files],
            "rows": engine.rows,
            "vocab_checked": engine.vocab_checked,
            "dump_meta": meta,
        },
        "options": engine.options.recorded(),
        "renderers": engine.renderers,
        "reconstruction": reconstruction,
        "versions": {"python": platform.python_version(), **_versions()},
        "arrow_memory_pool": pa.default_memory_pool().backend_name,  # trace_tools.arrow_pool
    }


def _versions() -> dict[str, str]:
    """The installed versions of the libraries a run's results depend on, read as the cache keys
    read them (`io.cache.library_version`: off the dist-info folders, not `importlib.metadata`,
    whose import and search the end of every replay paid); one not installed is left out."""
    from trace_tools.io.cache import library_version

    packages = ("pandas", "pyarrow", "tokenizers", "transformers", "jinja2", "tiktoken")
    return {package: version for package in packages if (version := library_version(package)) != "absent"}


@dataclass
class Run:
    """A finished run directory loaded as DataFrames (columns:
    docs/run_directory.md#what-the-files-hold); `path` is a local path or an object-storage URI."""

    path: Path | str
    summary: dict[str, Any]
    turns: pd.DataFrame
    sessions: pd.DataFrame
    samples: pd.DataFrame
    quarantine: pd.DataFrame

    @property
    def dump(self) -> Path | str:
        """The dump this run replayed (from run.json), e.g. for `trace_tools.explain(run.dump, id)`."""
        from trace_tools.io import rundir, storage

        return storage.location(rundir.load_run_info(self.path)["inputs"]["dump"])

    @property
    def strategies(self) -> list[str]:
        return list(self.summary["strategies"])

    def strategy_table(self) -> pd.DataFrame:
        """One row per strategy: samples, forks, coverage and token totals."""
        import pandas as pd

        rows = [_strategy_row(name, s) for name, s in self.summary["strategies"].items()]
        return pd.DataFrame(rows).set_index("strategy")

    @property
    def has_steps(self) -> bool:
        """Whether the run's dump carried steps (summary.json `by_step`, docs/metrics.md#per-step)."""
        return bool(self.summary.get("by_step"))

    def by_step(self) -> pd.DataFrame:
        """`strategy_table` per step: one row per (step, strategy), in step order."""
        import pandas as pd

        rows = [
            {"step": item["step"], **_strategy_row(name, s)}
            for item in self._steps()
            for name, s in item["strategies"].items()
        ]
        return pd.DataFrame(rows).set_index(["step", "strategy"])

    def step_metric(self, metric: str) -> pd.DataFrame:
        """One curve per strategy: a summary metric's dotted path (`coverage`, `forks.mean`,
        `coverage_by_tool.Edit`, `counters.<name>`) per step (rows) and strategy (columns); NaN
        where a step does not measure it (a tool no turn of that step calls)."""
        import pandas as pd

        from trace_tools.report.gate import lookup

        rows = {item["step"]: {name: lookup(item, metric, name) for name in self.strategies} for item in self._steps()}
        frame = pd.DataFrame.from_dict(rows, orient="index", columns=self.strategies).astype(float)
        frame.index.name = "step"
        return frame

    def drift_causes_by_step(self) -> pd.DataFrame:
        """`drift_causes` per step: (step, strategy, drift cause) → drifted turns and tokens lost."""
        self._steps()
        turns = self.turns.dropna(subset=["drift_cause", "step"])
        lost = (turns["generated_tokens"] - turns["trained_tokens"]).rename("tokens_lost")
        frame = turns.assign(tokens_lost=lost, step=turns["step"].astype(int))
        return frame.groupby(["step", "strategy", "drift_cause"]).agg(
            turns=("turn_index", "size"), tokens_lost=("tokens_lost", "sum")
        )

    def _steps(self) -> list[dict[str, Any]]:
        if not self.has_steps:
            raise UsageError(
                f"run {self.path} has no steps: its dump has no step column (docs/trace_schema.md#columns), "
                "so there is nothing per step; `strategy_table()` gives the run's totals"
            )
        return self.summary["by_step"]

    def coverage_by_tool(self) -> pd.DataFrame:
        """Token coverage (trained / generated) per tool (rows) and strategy (columns)."""
        grouped = self.turns.groupby(["tool", "strategy"])[["trained_tokens", "generated_tokens"]].sum()
        coverage = grouped["trained_tokens"] / grouped["generated_tokens"].where(grouped["generated_tokens"] > 0)
        return coverage.unstack()[self.strategies]

    def dropped_turns_by_tool(self) -> pd.DataFrame:
        """Share of turns with generated tokens but none trained, per tool and strategy."""
        turns = self.turns[self.turns["generated_tokens"] > 0]
        dropped = (turns["trained_tokens"] == 0).groupby([turns["tool"], turns["strategy"]]).mean()
        return dropped.unstack()[self.strategies]

    def drift_causes(self) -> pd.DataFrame:
        """Per strategy and drift cause: drifted turns and the generated tokens they lost."""
        turns = self.turns.dropna(subset=["drift_cause"])
        lost = (turns["generated_tokens"] - turns["trained_tokens"]).rename("tokens_lost")
        frame = turns.assign(tokens_lost=lost)
        return frame.groupby(["strategy", "drift_cause"]).agg(
            turns=("turn_index", "size"), tokens_lost=("tokens_lost", "sum")
        )

    def html(self, refresh: bool = False) -> Path:
        """Path of the run's self-contained report.html, written first when missing (or `refresh`).

        In a notebook: `import webbrowser; webbrowser.open(run.html().as_uri())`.
        """
        from trace_tools.report.html import REPORT_NAME, write_html_report

        if not isinstance(self.path, Path):
            raise UsageError(f"{self.path} is in object storage; `trace-tools report {self.path} --html` writes it")
        path = self.path / REPORT_NAME
        if refresh or not path.exists():
            write_html_report(self.path)
        return path

    def session(self, session_id: str) -> pd.DataFrame:
        """One session's turns: tool, generated and trained tokens, and events, per strategy."""
        frame = self.turns[self.turns["session_id"] == session_id] if len(self.turns) else self.turns
        if not len(frame):
            from trace_tools.pipeline import no_session_message

            ids = list(self.sessions["session_id"].unique()) if len(self.sessions) else []
            raise UnknownSession(no_session_message(session_id, self.path, ids))
        return frame.pivot_table(
            index=["turn_index", "tool"], columns="strategy", values="trained_tokens", aggfunc="sum"
        )[self.strategies]


def _strategy_row(name: str, s: dict[str, Any]) -> dict[str, Any]:
    return {
        "strategy": name,
        "sessions": s["sessions"],
        "samples": s["samples"],
        "forks_mean": s["forks"]["mean"],
        "coverage": s["coverage"],
        "trained_tokens": s["trained_tokens"],
        "forwarded_tokens": s["forwarded_tokens"],
        "context_tokens": s["context_tokens"],
    }


def open_run(path: str | Path) -> Run:
    from trace_tools.io import storage
    from trace_tools.io.rundir import load_summary
    from trace_tools.report.rerender import read_run

    location = storage.location(path)
    tables = read_run(location)
    return Run(
        location,
        load_summary(location),
        tables["turns"],
        tables["sessions"],
        tables["samples"],
        tables["quarantine"],
    )
