"""One trainer sample checked and measured against the earlier samples of its session.

Samples of one session (one environment rollout) share context: a later sample repeats a prefix
of an earlier one. Positions are compared through that prefix: position `p` of sample B is the
same token as position `p` of an earlier sample A exactly when `p` is inside their longest common
prefix. Hence the definitions (docs/trainer_dumps.md#audit-samples):

* re-emitted tokens of a sample: the longest common prefix it shares with any earlier sample of
  its session (tokens the trainer is given again); a session's `one_sample_tokens` is its forwarded
  tokens less its re-emitted ones, the tokens of its samples with shared prefixes counted once (one
  sample's length when the samples are prefixes of one trajectory);
* a token trained twice: a trained position of B inside the common prefix of an earlier sample A
  that trained it too;
* an assistant turn is identified by its stop token's position in the first sample that holds it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trace_tools.ids import array_prefix
from trace_tools.trainer.audit_rules import Tally
from trace_tools.trainer.audit_tokens import Region, TokenMarkers, spans
from trace_tools.trainer.records import TrainerSample


class BadSample(Exception):
    """A sample the audit sets aside: `reason` names the problem, the message says what it was."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


@dataclass
class SampleView:
    """A checked sample: its ids, which of them are trained (full length), and where it came from."""

    source: str
    session: str
    step: int | None
    tokens: np.ndarray
    trained: np.ndarray
    response_length: int


def session_key(sample: TrainerSample) -> str:
    """The environment rollout a sample belongs to: its session id, else its place in the dump
    (each such sample is a session of its own)."""
    if sample.session_id:
        return str(sample.session_id)
    parts = [
        f"{name}{value}" for name, value in (("step", sample.step), ("group", sample.group_index)) if value is not None
    ]
    place = f"index{sample.index}" if sample.index is not None else sample.source
    return "/".join([*parts, place])


def check_sample(sample: TrainerSample, vocab_size: int | None) -> SampleView:
    """The sample as arrays, or `BadSample` for one whose lists disagree or hold what no tokenizer has."""
    tokens = _int_array(sample.tokens, "tokens", "bad_tokens")
    length = sample.response_length
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or not 0 <= length <= len(tokens):
        raise BadSample("bad_response_length", f"response_length {length!r} is not within 0..{len(tokens)} tokens")
    mask = _int_array(sample.loss_mask, "loss_mask", "bad_loss_mask", kinds="iub")
    if len(mask) != length:
        raise BadSample("mask_length_mismatch", f"loss_mask has {len(mask)} values for a {length}-token response")
    if len(mask) and not np.isin(mask, (0, 1)).all():
        raise BadSample("bad_loss_mask", f"loss_mask holds {sorted(set(mask.tolist()) - {0, 1})[:3]}, not only 0/1")
    if len(tokens) and (tokens.min() < 0 or (vocab_size and tokens.max() >= vocab_size)):
        bad = int(tokens.min()) if tokens.min() < 0 else int(tokens.max())
        raise BadSample("out_of_vocab", f"token id {bad} is outside the tokenizer's 0..{vocab_size} ids")
    trained = np.zeros(len(tokens), dtype=bool)
    trained[len(tokens) - length :] = mask.astype(bool)
    return SampleView(sample.source, session_key(sample), sample.step, tokens, trained, int(length))


def _int_array(values: Any, name: str, reason: str, kinds: str = "iu") -> np.ndarray:
    """`values` as int64, or `BadSample` naming what they hold instead (`kinds`: numpy kinds taken)."""
    try:
        raw = np.asarray(values if values is not None else [])
    except (TypeError, ValueError):
        raise BadSample(reason, f"{name} is not a list of integers") from None
    if raw.ndim != 1 or (len(raw) and raw.dtype.kind not in kinds):
        kind = "nested lists" if raw.ndim != 1 else f"{raw.dtype.name} values"
        raise BadSample(reason, f"{name} holds {kind}, not integers")
    return raw.astype(np.int64)


def logprobs_cover(sample: TrainerSample) -> bool:
    """True when the rollout logprobs (if any) give one finite number per response token."""
    logprobs = sample.rollout_logprobs
    if logprobs is None:
        return True
    try:
        return len(logprobs) == sample.response_length and all(math.isfinite(float(x)) for x in logprobs)
    except (TypeError, ValueError):
        return False


@dataclass
class Span:
    """A trained span: the run of trained positions one assistant output leaves in a sample."""

    session: str
    step: int | None
    sample: int  # the sample's position within its session
    start: int
    tokens: int
    tool: str
    tool_names: list[str]


@dataclass
class SampleStats:
    forwarded: int
    trained: int
    reemitted: int
    spans: list[Span] = field(default_factory=list)


@dataclass
class _Turn:
    stop_trained: int = 0
    output_trained: bool = False
    example: str = ""


class SessionAudit:
    """The samples of one session so far, and the turns they hold."""

    def __init__(self, key: str, markers: TokenMarkers, tally: Tally):
        self.key, self.markers, self.tally = key, markers, tally
        self.views: list[SampleView] = []
        self.turns: dict[tuple[int, int], _Turn] = {}

    def add(self, view: SampleView) -> SampleStats:
        prefixes = [array_prefix(earlier.tokens, view.tokens) for earlier in self.views]
        self._trained_once(view, prefixes)
        stats = SampleStats(len(view.tokens), int(view.trained.sum()), max(prefixes, default=0))
        self._regions(view, prefixes)
        stats.spans = self._spans(view)
        self.views.append(view)
        return stats

    def _trained_once(self, view: SampleView, prefixes: list[int]) -> None:
        seen = np.zeros(len(view.tokens), dtype=bool)
        for earlier, shared in zip(self.views, prefixes):
            seen[:shared] |= earlier.trained[:shared]
        twice = np.flatnonzero(view.trained & seen)
        example = f"{view.source}: {len(twice)} tokens from position {twice[0]} on" if len(twice) else None
        self.tally.rule("trained_once", int(view.trained.sum()), len(twice), example)

    def _regions(self, view: SampleView, prefixes: list[int]) -> None:
        header = np.zeros(len(view.tokens), dtype=bool)
        output = np.zeros(len(view.tokens), dtype=bool)
        for region in self.markers.regions(view.tokens):
            header[region.header : region.start] = True
            output[region.start : region.end] = True
            self._turn(view, prefixes, region)
        self._count_trained("role_header_untrained", view, header)
        self._count_trained("context_untrained", view, ~(header | output))

    def _count_trained(self, rule: str, view: SampleView, where: np.ndarray) -> None:
        hits = np.flatnonzero(view.trained & where)
        example = None
        if len(hits):
            text = self.markers.decode(view.tokens[hits[0] : hits[0] + 8].tolist())
            example = f"{view.source}: {len(hits)} tokens, first at {hits[0]}: {text!r}"
        self.tally.rule(rule, int(where.sum()), len(hits), example)

    def _turn(self, view: SampleView, prefixes: list[int], region: Region) -> None:
        trained = view.trained[region.start : region.end]
        if region.stop is None:
            if trained.any():
                self.tally.note("truncated_turns", 1, f"{view.source}: turn at {region.start}")
            return
        owner = next((i for i, shared in enumerate(prefixes) if shared > region.stop), len(self.views))
        turn = self.turns.setdefault((owner, region.stop), _Turn(example=f"{view.source}: turn at {region.start}"))
        turn.stop_trained += int(view.trained[region.stop])
        turn.output_trained |= bool(trained.any())
        if self.markers.starts_with_empty_reasoning(view.tokens, region):
            inserted = view.trained[region.start : region.start + len(self.markers.empty_reasoning)]
            example = f"{view.source}: turn at {region.start}" if inserted.any() else None
            self.tally.rule("empty_reasoning_untrained", 1, int(inserted.any()), example)

    def _spans(self, view: SampleView) -> list[Span]:
        found = []
        for start, end in spans(view.trained):
            ids = view.tokens[start:end].tolist()
            tool, names, ill_formed = self.markers.parse(ids)
            if self.markers.is_stop(ids[-1]):  # a span cut off before its stop token is a truncated turn
                example = f"{view.source}: span at {start}: {self.markers.decode(ids[:24])!r}" if ill_formed else None
                self.tally.rule("spans_parse", 1, int(ill_formed), example)
            found.append(Span(self.key, view.step, len(self.views), start, end - start, tool, names))
        return found

    def close(self) -> None:
        """Count each turn of the session against the stop-token rule, once all its samples are in."""
        for turn in self.turns.values():
            if not turn.output_trained and not turn.stop_trained:
                self.tally.note("untrained_turns", 1, turn.example)
                continue
            bad = turn.stop_trained != 1
            example = f"{turn.example}: stop token trained {turn.stop_trained} times" if bad else None
            self.tally.rule("stop_token_trained_once", 1, int(bad), example)
