"""The session pipeline: the one road from a dump to prepared turns (docs/pipeline.md).

    pass 1: session_id (and row position) of every row → where each session ends
    pass 2: row groups in order → rows of open sessions buffered → a session is handed on when
            its last row is read, then dropped → prepared with its own file's renderer

`replay`, `reconstruct`, `rescore`, `explain` and the Python API all read sessions through
`Pipeline`; strategies receive its `PreparedSession`s. Memory follows the sessions open at once,
not the dump; within a session, history is parsed, canonicalized, rendered and tokenized once
(`io.load.HistoryParser`, `prepared.Canonicalizer`, `render.incremental`).

    from trace_tools.pipeline import Pipeline
    pipeline = Pipeline("dump.parquet")
    for prepared in pipeline.prepared():          # PreparedSession or QuarantineEntry
        ...
"""

from __future__ import annotations

import difflib
import os
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Iterator

from trace_tools.data import DumpMeta, QuarantineEntry, Session
from trace_tools.errors import TraceToolsError, UnknownName
from trace_tools.io import storage
from trace_tools.io.load import iter_sessions
from trace_tools.pipeline.facts import SessionFacts, session_facts
from trace_tools.pipeline.prepared import PROMPT_SOURCES, PreparedSession, PreparedTurn, prepare_session
from trace_tools.render.families import TOOL_FORMATS
from trace_tools.render.renderer import check_template
from trace_tools.render.spec import RENDER_PATHS

__all__ = [
    "PROMPT_SOURCES",
    "Pipeline",
    "PreparedSession",
    "PreparedTurn",
    "RendererPool",
    "SessionFacts",
    "prepare_session",
    "session_facts",
]


class RendererPool:
    """One renderer per distinct `RenderSpec`: a directory may mix tokenizers, templates and
    recording dates, and each session is rendered with every input its own file names (command-line
    options override the dump's metadata). The pool keys on the resolved spec, so two files that
    differ in anything a renderer reads (a gpt-oss render date, say) never share one."""

    def __init__(
        self,
        tokenizer: str | None = None,
        chat_template: str | None = None,
        renderer: Any = None,
        tool_format: str | None = None,
        render_path: str = "fast",
        resolved: dict[tuple, Any] | None = None,
    ):
        """`resolved`: the specs a pool with the same options already resolved (its `resolved`), so
        that a replay's sessions reuse what its preflight resolved instead of resolving them again."""

        if tool_format is not None and tool_format not in TOOL_FORMATS:
            raise UnknownName("tool-call format", tool_format, TOOL_FORMATS)
        if render_path not in RENDER_PATHS:
            raise UnknownName("render path", render_path, RENDER_PATHS)
        self.tokenizer, self.chat_template, self.fixed = tokenizer, _template_arg(chat_template), renderer
        self.tool_format, self.render_path = tool_format, render_path
        # a file's metadata → its RenderSpec (resolution reads files)
        self._specs: dict[tuple, Any] = dict(resolved or {})
        self._renderers: dict[Any, Any] = {}  # RenderSpec → Renderer

    def for_session(self, session: Session) -> Any:
        """The session's renderer; None when no tokenizer is known (raises for a bad name)."""
        if self.fixed is not None:
            return self.fixed
        spec = self.spec_for(session.meta)
        return None if spec is None else self._renderer(spec)

    def _renderer(self, spec: Any) -> Any:
        renderer = self._renderers.get(spec)
        if renderer is None:
            from trace_tools.render.renderer import Renderer

            renderer = self._renderers[spec] = Renderer.from_render_spec(spec)
        return renderer

    def preload(self) -> None:
        """Build the renderer of every spec resolved so far, its tokenizer's encoder and its compiled
        template (`Renderer.preload`), before worker processes fork from this one."""
        renderers = [self.fixed] if self.fixed is not None else [self._renderer(spec) for spec in self.specs()]
        for renderer in renderers:
            if hasattr(renderer, "preload"):  # a caller's own renderer may have nothing to load
                renderer.preload()

    def spec_for(self, meta: DumpMeta) -> Any:
        """Every input the renderer of a recording with this metadata reads; None without a tokenizer."""
        key = (
            meta.schema_version,
            meta.tokenizer,
            meta.chat_template,
            meta.history_mode,
            meta.harness,
            *meta.extra.items(),
        )
        if key not in self._specs:
            from trace_tools.render.spec import RenderSpec

            tokenizer = self.tokenizer or meta.tokenizer
            self._specs[key] = (
                None
                if tokenizer is None
                else RenderSpec.resolve(
                    tokenizer, self.chat_template, meta, tool_format=self.tool_format, path=self.render_path
                )
            )
        return self._specs[key]

    def check(self, metas: Iterable[Any]) -> None:
        """Resolve every recording's tokenizer name, chat template and render date up front (no
        loading), so a wrong name fails before the first session instead of quarantining all of them."""
        if self.fixed is not None:
            return
        for meta in metas:
            if self.tokenizer or meta.tokenizer:
                self.spec_for(meta)
            elif self.chat_template:
                from trace_tools.render.templates import resolve_template

                resolve_template(self.chat_template, dump_template=meta.chat_template)

    def check_templates(self) -> None:
        """Every resolved template compiles and renders the simplest conversation within its
        limits (`render.renderer.check_template`): one that fails there would fail every session."""

        for spec in self.specs():
            check_template(spec)

    @property
    def resolved(self) -> dict[tuple, Any]:
        """Every recording's resolved spec so far, by its metadata: what `resolved` takes."""
        return dict(self._specs)

    def specs(self) -> list[Any]:
        """The distinct specs resolved so far, in the order first met."""
        return list(dict.fromkeys(spec for spec in self._specs.values() if spec is not None))

    def identities(self) -> list[dict]:
        return [r.identity for r in self._renderers.values() if r is not None]

    def render_stats(self) -> dict[str, int]:
        """The counters of every renderer built so far, summed (`Renderer.cache_info`)."""

        total: Counter = Counter()
        for renderer in self._renderers.values():
            total.update(renderer.cache_info())
        return dict(total)

    def __getstate__(self) -> dict:
        # Shipped to worker processes as a recipe: each builds its own renderers.
        return {
            "tokenizer": self.tokenizer,
            "chat_template": self.chat_template,
            "fixed": self.fixed,
            "tool_format": self.tool_format,
            "render_path": self.render_path,
            "_specs": {},
            "_renderers": {},
        }


class Pipeline:
    """A dump opened for streaming: pass 1 runs on construction (so unusable input fails at once
    and `stream.files`, `rows`, `session_count`, `meta` and `warnings` are known), pass 2 on iteration."""

    def __init__(
        self,
        dump: str | os.PathLike[str],
        *,
        tokenizer: str | None = None,
        chat_template: str | None = None,
        canonicalization: str = "slime",
        prompt_source: str = "auto",
        columns: Iterable[str] | None = None,
        renderer: Any = None,
        vocab_size: int | None = None,
        tool_format: str | None = None,
        id_arrays: bool = False,
        render_path: str = "fast",
    ):
        """`id_arrays`: sessions carry their token ids as int32 arrays, cheap to send to worker
        processes; a replay makes them lists (`SessionReplayer`, `pipeline.recorded`).
        `render_path`: fast | reference | verify (`render.spec.RENDER_PATHS`)."""

        self.dump = storage.location(dump if isinstance(dump, str) else Path(dump))
        self.stream = iter_sessions(
            self.dump, tokenizer=tokenizer, vocab_size=vocab_size, columns=columns, id_arrays=id_arrays
        )
        self.renderers = RendererPool(tokenizer, chat_template, renderer, tool_format, render_path)
        self.renderers.check(self.stream.file_metas)
        self.canonicalization, self.prompt_source = canonicalization, prompt_source

    def __iter__(self) -> Iterator[Session | QuarantineEntry]:
        """Raw sessions and quarantine entries, each session as soon as its last row is read."""
        return iter(self.stream)

    def prepare(self, session: Session) -> PreparedSession:
        renderer = self.renderers.for_session(session)
        return prepare_session(session, renderer, self.canonicalization, self.prompt_source)

    def prepared(self) -> Iterator[PreparedSession | QuarantineEntry]:
        """Prepared sessions in stream order; a session that cannot be prepared becomes a
        `replay_error` quarantine entry. Each session's render caches are dropped after it."""
        for item in self:
            if isinstance(item, QuarantineEntry):
                yield item
                continue
            try:
                prepared = self.prepare(item)
            except TraceToolsError as exc:
                yield QuarantineEntry(item.session_id, None, "replay_error", str(exc))
                continue
            yield prepared
            if prepared.renderer is not None and hasattr(prepared.renderer, "reset_caches"):
                prepared.renderer.reset_caches()

    def close(self) -> None:
        """Stop reading the dump (`SessionStream.close`); iterating afterwards yields nothing."""
        self.stream.close()

    def session(self, session_id: str) -> PreparedSession:
        """One session, prepared (the others are read past, not prepared). Reading stops there:
        the pipeline is closed afterwards."""
        try:
            return self._find(session_id)
        finally:
            self.close()

    def _find(self, session_id: str) -> PreparedSession:
        seen: dict[str, None] = {}
        for item in self:
            if item.session_id != session_id:
                if item.session_id is not None:
                    seen[item.session_id] = None
                continue
            if isinstance(item, QuarantineEntry):
                raise TraceToolsError(
                    f"session {session_id!r} is quarantined ({item.reason}: {item.detail}); "
                    f"run `trace-tools validate {self.dump}` for details"
                )
            return self.prepare(item)
        raise TraceToolsError(no_session_message(session_id, self.dump, list(seen)))


def no_session_message(session_id: str, dump: Any, ids: list[str]) -> str:
    """Name the closest id and a few others, so the user can pick one without another command."""

    close = difflib.get_close_matches(session_id, ids, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    listed = ", ".join(ids[:5]) + (f", … ({len(ids)} in all)" if len(ids) > 5 else "")
    return f"no session {session_id!r} in {dump}; {hint}its sessions: {listed or 'none'}"


def _template_arg(chat_template: str | None) -> str | None:
    """A template file is resolved to an absolute path, so workers and resumes find the same file."""
    if chat_template and Path(chat_template).is_file():
        return str(Path(chat_template).resolve())
    return chat_template
