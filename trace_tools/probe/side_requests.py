"""Side requests: what a harness asks the model besides the agent's own turns (docs/probe.md, "Side requests").

Clients send the model requests that are not steps of the session: a conversation title, a
"who speaks next" check, a background memory extractor or dream pass, a skill review. Each is
recognised here by the instruction the client itself writes (quoted from its bundle at the pinned
version), never by position or timing. The probe answers none of them with a scripted turn and
records none as one: `SideRequestModel` logs each (kind, session, the marker that matched) to
`side-requests.jsonl` and refuses it, so the dump holds only the agent's own turns.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from trace_tools.errors import TraceToolsError
from trace_tools.record.model import Generation, Request, ScriptedModel
from trace_tools.record.script import Script


@dataclass(frozen=True)
class SideMarker:
    kind: str
    client: str  # the client whose bundle holds the text (and its pinned version)
    where: str  # system | last_user: which message carries it
    text: str


MARKERS = (
    SideMarker("memory_extraction", "qwen-code 0.24.4", "system", "managed memory extraction subagent"),
    SideMarker("memory_dream", "qwen-code 0.24.4", "system", "You are performing a managed memory dream"),
    SideMarker("skill_review", "qwen-code 0.24.4", "system", "reviewing this conversation to extract reusable skills"),
    SideMarker("title", "qwen-code 0.24.4", "system", "Generate a concise, sentence-case title"),
    SideMarker("title", "opencode 1.18.33", "system", "You are a title generator"),
    # Gemini CLI 0.61.0's bundle holds the same prompt (Qwen Code is a fork of Gemini CLI)
    SideMarker("next_speaker", "qwen-code 0.24.4", "last_user", "who should logically speak next"),
)


class SideRequest(TraceToolsError):
    """A side request the probe declines (the recorder answers it with an error, records no turn)."""


def side_request_kind(messages: list[dict]) -> SideMarker | None:
    """The marker a request's OpenAI-form messages carry, if it is a side request."""
    system = "\n".join(_text(m) for m in messages if m.get("role") in ("system", "developer"))
    users = [m for m in messages if m.get("role") == "user"]
    last_user = _text(users[-1]) if users else ""
    for marker in MARKERS:
        if marker.text in (system if marker.where == "system" else last_user):
            return marker
    return None


def _text(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


class SideRequestModel(ScriptedModel):
    """The probe's scripted model: side requests are logged and declined before any script is
    chosen, so a session's script is built from its first real turn (the one that offers tools)."""

    def __init__(self, renderer: Any, scripts: Callable[[str, list[dict] | None], Script], log: Path):
        super().__init__(renderer, scripts)
        self.log = log
        self._lock = threading.Lock()

    def generate(self, request: Request) -> Generation:
        marker = side_request_kind(request.messages)
        if marker is None:
            return super().generate(request)
        entry = {"session": request.session, "kind": marker.kind, "client": marker.client, "marker": marker.text}
        with self._lock, self.log.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")
        raise SideRequest(f"side request ({marker.kind}) declined by the probe: it is not a turn of the session")


def side_request_counts(log: Path) -> dict[str, int]:
    """{kind: how many} from a probe's side-requests.jsonl (empty when the harness sent none)."""
    counts: dict[str, int] = {}
    if log.exists():
        for line in log.read_text(encoding="utf-8").splitlines():
            kind = json.loads(line)["kind"]
            counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items()))
