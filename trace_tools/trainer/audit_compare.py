"""Are the trainer's samples what a strategy makes of the same run's per-call dump?

The strategy (`tree` by default: slime's manager) is replayed on the per-call dump through the
replay library (`replay.executors.run_sessions`, the engine `trace-tools replay` runs), one session
at a time. Its samples are matched with the trainer's by session id and order within the session
(the n-th sample of a session with the n-th), and compared token by token: the ids, the response
length, the loss mask. The first difference is shown with the tokens around it. Tools' generated
tokens are the per-call dump's (the coverage the audit reports against them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from trace_tools.ids import array_prefix

_AROUND = 6  # tokens shown on each side of a first difference


def compare_with_strategy(
    audit: Any, calls: str | Path, strategy: str, tokenizer: str | None, chat_template: str | None
) -> dict[str, Any]:
    from trace_tools.data import Session
    from trace_tools.io.load import iter_sessions
    from trace_tools.replay.executors import run_sessions
    from trace_tools.replay.session import ReplayOptions

    options = ReplayOptions(strategies=[strategy], tokenizer=tokenizer, chat_template=chat_template)
    stream = iter_sessions(calls, tokenizer=tokenizer, chat_template=chat_template)
    result = _Comparison(strategy, audit)
    for rows in run_sessions((s for s in stream if isinstance(s, Session)), options, workers=1):
        result.add_turns(rows.turns)
        table = rows.samples_table()
        if table is not None:
            result.add_session(sorted(table.to_pylist(), key=lambda row: row["sample_index"]))
    return result.to_dict()


class _Comparison:
    def __init__(self, strategy: str, audit: Any):
        self.strategy, self.audit = strategy, audit
        self.counts = dict.fromkeys(("sessions", "strategy_samples", "equal", "differ", "missing"), 0)
        self.expected: dict[str, int] = {}  # samples the strategy made, per session
        self.first: dict[str, Any] | None = None
        self.generated_by_tool: dict[str, dict[str, int]] = {}

    def add_turns(self, turns: list[dict[str, Any]]) -> None:
        for turn in turns:
            entry = self.generated_by_tool.setdefault(str(turn["tool"]), {"turns": 0, "generated_tokens": 0})
            entry["turns"] += 1
            entry["generated_tokens"] += int(turn["generated_tokens"])

    def add_session(self, expected: list[dict[str, Any]]) -> None:
        session_id = expected[0]["session_id"]
        self.counts["sessions"] += 1
        self.counts["strategy_samples"] += len(expected)
        session = self.audit.sessions.get(session_id)
        given = session.views if session is not None else []
        self.expected[session_id] = len(expected)
        for position, row in enumerate(expected):
            if position >= len(given):
                self.counts["missing"] += 1
                self._note_first(session_id, position, f"the trainer has no sample {position} of session {session_id}")
                continue
            difference = self._difference(row, given[position])
            self.counts["differ" if difference else "equal"] += 1
            if difference:
                self._note_first(session_id, position, difference)

    def _difference(self, row: dict[str, Any], view: Any) -> str | None:
        expected = np.asarray(row["token_ids"], dtype=np.int64)
        source = view.source
        if len(expected) != len(view.tokens) or not np.array_equal(expected, view.tokens):
            at = array_prefix(expected, view.tokens)
            return f"{source}: token {at}: {self._around(expected, at)} expected, {self._around(view.tokens, at)} given"
        if row["response_length"] != view.response_length:
            return f"{source}: response_length {view.response_length}, {row['response_length']} expected"
        mask = np.zeros(len(expected), dtype=bool)
        mask[len(expected) - row["response_length"] :] = np.asarray(row["loss_mask"], dtype=bool)
        differ = np.flatnonzero(mask != view.trained)
        if len(differ):
            at = int(differ[0])
            trained = "trained" if view.trained[at] else "not trained"
            return f"{source}: loss mask at token {at} ({self._around(expected, at)}): {trained}, the strategy's is not"
        return None

    def _around(self, tokens: np.ndarray, at: int) -> str:
        window = tokens[max(at - _AROUND, 0) : at + _AROUND].tolist()
        return repr(self.audit.markers.decode(window)) if window else "(end)"

    def _note_first(self, session_id: str, position: int, text: str) -> None:
        if self.first is None:
            self.first = {"session_id": session_id, "sample": position, "text": text}

    def to_dict(self) -> dict[str, Any]:
        surplus = {key: len(s.views) - self.expected.get(key, 0) for key, s in self.audit.sessions.items()}
        extra = sum(n for n in surplus.values() if n > 0)
        c = self.counts
        equal = not (c["differ"] or c["missing"] or extra) and c["strategy_samples"] > 0
        if not any(key in self.audit.sessions for key in self.expected):
            self.first = {
                "session_id": None,
                "sample": None,
                "text": "no session of the trainer's samples is in the per-call dump: samples are matched by "
                "session id, so the trainer's samples must carry the per-call dump's session ids",
            }
        if self.first is None and extra:
            key = next(k for k, n in surplus.items() if n > 0)
            self.first = {
                "session_id": key,
                "sample": self.expected.get(key, 0),
                "text": f"session {key}: "
                "the trainer has samples the strategy does not make (or a session the dump lacks)",
            }
        return {
            "strategy": self.strategy,
            "equal": equal,
            "sessions": c["sessions"],
            "strategy_samples": c["strategy_samples"],
            "equal_samples": c["equal"],
            "differing_samples": c["differ"],
            "missing_samples": c["missing"],
            "extra_samples": extra,
            "first_difference": self.first,
            "generated_by_tool": dict(sorted(self.generated_by_tool.items())),
        }
