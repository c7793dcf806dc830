"""The data model shared by every layer: recorded turns and sessions in, replay results out.

Nothing here does work; it only names things. Token ids are plain Python lists of ints.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# The `trace_tools.harness` of a dump that `trace-tools simulate` wrote: its logprobs are seeded, not sampled.
SIMULATED_HARNESS = "trace-tools simulate"


@dataclass(slots=True)
class DumpMeta:
    """File-level `trace_tools.*` metadata of a dump (command-line options override it)."""

    schema_version: str | None = None
    tokenizer: str | None = None
    chat_template: str | None = None
    history_mode: str | None = None
    harness: str | None = None
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Turn:
    """One generation call of a session (one row of trace schema v1), JSON columns parsed."""

    session_id: str
    turn_index: int
    messages: list[dict[str, Any]]
    output_ids: list[int]
    tools: list[dict[str, Any]] | None = None
    output_logprobs: list[float] | None = None
    prompt_ids: list[int] | None = None
    response: dict[str, Any] | None = None
    finish_reason: str | None = None
    request_id: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reward: float | None = None
    metadata: dict[str, Any] | None = None
    step: int | None = None  # the rollout / training step the call belongs to, when the source has one
    weight_version: str | None = None  # the policy weights that served the call, when recorded

    @property
    def generated_tokens(self) -> int:
        return len(self.output_ids)


@dataclass(slots=True)
class Session:
    """One agent episode: its turns ordered by `turn_index`."""

    session_id: str
    turns: list[Turn]
    meta: DumpMeta = field(default_factory=DumpMeta)

    @property
    def step(self) -> int | None:
        """The session's step (docs/trace_schema.md#columns): that of its first turn that has one."""
        return next((turn.step for turn in self.turns if turn.step is not None), None)

    @property
    def reward(self) -> float:
        """The session reward: the last non-null value on its rows (docs/trace_schema.md#columns), else 0.0."""
        for turn in reversed(self.turns):
            if turn.reward is not None:
                return float(turn.reward)
        return 0.0


def behaviour_label(behaviours: Any) -> str:
    """Simulator behaviour labels of a session as one string (e.g. `claude-code+retry`): the
    sessions table's `behaviour` column, written by replay and grouped on by compare."""
    names = [str(b) for b in list(behaviours if behaviours is not None else []) if b]
    return "+".join(sorted(names)) or "unlabelled"


@dataclass(slots=True)
class QuarantineEntry:
    """Why a session (or a file) was set aside. `reason` is one of the fixed vocabulary of
    docs/trace_schema.md#loading-validation-and-quarantine."""

    session_id: str | None
    turn_index: int | None
    reason: str
    detail: str


@dataclass(slots=True)
class Sample:
    """One training sample in slime's layout (docs/run_directory.md#what-the-files-hold).

    `token_ids` is the full sequence; `loss_mask` and `logprobs` cover the last `response_length`
    tokens; `source_turn` has one entry per token of `token_ids`: the `turn_index` whose generated
    output this token is, or -1 for context (prompt, glue, tool results, re-rendered history).
    """

    token_ids: list[int]
    response_length: int
    loss_mask: list[int]
    logprobs: list[float]
    source_turn: list[int]
    reward: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)


# Fixed vocabularies (docs/metrics.md#per-turn).
TURN_EVENTS = (
    "trained",
    "partly_trained",
    "zeroed_by_realign",
    "demoted_by_merge",
    "rolled_back",
    "trimmed",
    "rejected",
    "failed",
    "untrained",
)
COUNTERS = (
    "drift_clean",
    "drift_realign",
    "drift_fork",
    "tree_branches",
    "rewrite_merges",
    "restored_echoes",
    "unrecognized_echoes",
    "healed_turns",
    "healed_prefix_tokens",
    "nonlinear",
    "nonlinear_history",
    "nonlinear_template",
    "close_unresolved",
    "resets",
    "chains_created",
    "rollbacks",
    "rollback_dropped_tokens",
    "rejected_requests",
    "server_errors",
    "trimmed_leaves",
)


@dataclass(slots=True)
class ReplayResult:
    """What one strategy made of one session.

    `turn_events` records only what the strategy knows beyond provenance (e.g. `zeroed_by_realign`,
    `demoted_by_merge`, `rolled_back`, `trimmed`, `rejected`, `failed`); the engine derives
    `trained` / `partly_trained` / `untrained` from the samples' loss masks and provenance.
    `prompt_events` says how each turn's prompt was obtained (`clean`, `forked`, `realigned`,
    `restored`, `healed`, `reset`, `rendered`, `new_chain`, `new_root`, ...).
    """

    samples: list[Sample] = field(default_factory=list)
    turn_events: dict[int, str] = field(default_factory=dict)
    prompt_events: dict[int, str] = field(default_factory=dict)
    counters: Counter = field(default_factory=Counter)
    # Where drift starts, per drifted turn: {turn_index: token position of first divergence}.
    drift_positions: dict[int, int] = field(default_factory=dict)
    # Why the reproduced upstream system answered a request with an error (turns `failed` or
    # `rejected`): {turn_index: reason}, worded to be counted and shown as is.
    failures: dict[int, str] = field(default_factory=dict)
