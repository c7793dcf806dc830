"""`session-v2`: miles' trajectory forest (docs/upstream_session.md#v2-the-trajectory-forest, HEAD behaviour).

Every request attaches to the node whose whole path it repeats and consumes the most messages
(none: a new root); the recorded generation becomes a child there. The samples op merges each
leaf's path into one sample, trims leaves that a later sibling retried (`drop_retries`) and
masks every shared completion so it trains in exactly one sample (`default_postprocess`).
"""

from __future__ import annotations

from trace_tools.data import ReplayResult
from trace_tools.pipeline.prepared import PreparedSession
from trace_tools.strategies.base import Strategy
from trace_tools.strategies.declarations import SESSION_V2
from trace_tools.strategies.helpers import release_tree
from trace_tools.strategies.session_core.errors import AssemblyError
from trace_tools.strategies.session_core.matchers import resolve_matcher
from trace_tools.strategies.session_core.recording import record_outcomes, session_requests, tito_from_context
from trace_tools.strategies.session_core.records import TurnOutcome
from trace_tools.strategies.session_core.tito import TitoTokenizer
from trace_tools.strategies.session_core.v2 import LeafSample, SessionForest, replay_v2, samples_v2


class SessionV2(Strategy):
    declaration = SESSION_V2

    def replay_session(self, prepared: PreparedSession) -> ReplayResult:
        tito = tito_from_context(self.ctx, self.setting("tito_family"), self.upstream)
        state, outcomes = replay_v2(session_requests(prepared), tito, resolve_matcher(self.setting("matcher")))
        try:
            return self._result(prepared, state, outcomes, tito)
        finally:
            release_tree(state.tree.roots)

    def _result(
        self, prepared: PreparedSession, state: SessionForest, outcomes: list[TurnOutcome], tito: TitoTokenizer
    ) -> ReplayResult:
        session = prepared.session
        result = ReplayResult()
        record_outcomes(result, outcomes, {t.turn_index: t.prompt_ids for t in session.turns})
        result.counters["tree_branches"] += state.tree.branches
        try:
            kept, trimmed = samples_v2(
                state.tree, tito.family.max_trim_tokens, self.setting("max_seq_len"), session.reward
            )
        except AssemblyError:
            result.counters["assembly_errors"] += 1
            return result
        result.samples = [item.sample for item in kept]
        _record_trims(result, kept, trimmed)
        return result


def _record_trims(result: ReplayResult, kept: list[LeafSample], trimmed: list[LeafSample]) -> None:
    """A trimmed leaf loses the generations that no surviving path carries."""
    result.counters["trimmed_leaves"] += len(trimmed)
    surviving = {node.seq for item in kept for node in item.path}
    for item in trimmed:
        for node in item.path:
            if node.seq not in surviving:
                result.turn_events[node.record.turn_index] = "trimmed"
