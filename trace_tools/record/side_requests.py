"""Side requests: what a harness asks the model besides the agent's own turns (docs/probe.md, "Side requests").

Clients send the model requests that are not steps of the session: a conversation title, a
"who speaks next" check, a background memory extractor or dream pass, a skill review. Each is
recognised here by the instruction the client itself writes (quoted from its bundle at the pinned
version), never by position or timing. The recorder (`server.py`) classifies every request with
`side_request_kind` before any model sees it and records none as a turn: `record` answers each
with `side_answer` (a reply the client accepts), `probe` declines each with an error; both log it
to `requests.jsonl` (kind `side`, `side_request` naming which) and count it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from trace_tools.record.sink import read_requests

SIDE_TITLE = "Scripted session"


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
# Claude Code's title request is recognised by its shape instead (`anthropic.is_title_request`).
CLAUDE_TITLE = SideMarker("title", "claude-code", "system", "(no tools; the system prompt asks for a title)")
# What `record` answers: a title, the JSON the next-speaker check parses (the user speaks next, so
# the client waits for its user as it would after a real model's answer), else a plain text that
# ends a background pass without a tool call.
ANSWERS = {
    "title": SIDE_TITLE,
    "next_speaker": json.dumps({"reasoning": "The recorder answers side requests itself.", "next_speaker": "user"}),
}
NOTHING_TO_ADD = "Nothing to add."
POLICIES = ("answer", "decline")


def side_request_kind(messages: list[dict]) -> SideMarker | None:
    """The marker a request's OpenAI-form messages carry, if it is a side request."""
    system = "\n".join(_text(m) for m in messages if m.get("role") in ("system", "developer"))
    users = [m for m in messages if m.get("role") == "user"]
    last_user = _text(users[-1]) if users else ""
    for marker in MARKERS:
        if marker.text in (system if marker.where == "system" else last_user):
            return marker
    return None


def side_answer(kind: str) -> str:
    return ANSWERS.get(kind, NOTHING_TO_ADD)


def _text(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def side_request_counts(log: Path) -> dict[str, int]:
    """{kind: how many} from a recording's requests.jsonl (empty when the harness sent none)."""
    counts: dict[str, int] = {}
    if log.exists():
        for entry in read_requests(log):
            if entry.get("kind") == "side":
                kind = entry["side_request"]
                counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items()))
