"""The `linear-chain` strategy: TRL's AsyncGRPO "message mode" reconciler (docs/strategies.md#linear-chain).

TRL re-tokenizes the whole conversation every turn and reconciles the turns of one conversation,
in the order they were generated, into training rows: a prompt that extends the held tokens is
CLEAN, a drift inside the last answer smaller than `fork_threshold_tokens` (counted in held
tokens invalidated) is REALIGNed from the divergence point, anything else FORKs a new row; rows
with no trained token are dropped. That is slime's tree linearization with TRL's gate and start
(`tree_core`), on a single chain: no message tree, so no routing, no rewrite-merge and no
per-node dedup. `strict` is the CLEAN/FORK-only variant (any drift forks).
"""

from __future__ import annotations

from typing import Any

from trace_tools.strategies.declarations import LINEAR_CHAIN
from trace_tools.strategies.tree import TreeStrategy, turn_record
from trace_tools.strategies.tree_core import TrajectoryManager


class LinearChainStrategy(TreeStrategy):
    declaration = LINEAR_CHAIN

    def make_manager(self) -> TrajectoryManager:
        threshold = 0 if self.setting("strict") else self.setting("fork_threshold")
        return TrajectoryManager(fork_threshold=threshold, realign_gate="drift", realign_from="divergence")

    def record_prepared(self, manager: TrajectoryManager, session_id: str, prepared: Any) -> None:
        self.check_prompt(prepared)
        manager.append_to_chain(
            session_id,
            turn=turn_record(prepared),
            response_message=prepared.response_message,
            metadata={"sid": session_id},
            source=prepared.turn.turn_index,
        )
