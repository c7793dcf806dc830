"""`session-v1`: miles' linear TITO session server with one-step rollback
(docs/upstream_session.md#v1-the-linear-trajectory).

Each recorded request is served as the server would: rollback of at most one generation when the
request disagrees with the stored history, an append-only check under the configured matcher
(`strict`, `loose_tool_call`, `role_content_only`), the TITO prompt (checkpoint + boundary fix +
the appended messages' ids), then the RECORDED generation is committed in place of an engine
call. At the end the samples op assembles one sample. Refused requests store nothing and replay
continues with the next recorded request.
"""

from __future__ import annotations

from trace_tools.data import ReplayResult
from trace_tools.pipeline.prepared import PreparedSession
from trace_tools.strategies.base import Strategy
from trace_tools.strategies.declarations import SESSION_V1
from trace_tools.strategies.session_core.errors import AssemblyError
from trace_tools.strategies.session_core.matchers import resolve_matcher
from trace_tools.strategies.session_core.recording import record_outcomes, session_requests, tito_from_context
from trace_tools.strategies.session_core.v1 import assemble_v1, replay_v1


class SessionV1(Strategy):
    declaration = SESSION_V1

    def replay_session(self, prepared: PreparedSession) -> ReplayResult:
        session = prepared.session
        tito = tito_from_context(self.ctx, self.setting("tito_family"), self.upstream)
        state, outcomes = replay_v1(session_requests(prepared), tito, resolve_matcher(self.setting("matcher")))
        result = ReplayResult()
        record_outcomes(result, outcomes, {t.turn_index: t.prompt_ids for t in session.turns})
        _record_rollbacks(result, outcomes)
        try:
            result.samples = assemble_v1(
                state, tito.family.max_trim_tokens, self.setting("max_seq_len"), session.reward
            )
        except AssemblyError:
            result.counters["assembly_errors"] += 1
        return result


def _record_rollbacks(result: ReplayResult, outcomes: list) -> None:
    result.counters["rollbacks"] += 0
    result.counters["rollback_dropped_tokens"] += 0
    for outcome in outcomes:
        if outcome.rolled_back:
            result.counters["rollbacks"] += 1
            result.counters["rollback_dropped_tokens"] += outcome.dropped_tokens
        for index in outcome.rolled_back:
            result.turn_events[index] = "rolled_back"
