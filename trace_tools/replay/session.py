"""Replaying one session: the unit of work that executors (in-process, process pool, Ray) run.

`SessionReplayer(options)(session)` prepares the session through the pipeline with its own
file's renderer, computes its strategy-independent facts once, runs every strategy on the same
prepared turns, and returns run-directory rows. Nothing here depends on where it runs, so the
output is the same for any worker count and executor.
"""

from __future__ import annotations

import gc
import hashlib
import json
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

from trace_tools.data import Session
from trace_tools.errors import TemplateLimitExceeded, TraceToolsError
from trace_tools.io.id_columns import is_id_array, materialize_ids
from trace_tools.io.rundir import SessionRows, samples_table
from trace_tools.io.session_checks import session_warnings
from trace_tools.pipeline import RendererPool
from trace_tools.pipeline.facts import drift_rows, session_facts
from trace_tools.pipeline.prepared import PreparedSession, prepare_session
from trace_tools.render.limits import TemplateLimitHit
from trace_tools.replay.turnrows import check_trained_once, extra_counters, sample_rows, session_row, turn_rows
from trace_tools.strategies.base import ReplayContext, Strategy
from trace_tools.strategies.registry import get_strategy


@dataclass
class ReplayOptions:
    """Everything that changes what a replay computes (hashed into the run's fingerprint)."""

    strategies: list[str] = field(default_factory=list)
    prompt_source: str = "auto"
    tokenizer: str | None = None
    chat_template: str | None = None
    canonicalization: str = "slime"
    params: dict[str, Any] = field(default_factory=dict)
    write_samples: bool = True
    tool_format: str | None = None
    render_path: str = "fast"  # how renders are computed, not what they are (`render.spec.RENDER_PATHS`)

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True, default=str).encode()).hexdigest()[:16]

    def recorded(self) -> dict[str, Any]:
        """The options as run.json and the run's fingerprint record them: the render path only
        when it is not the default, so a default run records what it did before the switch existed."""
        recorded = asdict(self)
        if self.render_path == "fast":
            del recorded["render_path"]
        return recorded


class SessionReplayer:
    """Replays sessions under fixed options; each process builds one (and its renderers) once.

    `pause_gc`: switch the cyclic garbage collector off while each session replays
    (`_collector_paused`). It is process-wide, so only a process the replay owns does it: a worker
    process, or the command line's; a notebook or a service calling the API keeps its collector.

    The options were checked before the run (`preflight`): the strategy classes are looked up once
    here, and `resolved` (`RendererPool.resolved`) carries the render specs the run's preflight
    resolved, so that no name is resolved again per session or per worker."""

    def __init__(self, options: ReplayOptions, pause_gc: bool = False, resolved: dict[tuple, Any] | None = None):
        self.options, self.pause_gc = options, pause_gc
        self.strategies = [(name, get_strategy(name)) for name in options.strategies]
        self.renderers = RendererPool(
            options.tokenizer,
            options.chat_template,
            tool_format=options.tool_format,
            render_path=options.render_path,
            resolved=resolved,
        )

    def __call__(self, session: Session) -> SessionRows:
        with _collector_paused() if self.pause_gc else nullcontext():
            try:
                return self._replay(session)
            except TemplateLimitHit as hit:  # the template, not this session: the run stops (exit 2)
                raise TemplateLimitExceeded(str(hit)) from None

    def _replay(self, session: Session) -> SessionRows:
        rows = SessionRows()
        materialize_ids(session, prompts=False)  # recorded prompts stay arrays until compared (`session_facts`)
        _check_id_lists(session)
        rows.data_warnings = {kind: count for kind, (count, _example) in session_warnings(session).items()}
        try:
            prepared = self.prepare(session)
            facts = session_facts(prepared)
        except Exception as exc:  # a broken session must not stop the run; its reason is kept
            rows.quarantine.append(_quarantine(session.session_id, _describe(exc)))
            return rows
        rows.fidelity = facts.fidelity
        rows.drift = drift_rows(prepared, facts.drift)
        ctx = ReplayContext(
            prepared.renderer, self.options.canonicalization, self.options.prompt_source, self.options.params
        )
        samples = []
        for name, strategy in self.strategies:
            samples += self._run_strategy(name, strategy, prepared, ctx, facts, rows)
        if self.options.write_samples:
            rows.samples = samples_table(samples)
        rows.render_stats = self._render_stats(prepared.renderer)
        rows.renderer = dict(getattr(prepared.renderer, "identity", None) or {})
        return rows

    def prepare(self, session: Session) -> PreparedSession:
        renderer = self.renderers.for_session(session)
        return prepare_session(session, renderer, self.options.canonicalization, self.options.prompt_source)

    def _run_strategy(
        self,
        name: str,
        strategy: type[Strategy],
        prepared: PreparedSession,
        ctx: ReplayContext,
        facts: Any,
        rows: SessionRows,
    ) -> list[dict[str, Any]]:
        started = time.perf_counter()
        try:
            result = strategy(ctx).replay(prepared)
            elapsed = time.perf_counter() - started
            trained = check_trained_once(prepared.session, result)
        except Exception as exc:  # quarantined per strategy: the other strategies still replay it
            rows.quarantine.append(_quarantine(prepared.session_id, f"strategy {name}: {_describe(exc)}"))
            return []
        session = prepared.session
        turns = turn_rows(name, session, result, facts.tool_names, facts.prompt_lengths, trained)
        causes = facts.drift_causes
        for row in turns:
            row["drift_cause"] = causes.get(row["turn_index"])
        rows.turns.extend(turns)
        row = session_row(name, session, result, elapsed, trained)
        row["extra_counters"] = json.dumps(extra_counters(result), sort_keys=True)
        rows.sessions.append(row)
        return sample_rows(name, session.session_id, result, session.step) if self.options.write_samples else []

    @staticmethod
    def _render_stats(renderer: Any) -> dict[str, int]:
        """The renderer's counters for this session (then reset with its caches)."""
        if renderer is None or not hasattr(renderer, "cache_info"):
            return {}
        stats = {k: int(v) for k, v in renderer.cache_info().items()}
        renderer.reset_caches()
        renderer.engine.stats.clear()
        return stats


def strategy_turn_view(prepared: PreparedSession, ctx: ReplayContext, name: str, turn_index: int) -> dict[str, Any]:
    """What strategy `name` made of one turn: its event, prompt event, tokens, and the session's samples."""
    result = get_strategy(name)(ctx).replay(prepared)
    row = next(r for r in turn_rows(name, prepared.session, result, {}, {}) if r["turn_index"] == turn_index)
    return {k: row[k] for k in ("event", "prompt_event", "generated_tokens", "trained_tokens")} | {
        "samples": len(result.samples)
    }


@contextmanager
def _collector_paused() -> Iterator[None]:
    """No automatic garbage collection while a session replays: each collection walks every live
    token-id list, and replay keeps tens of thousands of them alive at once. Strategies free
    their trees themselves (`release_tree`), so little is left for the collector afterwards."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _check_id_lists(session: Session) -> None:
    """Token ids are `list[int]` wherever a session is replayed (the data model's type), except
    recorded prompts read as int32 arrays, which `session_facts` compares with their renders and
    makes lists before anything else reads them (`pipeline.recorded`)."""
    for turn in session.turns:
        for ids, arrays in ((turn.prompt_ids, True), (turn.output_ids, False)):
            if ids is not None and type(ids) is not list and not (arrays and is_id_array(ids)):
                kind = type(ids).__name__
                raise TypeError(f"session {session.session_id!r} carries token ids as {kind}, not list[int]")


def _quarantine(session_id: str, detail: str) -> dict[str, Any]:
    return {"session_id": session_id, "turn_index": None, "reason": "replay_error", "detail": detail}


def _describe(exc: Exception) -> str:
    return str(exc) if isinstance(exc, TraceToolsError) else f"{type(exc).__name__}: {exc}"
