"""The built-in strategy classes, imported explicitly, by name, in column order
(docs/strategies.md#the-strategies)."""

from __future__ import annotations

from trace_tools.strategies.areal import ArealStrategy
from trace_tools.strategies.base import Strategy
from trace_tools.strategies.chains import ChainsStrategy
from trace_tools.strategies.checkpoint_tree import CheckpointTreeStrategy
from trace_tools.strategies.continuation import ContinuationStrategy
from trace_tools.strategies.echo_restore import EchoRestoreStrategy
from trace_tools.strategies.linear import LinearRestoreStrategy, LinearStrategy
from trace_tools.strategies.linear_chain import LinearChainStrategy
from trace_tools.strategies.message_graph import MessageGraphStrategy
from trace_tools.strategies.session_v1 import SessionV1
from trace_tools.strategies.session_v2 import SessionV2
from trace_tools.strategies.tree import TreeStrategy

CLASSES: tuple[type[Strategy], ...] = (
    TreeStrategy,
    EchoRestoreStrategy,
    LinearStrategy,
    LinearRestoreStrategy,
    ChainsStrategy,
    SessionV1,
    SessionV2,
    CheckpointTreeStrategy,
    ContinuationStrategy,
    LinearChainStrategy,
    MessageGraphStrategy,
    ArealStrategy,
)
BUILTIN: dict[str, type[Strategy]] = {cls.name: cls for cls in CLASSES}
