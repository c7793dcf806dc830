"""Reconstruct every turn's prompt stream and measure fidelity against the recorded prompt ids.

For each turn: canonicalize the harness's messages (the gateway's translate step), render them
with the tools, the generation prompt and the turn's own `chat_template_kwargs`, and compare
with `prompt_ids` when the gateway recorded them. A dump whose prompts were rendered with the
same template and tokenizer reconstructs at 100 %; anything less locates the first diverging
token and shows the text around it.

`reconstruct.rows` turns one session into rows of the turns table; `reconstruct.workers` runs the
sessions of a dump on worker processes (docs/pipeline.md#reconstruct-on-every-core).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from trace_tools.collector import collector_off, session_done
from trace_tools.data import Session
from trace_tools.errors import TraceToolsError, UsageError
from trace_tools.io.write import write_json_atomic, write_parquet_atomic
from trace_tools.pipeline import Pipeline, RendererPool
from trace_tools.reconstruct.rows import (  # noqa: F401 (the rows' helpers, re-exported: callers import them from here)
    CONTEXT_TOKENS,
    TURN_COLUMNS,
    divergence_context,
    first_divergence,
    render_turn,
    session_turn_rows,
    turn_fidelity,
)

if TYPE_CHECKING:  # built when asked for: the command line prints its table without pandas
    import pandas as pd

# Nullable dtypes: "not recorded" stays <NA> instead of turning lengths into floats.
TURN_DTYPES = {
    "turn_index": "Int64",
    "rendered_len": "Int64",
    "recorded_len": "Int64",
    "exact": "boolean",
    "first_divergence": "Int64",
}


@dataclass
class ReconstructResult:
    """`rows`: one dict per turn (TURN_COLUMNS); `summary`: run-level fidelity. `turns` (one row
    per turn) and `sessions` (per-session exact rate) are the same as DataFrames, built when first
    asked for: the command line prints `session_rows()` and imports no pandas."""

    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    renderer_identity: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def turns(self) -> pd.DataFrame:
        import pandas as pd

        from trace_tools.arrow_pool import pandas_interop

        pandas_interop()  # pyarrow converts this frame where `reconstruct` kept it from pandas
        return pd.DataFrame(self.rows, columns=TURN_COLUMNS).astype(TURN_DTYPES)

    @cached_property
    def sessions(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.session_rows(), columns=SESSION_COLUMNS)

    def session_rows(self) -> list[dict[str, Any]]:
        """Per session, in the order of the turns: turns, turns compared (prompt ids recorded),
        exact turns and their rate (None where nothing was compared)."""
        order: dict[str, dict[str, Any]] = {}
        for row in self.rows:
            entry = order.setdefault(row["session_id"], {"turns": 0, "turns_compared": 0, "exact": 0})
            entry["turns"] += 1
            entry["turns_compared"] += row["exact"] is not None
            entry["exact"] += row["exact"] is True
        return [
            {"session_id": sid, **n, "rate": n["exact"] / n["turns_compared"] if n["turns_compared"] else None}
            for sid, n in order.items()
        ]

    def save(self, directory: str | os.PathLike) -> list[Path]:
        """Write `turns.parquet` and `summary.json` (atomically) into `directory`."""

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        write_parquet_atomic(self.turns, out / "turns.parquet")
        write_json_atomic({**self.summary, "renderer": self.renderer_identity}, out / "summary.json")
        return [out / "turns.parquet", out / "summary.json"]


SESSION_COLUMNS = ["session_id", "turns", "turns_compared", "exact", "rate"]


RECONSTRUCT_COLUMNS = (
    "session_id",
    "turn_index",
    "messages",
    "tools",
    "output_ids",
    "prompt_ids",
    "chat_template_kwargs",
)


def reconstruct(
    dump: Any,
    *,
    tokenizer: str | None = None,
    chat_template: str | None = None,
    canonicalization: str = "slime",
    renderer: Any = None,
    progress: Callable[[int, int], None] | None = None,
    tool_format: str | None = None,
    render_path: str = "fast",
    owns_process: bool = False,
    workers: int | None = None,
) -> ReconstructResult:
    """Re-render every turn of a dump and compare with its recorded prompt ids.

    `dump` is a path (streamed through `trace_tools.pipeline`, each session rendered with its own
    file's tokenizer and template, reading only the columns this needs), an already loaded dump
    (anything with `.sessions`), or a list of `Session`s. `tokenizer` / `chat_template` override
    the dump's metadata, `tool_format` the detected tool-call format; `renderer` (any RendererLike)
    skips resolution altogether. `render_path`: fast | reference | verify
    (`render.spec.RENDER_PATHS`); with verify, `summary["verify"]` counts what was checked and
    what differed. `owns_process`: the caller owns this process (the command line), so the
    sessions may render with Python's cyclic collector off (`trace_tools.collector`).
    `workers`: processes reconstructing a dump path's sessions (`reconstruct.workers`; default
    `$TRACE_TOOLS_WORKERS` or the machine's cores, 1 for a small dump; 1 = this process). The
    rows, summary and identity are the same for any number. A `renderer` object is shared only
    with forked workers: where they would be spawned, this process reconstructs.
    """
    if owns_process:
        from trace_tools.arrow_pool import arrow_without_pandas

        arrow_without_pandas()  # the command line builds no DataFrame (`ReconstructResult`)
    if workers is not None and workers < 1:
        raise UsageError(f"--workers must be at least 1 (got {workers})")
    if isinstance(dump, (str, os.PathLike)):
        from trace_tools.process_pool import can_fork
        from trace_tools.reconstruct.workers import auto_workers, reconstruct_in_workers

        pipeline = Pipeline(
            dump,
            tokenizer=tokenizer,
            chat_template=chat_template,
            columns=RECONSTRUCT_COLUMNS,
            renderer=renderer,
            tool_format=tool_format,
            render_path=render_path,
            id_arrays=True,  # recorded ids compared as int32 arrays (`reconstruct.rows.Comparison`)
        )
        workers = workers or auto_workers(pipeline.stream.rows)
        if workers > 1 and (renderer is None or can_fork()):
            done = reconstruct_in_workers(pipeline, workers, canonicalization, progress)
            return _result(done.rows, done.quarantined, done.identities, done.render_stats, render_path)
        sessions, quarantined, total, pool = _streamed(pipeline)
    else:
        sessions, quarantined, total, pool = _given(dump, tokenizer, chat_template, renderer, tool_format, render_path)
    rows: list[dict[str, Any]] = []
    identities: dict[str, Any] = {}
    with collector_off(owns_process):
        for done_count, session in enumerate(sessions, start=1):
            rows += session_turn_rows(session, pool, canonicalization, identities)
            session_done()
            if progress:
                progress(done_count, total)
    return _result(rows, quarantined, identities, pool.render_stats(), render_path)


def _result(
    rows: list[dict[str, Any]], quarantined: set[str], identities: dict[str, Any], stats: dict[str, int], path: str
) -> ReconstructResult:
    """The result from the turns' rows, the sessions quarantined, the renderers' identities and
    their render counters (`summary["verify"]` on the verify path)."""
    summary = {**summarize(rows), "quarantined_sessions": len(quarantined)}
    if path == "verify":
        from trace_tools.render.renderer import verify_summary

        summary["verify"] = verify_summary(stats)
    identity = next(iter(identities.values()), {}) if len(identities) <= 1 else {"renderers": list(identities.values())}
    return ReconstructResult(rows, summary, identity)


def _streamed(pipeline: Any) -> tuple[Iterator[Session], set, int, Any]:
    """(valid sessions, quarantined session ids — filled while iterating —, session count, the
    pipeline's renderer pool, which resolved every file's renderer as it opened it)."""
    quarantined: set[str] = set()

    def valid() -> Iterator[Session]:
        for item in pipeline:
            if isinstance(item, Session):
                yield item
            elif item.session_id is not None:
                quarantined.add(item.session_id)

    return valid(), quarantined, pipeline.stream.session_count, pipeline.renderers


def _given(
    dump: Any,
    tokenizer: str | None,
    chat_template: str | None,
    renderer: Any,
    tool_format: str | None,
    render_path: str,
) -> tuple[Iterator[Session], set, int, Any]:
    """The same for a loaded dump or a list of sessions, with a renderer pool of its own."""
    pool = RendererPool(tokenizer, chat_template, renderer, tool_format, render_path)
    if hasattr(dump, "sessions"):
        quarantined = {entry.session_id for entry in getattr(dump, "quarantine", None) or ()}
        return iter(list(dump.sessions)), quarantined, len(dump.sessions), pool
    if isinstance(dump, Iterable):
        sessions = [s for s in dump if isinstance(s, Session)]
        return iter(sessions), set(), len(sessions), pool
    raise TraceToolsError(f"cannot reconstruct {type(dump).__name__}; pass a dump path, a loaded dump or sessions")


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """`{"turns_compared", "exact", "rate"}` (`prompt_fidelity`, docs/metrics.md#per-run) plus
    totals and render errors, from the turns' rows (TURN_COLUMNS)."""
    counts = Counter(row["exact"] for row in rows)
    compared = counts[True] + counts[False]
    return {
        "turns_compared": compared,
        "exact": counts[True],
        "rate": counts[True] / compared if compared else None,
        "turns": len(rows),
        "sessions": len({row["session_id"] for row in rows}),
        "render_errors": sum(row["error"] is not None for row in rows),
    }
