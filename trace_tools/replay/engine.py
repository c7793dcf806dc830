"""The replay engine: load a dump, run every strategy over every session, write the run directory.

The engine owns iteration, timing, per-session error capture and the run directory (DESIGN §6).
Sessions are processed in shards; each finished shard is written atomically with a completion
marker, so a rerun into the same directory with the same options resumes where it stopped.
Shards are independent, which is what a process-pool or Ray executor will distribute later.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from trace_tools.data import QuarantineEntry, Session
from trace_tools.errors import TraceToolsError, UnusableInput
from trace_tools.replay import rundir
from trace_tools.replay.preflight import check_replay
from trace_tools.replay.turnrows import extra_counters, sample_rows, session_row, turn_rows
from trace_tools.strategies.base import ReplayContext, available_strategies, get_strategy

SHARD_SIZE = 16


@dataclass
class ReplayOptions:
    """Everything that changes what a replay computes (hashed into run.json for resuming)."""

    strategies: list[str] = field(default_factory=list)
    prompt_source: str = "auto"
    tokenizer: str | None = None
    chat_template: str | None = None
    canonicalization: str = "slime"
    params: dict[str, Any] = field(default_factory=dict)
    write_samples: bool = True

    def fingerprint(self, dump: str) -> str:
        blob = json.dumps({"dump": dump, **asdict(self)}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class RunResult:
    run_dir: Path
    summary: dict[str, Any]
    sessions_replayed: int
    quarantined: int
    resumed_shards: int = 0  # finished shards of an earlier, interrupted run with the same options


def default_dump() -> Path:
    """The bundled sample_traces/, found in an editable install and in a wheel install alike."""
    from trace_tools.io.bundled import sample_dir

    found = sample_dir()
    if found is None:
        raise UnusableInput("the bundled sample_traces/ dump is missing from this install; pass a DUMP path")
    return found


def default_run_dir(dump: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return Path("trace-tools-runs") / f"{dump.stem if dump.is_file() else dump.name}-{stamp}"


def replay(dump: str | Path | None = None, *, out: str | Path | None = None, strategies: Iterable[str] | None = None,
           prompt_source: str = "auto", tokenizer: str | None = None, chat_template: str | None = None,
           canonicalization: str = "slime", params: dict[str, Any] | None = None, write_samples: bool = True,
           progress: Callable[[int, int], None] | None = None, overwrite: bool = False) -> RunResult:
    """Replay a dump through strategies and write the run directory; returns the run summary."""
    dump_path = Path(dump) if dump is not None else default_dump()
    names = list(strategies or available_strategies())
    for name in names:
        get_strategy(name)  # fail fast on an unknown name, before any work
    if prompt_source not in ("auto", "recorded", "rendered"):
        raise TraceToolsError(f"--prompt-source must be auto, recorded or rendered, not {prompt_source!r}")
    options = ReplayOptions(names, prompt_source, tokenizer, _template_arg(chat_template), canonicalization,
                            {k: v for k, v in (params or {}).items() if v is not None}, write_samples)
    run_dir = Path(out) if out is not None else default_run_dir(dump_path)
    resumed = check_replay(dump_path, options, run_dir, overwrite=overwrite)
    loaded = _load(dump_path, options)
    rundir.prepare(run_dir, options.fingerprint(str(dump_path.resolve())))
    renderers = _Renderers(options)
    shards = [loaded.sessions[i:i + SHARD_SIZE] for i in range(0, len(loaded.sessions), SHARD_SIZE)]
    done = 0
    for index, shard in enumerate(shards):
        tick = (lambda n, base=done: progress(base + n, len(loaded.sessions))) if progress else None
        if not rundir.shard_done(run_dir, index):
            rundir.write_shard(run_dir, index, _replay_shard(shard, options, renderers, tick), write_samples)
        done += len(shard)
        if progress:
            progress(done, len(loaded.sessions))
    summary = rundir.finalize(run_dir, dump_path, loaded, options, renderers.identities(), len(shards))
    return RunResult(run_dir, summary, len(loaded.sessions), summary["quarantined"], resumed)


def _template_arg(chat_template: str | None) -> str | None:
    if chat_template and Path(chat_template).is_file():
        return str(Path(chat_template).resolve())
    return chat_template


def _load(dump_path: Path, options: ReplayOptions):
    from trace_tools.io.load import load

    return load(dump_path, tokenizer=options.tokenizer)


class _Renderers:
    """One renderer per distinct (tokenizer, template) recording, so a directory may mix templates."""

    def __init__(self, options: ReplayOptions):
        self.options = options
        self._cache: dict[tuple, Any] = {}

    def for_session(self, session: Session):
        meta = session.meta
        tokenizer = self.options.tokenizer or meta.tokenizer
        key = (tokenizer, self.options.chat_template, meta.chat_template)
        if key not in self._cache:
            self._cache[key] = self._build(tokenizer, meta)
        return self._cache[key]

    def _build(self, tokenizer: str | None, meta):
        if tokenizer is None:
            return None
        from trace_tools.render.renderer import Renderer

        return Renderer.from_spec(tokenizer, self.options.chat_template, dump_meta=meta)

    def identities(self) -> list[dict]:
        return [r.identity for r in self._cache.values() if r is not None]


def _replay_shard(sessions: list[Session], options: ReplayOptions, renderers: _Renderers,
                  tick: Callable[[int], None] | None = None) -> rundir.ShardRows:
    rows = rundir.ShardRows()
    for number, session in enumerate(sessions, start=1):
        _replay_session(session, options, renderers, rows)
        if tick:
            tick(number)  # progress per session, not per shard
    return rows


def _replay_session(session: Session, options: ReplayOptions, renderers: _Renderers, rows: rundir.ShardRows) -> None:
    try:
        renderer = renderers.for_session(session)
        ctx = ReplayContext(renderer, options.canonicalization, options.prompt_source, options.params)
        facts = _session_facts(session, ctx)
    except TraceToolsError as exc:
        rows.quarantine.append(QuarantineEntry(session.session_id, None, "replay_error", str(exc)))
        return
    except Exception as exc:  # a broken session must not stop the run; its reason is kept
        rows.quarantine.append(QuarantineEntry(session.session_id, None, "replay_error", f"{type(exc).__name__}: {exc}"))
        return
    rows.fidelity.extend(facts.fidelity)
    for name in options.strategies:
        _run_strategy(name, session, ctx, facts, rows)


def _run_strategy(name: str, session: Session, ctx: ReplayContext, facts: "_SessionFacts",
                  rows: rundir.ShardRows) -> None:
    started = time.perf_counter()
    try:
        result = get_strategy(name)(ctx).replay(session)
    except Exception as exc:  # quarantined per strategy: the other strategies still replay it
        detail = f"strategy {name}: {type(exc).__name__}: {exc}"
        rows.quarantine.append(QuarantineEntry(session.session_id, None, "replay_error", detail))
        return
    elapsed = time.perf_counter() - started
    turns = turn_rows(name, session, result, facts.tool_names, facts.prompt_lengths)
    for row in turns:
        row["drift_cause"] = facts.drift_causes.get(row["turn_index"])
    rows.turns.extend(turns)
    row = session_row(name, session, result, elapsed)
    row["extra_counters"] = json.dumps(extra_counters(result), sort_keys=True)
    rows.sessions.append(row)
    rows.samples.extend(sample_rows(name, session, result))


@dataclass
class _SessionFacts:
    """Strategy-independent facts of a session: tool names per turn, prompt lengths, fidelity."""

    tool_names: dict[int, list[str]]
    prompt_lengths: dict[int, int]
    fidelity: list[dict[str, Any]]
    drift_causes: dict[int, str]


def _session_facts(session: Session, ctx: ReplayContext) -> _SessionFacts:
    from trace_tools.strategies.prepare import prepare_turn

    from trace_tools.report.drift import find_drift

    rendered_ctx = ReplayContext(ctx.renderer, ctx.canonicalization, "rendered", ctx.params)
    tool_names, lengths, fidelity, prepared = {}, {}, [], {}
    for turn in session.turns:
        prepared[turn.turn_index] = prepare_turn(turn, ctx)
        message = prepared[turn.turn_index].response_message or {}
        tool_names[turn.turn_index] = [c.get("function", {}).get("name", "?") for c in message.get("tool_calls") or []]
        lengths[turn.turn_index] = len(prepared[turn.turn_index].prompt_ids)
        if turn.prompt_ids is not None and ctx.renderer is not None:
            rendered = prepare_turn(turn, rendered_ctx).prompt_ids
            fidelity.append({"session_id": session.session_id, "turn_index": turn.turn_index,
                             "exact": rendered == list(turn.prompt_ids)})
    causes = {f.turn_index: f.cause for f in find_drift(session, prepared, ctx.renderer) if f.cause}
    return _SessionFacts(tool_names, lengths, fidelity, causes)
