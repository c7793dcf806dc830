"""The `message-graph` strategy: verifiers v1's `Trace` graph, as prime-rl turns it into samples
(docs/strategies.md#message-graph; the graph itself is `message_graph_core`).

Each turn's request (the harness's messages as sent, its tools and the ids fed) and reply (the
served message and ids) are committed in arrival order; then every root-to-leaf branch that
trains a token becomes one sample with the session reward.
"""

from __future__ import annotations

from trace_tools.data import ReplayResult, Sample
from trace_tools.pipeline.prepared import PreparedSession, PreparedTurn
from trace_tools.strategies.base import Strategy
from trace_tools.strategies.declarations import MESSAGE_GRAPH
from trace_tools.strategies.helpers import read_only_list
from trace_tools.strategies.message_graph_core import MessageGraph, trainable_branches


class MessageGraphStrategy(Strategy):
    declaration = MESSAGE_GRAPH

    def replay_session(self, prepared: PreparedSession) -> ReplayResult:
        graph = MessageGraph()
        result = ReplayResult()
        for turn in prepared.turns:
            result.prompt_events[turn.turn.turn_index] = commit_turn(graph, turn)
        branches = trainable_branches(graph)
        result.counters["tree_branches"] = max(len(graph.leaves()) - 1, 0)
        result.samples = [
            Sample(
                b.token_ids,
                len(b.token_ids) - b.response_start,
                b.loss_mask[b.response_start :],
                b.logprobs[b.response_start :],
                b.source_turn,
                prepared.reward,
            )
            for b in branches
        ]
        return result


def commit_turn(graph: MessageGraph, prepared: PreparedTurn) -> str:
    """Commit one turn; its prompt event: a new root, a fork beside an existing node, or clean."""
    turn = prepared.turn
    reply = turn.response or prepared.response_message or {"role": "assistant", "content": None}
    done = graph.commit(
        turn.messages,
        turn.tools,
        read_only_list(prepared.prompt_ids),  # compared with node ids as lists
        reply,
        turn.output_ids,
        turn.output_logprobs or (),
        turn.turn_index,
    )
    if done.reused == 0:
        return "new_root"
    return "forked" if done.forked else "clean"
