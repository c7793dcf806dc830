"""One training sample as a trainer consumed it, whatever framework wrote it.

Every reader of a post-manager dump (slime / miles `rollout_data/*.pt`, miles dashboards,
prime-rl token exports) yields `TrainerSample`s; everything that audits or scores them reads only
this record. Token-level lists follow slime's convention: `tokens` is prompt plus response,
`loss_mask`, `rollout_logprobs` and `trainer_logprobs` cover the response only (the last
`response_length` tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class TrainerSample:
    source: str  # file and position it came from, for messages (`rollout_3.pt#samples[17]`)
    tokens: list[int]  # prompt + response ids, as trained
    response_length: int  # the trailing tokens the loss mask covers
    loss_mask: list[int]  # one 0/1 per response token
    step: int | None = None  # rollout id / training step
    group_index: int | None = None  # the prompt group (GRPO group) the sample belongs to
    index: int | None = None  # the sample's index within its rollout step (slime's Sample.index)
    session_id: str | None = None  # the environment rollout (agent episode) it came from, when known
    rollout_logprobs: list[float] | None = None  # the inference engine's logprob per response token
    trainer_logprobs: list[float] | None = None  # the trainer's logprob per response token, when dumped
    reward: float | None = None
    status: str | None = None  # completed / truncated / aborted, as the framework names it
    metadata: dict[str, Any] = field(default_factory=dict)
    # Further per-response-token columns a source dumped, each one value per response token
    # (prime-rl: advantages, importance ratios, mask decisions); {} when the source has none.
    columns: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length
