"""Which sequences to run so that every comparable turn's output tokens get scored (no torch here).

A turn is scored as the sequence `prompt_ids + output_ids`; its output token j sits at position
`len(prompt_ids) + j` and is predicted from everything before it. In a causal model that
logprob depends only on the prefix, so when one turn's sequence is a prefix of another's -- the
append-only case: turn k+1's prompt starts with turn k's prompt and output -- the longer
sequence carries the shorter one's logprobs too. `share_prefixes` therefore runs each session's
sequences longest first and lets every later turn whose sequence is a prefix of an already
planned one read its span from it. Branching sessions (trees) share along each branch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

# Why a turn cannot be compared (each is counted in summary.json).
NO_LOGPROBS = "no_logprobs"
LOGPROBS_LENGTH = "logprobs_length"
EMPTY_OUTPUT = "empty_output"
EMPTY_PROMPT = "empty_prompt"
NO_PROMPT = "prompt_unavailable"
OUT_OF_MODEL_VOCAB = "out_of_model_vocab"


@dataclass(slots=True)
class TurnInput:
    """One turn as the scorer sees it. `skip_reason` is set when it cannot be compared."""

    session_id: str
    turn_index: int
    output_ids: list[int]
    recorded: list[float] | None
    prompt_ids: list[int] | None
    prompt_origin: str | None = None  # "recorded" | "rendered" | None
    skip_reason: str | None = None
    detail: str | None = None

    @property
    def sequence(self) -> list[int]:
        return [*(self.prompt_ids or []), *self.output_ids]


def logprob_problem(output_ids: Sequence[int], recorded: Sequence[float] | None) -> str | None:
    """Why the recorded logprobs cannot be compared with the output, or None."""
    if recorded is None:
        return NO_LOGPROBS
    if len(recorded) != len(output_ids):
        return LOGPROBS_LENGTH
    return None


def sequence_problem(prompt_ids: Sequence[int] | None, output_ids: Sequence[int], vocab_size: int) -> str | None:
    """Why `prompt_ids + output_ids` cannot be scored on a model with `vocab_size` rows, or None."""
    if not output_ids:
        return EMPTY_OUTPUT
    if prompt_ids is None:
        return NO_PROMPT
    if not prompt_ids:
        return EMPTY_PROMPT  # the first output token would have no context to be predicted from
    if max(max(prompt_ids), max(output_ids)) >= vocab_size or min(min(prompt_ids), min(output_ids)) < 0:
        return OUT_OF_MODEL_VOCAB
    return None


@dataclass
class SequencePlan:
    """One sequence to score and the turns that read their output span from it."""

    ids: list[int]
    # (index into the turn list, start position of the turn's output, output length)
    spans: list[tuple[int, int, int]] = field(default_factory=list)

    def positions(self) -> np.ndarray:
        """Sorted unique positions to score: the union of the turns' output spans."""
        covered = np.zeros(len(self.ids), dtype=bool)
        for _, start, length in self.spans:
            covered[start : start + length] = True
        return np.flatnonzero(covered)


def plan_sequences(turns: Sequence[TurnInput], share_prefix: bool = True) -> list[SequencePlan]:
    """Sequences covering every comparable turn; turns of one session share prefixes when allowed.

    Turns are grouped by `session_id` (sharing never crosses sessions: their turns are unrelated
    even when their text agrees).
    """
    by_session: dict[str, list[int]] = {}
    for index, turn in enumerate(turns):
        if turn.skip_reason is None:
            by_session.setdefault(turn.session_id, []).append(index)
    plans: list[SequencePlan] = []
    for indices in by_session.values():
        plans.extend(_session_plans(turns, indices, share_prefix))
    return plans


def _session_plans(turns: Sequence[TurnInput], indices: list[int], share_prefix: bool) -> list[SequencePlan]:
    sequences = {index: turns[index].sequence for index in indices}
    plans: list[SequencePlan] = []
    for index in sorted(indices, key=lambda i: -len(sequences[i])):
        sequence, start = sequences[index], len(turns[index].prompt_ids or [])
        span = (index, start, len(turns[index].output_ids))
        host = _host(plans, sequence) if share_prefix else None
        if host is None:
            host = SequencePlan(sequence)
            plans.append(host)
        host.spans.append(span)
    return plans


def _host(plans: list[SequencePlan], sequence: list[int]) -> SequencePlan | None:
    """The first planned sequence that `sequence` is a prefix of."""
    for plan in plans:
        if len(plan.ids) >= len(sequence) and plan.ids[: len(sequence)] == sequence:
            return plan
    return None


def read_spans(plans: Sequence[SequencePlan], scored: Sequence[np.ndarray], n_turns: int) -> list[np.ndarray | None]:
    """Per turn (by index into the turn list): the recomputed logprobs of its output tokens."""
    per_turn: list[np.ndarray | None] = [None] * n_turns
    for plan, values in zip(plans, scored):
        positions = plan.positions()
        for index, start, length in plan.spans:
            at = np.searchsorted(positions, start)
            per_turn[index] = values[at : at + length]
    return per_turn
