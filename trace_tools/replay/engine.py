"""The replay engine: stream a dump's sessions through every strategy into a run directory.

    pipeline pass 1 (index) → pass 2 (sessions as they complete) → executor (this process, a
    process pool or Ray) → rows in stream order → shards of SHARD_SIZE sessions, each written
    atomically → merged tables (`io.rundir`)

Only the sessions in flight and the rows of the shard being filled are in memory. A shard that
is already finished (same options, same inputs) is not replayed again, so a killed run resumes.
The run-level summary, report.md and plots are computed from the merged tables by the caller
(`trace_tools.api.replay`), which keeps this layer free of reporting.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from trace_tools.data import QuarantineEntry, Session
from trace_tools.errors import UnusableInput
from trace_tools.io import rundir
from trace_tools.replay.executors import default_workers, run_sessions
from trace_tools.replay.preflight import check_dump, check_options, check_run_dir
from trace_tools.replay.session import ReplayOptions
from trace_tools.strategies.base import available_strategies, get_strategy

SHARD_SIZE = 16  # sessions per shard; `$TRACE_TOOLS_SHARD_SIZE` overrides it (part of the fingerprint)


def shard_size() -> int:
    value = os.environ.get("TRACE_TOOLS_SHARD_SIZE", "")
    return max(1, int(value)) if value.isdigit() else SHARD_SIZE


@dataclass
class EngineResult:
    """What the engine wrote, and what it read to do so."""

    run_dir: Path
    dump: Path
    options: ReplayOptions
    files: list[str]
    rows: int
    session_count: int
    sessions_replayed: int
    vocab_checked: bool
    meta: Any
    warnings: list[str]
    resumed_shards: int = 0
    render_stats: dict[str, int] = field(default_factory=dict)
    renderers: list[dict[str, Any]] = field(default_factory=list)
    data_warnings: dict[str, int] = field(default_factory=dict)  # legal oddities of valid sessions (io.load)


def default_dump() -> Path:
    """The bundled sample_traces/, found in an editable install and in a wheel install alike."""
    from trace_tools.io.bundled import sample_dir

    found = sample_dir()
    if found is not None:
        return found
    raise UnusableInput("the bundled sample_traces/ dump is missing from this install; pass a DUMP path")


def default_run_dir(dump: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return Path("trace-tools-runs") / f"{dump.stem if dump.is_file() else dump.name}-{stamp}"


def run(
    dump: str | Path | None,
    options: ReplayOptions,
    out: str | Path | None = None,
    *,
    workers: int | None = None,
    executor: str = "local",
    address: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    overwrite: bool = False,
) -> EngineResult:
    """Replay `dump` under `options` into a run directory (tables only; see the module docstring).

    Everything that would make every session fail the same way is checked before the first one
    (`preflight`): a usage error (exit 2) then, never a quarantine of everything."""
    from trace_tools.pipeline import Pipeline

    dump_path = Path(dump) if dump is not None else default_dump()
    options.strategies = list(options.strategies or available_strategies())
    for name in options.strategies:
        get_strategy(name)  # fail fast on an unknown name, before any work
    check_options(options)
    pipeline = Pipeline(
        dump_path,
        tokenizer=options.tokenizer,
        chat_template=options.chat_template,
        canonicalization=options.canonicalization,
        prompt_source=options.prompt_source,
        tool_format=options.tool_format,
        id_arrays=(workers or default_workers()) > 1 or executor == "ray",
    )
    options.chat_template = pipeline.renderers.chat_template  # a file, made absolute
    run_dir = Path(out) if out is not None else default_run_dir(dump_path)
    stream = pipeline.stream
    size = shard_size()
    stamp = rundir.fingerprint({**asdict(options), "shard_size": size}, stream.files)
    check_dump(dump_path, stream, options)
    check_run_dir(run_dir, stamp, overwrite, asdict(options))
    resumed = rundir.prepare(run_dir, stamp)
    result = EngineResult(
        run_dir,
        dump_path,
        options,
        stream.files,
        stream.rows,
        stream.session_count,
        0,
        stream.vocab_checked,
        stream.meta,
        list(stream.warnings),
        resumed,
    )
    load_quarantine: list[dict[str, Any]] = []
    shards = _Shards(run_dir, size, options.write_samples, progress, stream.session_count)
    samples = rundir.SamplesFile(run_dir) if options.write_samples and not resumed else None
    in_flight: deque[int] = deque()
    todo = _pending(_sessions(pipeline, load_quarantine, shards), shards, in_flight)
    for rows in run_sessions(todo, options, workers or default_workers(), executor, address):
        shards.add(in_flight.popleft(), rows)
        if samples is not None:
            samples.add(rows.samples)
    shards.finish()
    result.sessions_replayed = shards.replayed
    result.data_warnings = dict(stream.data_warnings)
    result.render_stats, result.renderers = rundir.shard_meta(run_dir, shards.count)
    rundir.merge_shards(run_dir, shards.count, load_quarantine, options.write_samples and samples is None)
    if samples is not None:
        samples.commit()
    return result


def _sessions(pipeline: Any, quarantine: list[dict[str, Any]], shards: "_Shards") -> Iterator[Session]:
    """The stream's sessions; its quarantine entries are set aside for the quarantine table."""
    seen: set[str] = set()
    for item in pipeline:
        if not isinstance(item, QuarantineEntry):
            yield item
            continue
        quarantine.append(asdict(item))
        if item.session_id is not None and item.session_id not in seen:
            seen.add(item.session_id)
            shards.tick()


def _pending(sessions: Iterator[Session], shards: "_Shards", in_flight: deque) -> Iterator[Session]:
    """Sessions whose shard is not finished yet; their stream positions queue up in `in_flight`
    (executors return results in submission order)."""
    for position, session in enumerate(sessions):
        if shards.skip(position):
            continue
        in_flight.append(position)
        yield session


class _Shards:
    """Shard i holds the sessions at stream positions [i·size, (i+1)·size)."""

    def __init__(
        self, run_dir: Path, size: int, write_samples: bool, progress: Callable[[int, int], None] | None, total: int
    ):
        self.run_dir, self.size, self.write_samples, self.progress, self.total = (
            run_dir,
            size,
            write_samples,
            progress,
            total,
        )
        self.count = 0  # shards seen so far
        self.replayed = 0
        self._seen = 0
        self._writer: rundir.ShardWriter | None = None
        self._index = -1

    def skip(self, position: int) -> bool:
        """True for a session of an already finished shard (counted, not replayed again)."""
        index = position // self.size
        self.count = max(self.count, index + 1)
        if rundir.shard_done(self.run_dir, index):
            self.tick()
            return True
        return False

    def add(self, position: int, rows: rundir.SessionRows) -> None:
        index = position // self.size
        if index != self._index:
            self.finish()
            self._writer, self._index = rundir.ShardWriter(self.run_dir, index, self.write_samples), index
        assert self._writer is not None, "the shard being filled was closed before its last session"
        self._writer.add(rows)
        self.replayed += 1
        self.tick()

    def finish(self) -> None:
        """Close the shard being filled: its last session has come back."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def tick(self) -> None:
        """One more session accounted for (replayed, resumed or quarantined while loading)."""
        self._seen += 1
        if self.progress:
            self.progress(self._seen, self.total)


def replay_sessions(sessions: Iterable[Session], options: ReplayOptions, workers: int = 1) -> list[rundir.SessionRows]:
    """Rows for already loaded sessions (tests and notebooks), without a run directory."""
    return list(run_sessions(sessions, options, workers))
