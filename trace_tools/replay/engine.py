"""The replay engine: stream a dump's sessions through every strategy into a run directory.

    pipeline pass 1 (index) → pass 2 (sessions as they complete) → executor (this process, a
    process pool or Ray) → rows in stream order → shards (closed by rows, bytes or time), each
    finished by a marker that lists its files with checksums → merged tables (`io.shards`)

Only the sessions in flight and the rows of the shard being filled are in memory. A shard that
is already finished (same options, inputs and code), whose files check out and whose sessions
are the ones the dump has at its positions, is not replayed again, so a killed run resumes. One
process writes a run directory at a time (`io.shards.RunLock`).
The run-level summary, report.md and plots are computed from the merged tables by the caller
(`trace_tools.api.replay`), which keeps this layer free of reporting.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

from trace_tools.data import QuarantineEntry, Session
from trace_tools.errors import UnusableInput
from trace_tools.io import rundir, shards
from trace_tools.replay.executors import default_workers, run_sessions
from trace_tools.replay.preflight import check_dump, check_options, check_run_dir
from trace_tools.replay.session import ReplayOptions
from trace_tools.strategies.base import available_strategies, get_strategy

T = TypeVar("T")


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
    redone_shards: list[str] = field(default_factory=list)  # finished shards not reused, and why
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
    finish: Callable[[EngineResult], T],
) -> T:
    """Replay `dump` under `options` into a run directory (tables only; see the module docstring),
    then `finish(result)` (the summary and reports) while this process still holds the run's lock.

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
    current = shards.fingerprint(asdict(options), stream.files)
    check_dump(dump_path, stream, options)
    pipeline.renderers.check_templates()
    check_run_dir(run_dir, current, overwrite)
    run_dir.mkdir(parents=True, exist_ok=True)
    with shards.RunLock(run_dir):
        (run_dir / "summary.json").unlink(missing_ok=True)  # unfinished until it is written again, last
        verdict = shards.prepare(run_dir, current)
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
            len(verdict.reusable),
            verdict.redone,
        )
        _replay(pipeline, result, verdict.reusable, current["stamp"], workers, executor, address, progress)
        return finish(result)


def _replay(
    pipeline: Any,
    result: EngineResult,
    reusable: list[shards.Marker],
    stamp: str,
    workers: int | None,
    executor: str,
    address: str | None,
    progress: Callable[[int, int], None] | None,
) -> None:
    """Replay the sessions no reusable shard holds into new shards, then merge every shard."""
    options, run_dir, stream = result.options, result.run_dir, pipeline.stream
    load_quarantine: list[dict[str, Any]] = []
    tracker = _Shards(run_dir, reusable, options.write_samples, stamp, progress, stream.session_count)
    samples = rundir.SamplesFile(run_dir) if options.write_samples and not reusable else None
    in_flight: deque[tuple[int, str]] = deque()
    todo = _pending(_sessions(pipeline, load_quarantine, tracker), tracker, in_flight)
    try:
        for rows in run_sessions(todo, options, workers or default_workers(), executor, address):
            tracker.add(*in_flight.popleft(), rows)
            if samples is not None:
                samples.add(rows.samples)
        tracker.finish()
    except BaseException:
        tracker.abandon()
        if samples is not None:
            samples.discard()
        raise
    result.sessions_replayed = tracker.replayed
    result.resumed_shards = len(tracker.reused())
    result.redone_shards += tracker.redone
    result.data_warnings = dict(stream.data_warnings)
    markers = tracker.markers()
    shards.check_coverage(markers, tracker.positions)
    result.render_stats, result.renderers = shards.shard_meta(markers)
    shards.merge(run_dir, markers, load_quarantine, options.write_samples and samples is None)
    if samples is not None:
        samples.commit()


def _sessions(pipeline: Any, quarantine: list[dict[str, Any]], tracker: "_Shards") -> Iterator[Session]:
    """The stream's sessions; its quarantine entries are set aside for the quarantine table."""
    seen: set[str] = set()
    for item in pipeline:
        if not isinstance(item, QuarantineEntry):
            yield item
            continue
        quarantine.append(asdict(item))
        if item.session_id is not None and item.session_id not in seen:
            seen.add(item.session_id)
            tracker.tick()


def _pending(sessions: Iterator[Session], tracker: "_Shards", in_flight: deque) -> Iterator[Session]:
    """Sessions no reusable shard holds; their stream positions and ids queue up in `in_flight`
    (executors return results in submission order)."""
    for position, session in enumerate(sessions):
        tracker.positions = position + 1
        if tracker.skip(position, session.session_id):
            continue
        in_flight.append((position, session.session_id))
        yield session


class _Shards:
    """The shards of this run: reusable ones (skipped, checked session by session) and new ones,
    each closed at the shard limits or where a reusable one begins."""

    def __init__(
        self,
        run_dir: Path,
        reusable: list[shards.Marker],
        write_samples: bool,
        stamp: str,
        progress: Callable[[int, int], None] | None,
        total: int,
    ):
        self.run_dir, self.write_samples, self.stamp = run_dir, write_samples, stamp
        self.progress, self.total = progress, total
        self.limits = shards.Limits.from_env()
        self._reusable = {marker.start: marker for marker in reusable}
        self._starts = sorted(self._reusable)
        self._written: list[shards.Marker] = []
        self._writer: shards.ShardWriter | None = None
        self._checking: Any = None  # digest of the ids skipped in the reusable shard being passed
        self.redone: list[str] = []  # reusable shards dropped once their sessions came, and why
        self.replayed = 0
        self.positions = 0  # sessions the stream has handed out so far
        self._seen = 0

    def skip(self, position: int, session_id: str) -> bool:
        """True for a session a reusable shard holds (counted, not replayed again). A shard whose
        first session is not the one it recorded is replayed; one that goes wrong later stops the run."""
        index = bisect.bisect_right(self._starts, position) - 1
        marker = self._reusable.get(self._starts[index]) if index >= 0 else None
        if marker is None or position >= marker.end:
            return False
        if position == marker.start:
            if session_id != marker.first:
                self.redone.append(
                    f"shard {marker.name}: it starts with session {marker.first!r}, the dump with {session_id!r}"
                )
                self._drop(marker)
                return False
            self._checking = shards.IdDigest()
        self._checking.add(session_id)
        if position == marker.end - 1 and self._checking.value() != marker.sessions:
            raise UnusableInput(
                f"shard {marker.name} of {self.run_dir} holds other sessions than the dump has at positions "
                f"{marker.start}–{marker.end - 1} (its files were swapped or edited); rerun with --overwrite"
            )
        self.tick()
        return True

    def add(self, position: int, session_id: str, rows: rundir.SessionRows) -> None:
        if self._writer is not None and self._writer.end != position:
            self._close()
        if self._writer is None:
            self._writer = shards.ShardWriter(self.run_dir, position, self.write_samples, self.stamp)
        self._writer.add(session_id, rows)
        self.replayed += 1
        self.tick()
        if self._writer.full(self.limits) or position + 1 in self._reusable:
            self._close()

    def finish(self) -> None:
        """Close the shard being filled: its last session has come back."""
        if self._writer is not None:
            self._close()

    def abandon(self) -> None:
        """The run stops (error or interrupt): the shard being filled is left unfinished."""
        if self._writer is not None:
            self._writer.discard()
            self._writer = None

    def reused(self) -> list[shards.Marker]:
        return list(self._reusable.values())

    def markers(self) -> list[shards.Marker]:
        """Every shard of the run, reused and new, in stream order."""
        return sorted([*self._reusable.values(), *self._written], key=lambda marker: marker.start)

    def tick(self) -> None:
        """One more session accounted for (replayed, resumed or quarantined while loading)."""
        self._seen += 1
        if self.progress:
            self.progress(self._seen, self.total)

    def _close(self) -> None:
        assert self._writer is not None
        self._written.append(self._writer.close())
        self._writer = None

    def _drop(self, marker: shards.Marker) -> None:
        """A reusable shard that turned out not to be: its files go, its sessions are replayed."""
        for name in [*marker.files, f"{marker.name}.done"]:
            (self.run_dir / "shards" / name).unlink(missing_ok=True)
        del self._reusable[marker.start]
        self._starts.remove(marker.start)


def replay_sessions(sessions: Iterable[Session], options: ReplayOptions, workers: int = 1) -> list[rundir.SessionRows]:
    """Rows for already loaded sessions (tests and notebooks), without a run directory."""
    return list(run_sessions(sessions, options, workers))
