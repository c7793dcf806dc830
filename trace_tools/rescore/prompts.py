"""Where a rescored turn's prompt ids come from: the recorded ones, else a render of its messages."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from trace_tools.data import Session, Turn
from trace_tools.errors import TraceToolsError


class PromptSource:
    """Prompt ids per turn: recorded when present, else rendered with the session's own renderer
    (the pipeline's `RendererPool`: options, then the session's file metadata, then the model's
    tokenizer), built on first need.

    A renderer that cannot be built (no tokenizer or template known) makes every unrecorded
    prompt of its sessions `prompt_unavailable`, with the reason in the turn's `detail`.
    """

    def __init__(
        self, tokenizer: str | None, chat_template: str | None, default_tokenizer: str | None, canonicalization: str
    ):
        from trace_tools.pipeline import RendererPool

        self.pool = RendererPool(tokenizer or None, chat_template)
        self.tokenizer, self.default_tokenizer, self.canonicalization = tokenizer, default_tokenizer, canonicalization
        self._used: Any = None
        self._translators: dict[str, Any] = {}

    def renderer(self, session: Session) -> Any:
        if not (self.tokenizer or session.meta.tokenizer) and self.default_tokenizer:
            from dataclasses import replace

            session = Session(
                session.session_id, session.turns, replace(session.meta, tokenizer=self.default_tokenizer)
            )
        renderer = self.pool.for_session(session)
        if renderer is None:
            raise TraceToolsError("no tokenizer: the dump names none; pass --tokenizer")
        self._used = self._used or renderer
        return renderer

    def prompt(self, turn: Turn, session: Session) -> tuple[list[int] | None, str | None, str | None]:
        """(ids, origin, problem): origin is `recorded` or `rendered`; problem explains a None."""
        if turn.prompt_ids is not None:
            return list(turn.prompt_ids), "recorded", None
        if not turn.messages:
            return None, None, "no prompt_ids recorded and no messages to render"
        from trace_tools.pipeline.prepared import Canonicalizer, render_prompt

        translate = self._translators.setdefault(session.session_id, Canonicalizer(self.canonicalization))
        try:
            return (
                render_prompt(self.renderer(session), translate.messages(turn.messages), turn.tools or None, turn),
                "rendered",
                None,
            )
        except TraceToolsError as exc:
            return None, None, str(exc)

    def identity(self) -> Any:
        return dict(getattr(self._used, "identity", {}) or {}) if self._used is not None else None

    def decoder(self) -> Callable[[Sequence[int]], str] | None:
        """A decode function for flagged contexts: a renderer's, else the tokenizer's, else None."""
        if self._used is not None:
            return self._used.decode
        name = self.tokenizer or self.default_tokenizer
        if not name:
            return None
        from trace_tools.render.tokenizer import load_tokenizer

        try:
            return load_tokenizer(name).decode
        except TraceToolsError:
            return None
