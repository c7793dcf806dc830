"""slime's `TrajectoryManager`, reproduced exactly: a message tree turned into training samples.

Two layers, as upstream (docs/upstream_tree.md#the-two-layers):

* `record_turn` routes each turn into a per-session **message tree** by dict equality of the
  prompt messages (first matching child wins), optionally absorbing a short rewritten assistant
  echo (the *rewrite-merge*), and hangs the generated assistant under the mount point.
* `get_trajectory` linearizes every root-to-leaf path into samples by **token prefix**: a turn
  whose prompt extends the held tokens is CLEAN, one that drifts inside the last response may be
  REALIGNed (the drifted span becomes context), anything else FORKs a new sample. A generated
  node is trained only in the first sample that reaches it (left-to-right DFS order).

Parameters cover the three upstream variants:

* slime (default): `fork_threshold=1024`, REALIGN gated on the incoming turn's output length and
  rewriting from the start of the last response.
* TRL's reconciler: `realign_gate="drift"` (gate on the number of held tokens invalidated) and
  `realign_from="divergence"` (rewrite from the longest common prefix, so the matching head of the
  last answer stays trained).
* agentcore after PR #149: `fork_threshold <= 0` (CLEAN/FORK only, no rewrite-merge).

Beyond upstream, every token carries provenance (the producing turn's `source`, -1 for context),
and the manager keeps per-session counters and per-turn events (`pop_stats`). Upstream's unsafe
edge cases (truncation below the first prompt, a bare `assert` on logprob length) are guarded by
default; `safe_edges=False` reproduces them. docs/upstream_tree.md lists every deviation.

Pure and deterministic: no tokenizer, no torch.
"""

from __future__ import annotations

import enum
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from trace_tools.data import COUNTERS, Sample
from trace_tools.errors import ReplayError, UnknownName
from trace_tools.ids import common_prefix_len as _list_prefix_len
from trace_tools.strategies.declarations import DEFAULT_FORK_THRESHOLD, REALIGN_GATES, REALIGN_STARTS

log = logging.getLogger(__name__)

COMPLETED = "completed"


class LogprobsLengthMismatch(ReplayError, ValueError):
    """A turn's `output_log_probs` is neither empty nor one entry per output token."""


class SampleLayoutError(ReplayError, ValueError):
    """A sample whose parallel lists disagree in length (agentcore's TraceRecord checks)."""


class DriftKind(enum.Enum):
    CLEAN = "clean"  # the held tokens are a prefix of the new prompt
    REALIGN = "realign"  # drift inside the last response, small enough: overwrite it as context
    FORK = "fork"  # anything else: start a new sample


@dataclass(frozen=True, slots=True)
class Drift:
    """One classification: the outcome, the longest common prefix, and how many held tokens it invalidates."""

    kind: DriftKind
    lcp: int
    size: int


@dataclass(frozen=True)
class TurnRecord:
    """One generate call as the engine saw it (slime's `TurnRecord`)."""

    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    finish_reason: str = "stop"
    output_log_probs: Sequence[float] = ()
    ill_formed: bool = False


@dataclass
class BaseSample:
    """The per-episode identity every emitted sample copies (slime's base `Sample`, agentcore's `BaseTrace`)."""

    index: int = 0
    group_index: int = 0
    rollout_id: Any = None
    prompt: Any = None
    label: Any = None


@dataclass
class TreeSample:
    """One emitted sample in slime's layout, plus provenance.

    `token_ids` is the full sequence (first prompt included); `loss_mask` and `logprobs` cover the
    last `response_length` tokens; `source_turn` has one entry per token of `token_ids`.
    """

    token_ids: list[int]
    response_length: int
    loss_mask: list[int]
    logprobs: list[float]
    source_turn: list[int]
    reward: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)
    index: int = 0
    group_index: int = 0
    rollout_id: Any = None
    prompt: Any = None
    label: Any = None
    status: str = COMPLETED
    response: str = ""

    def __post_init__(self) -> None:
        if len(self.loss_mask) > len(self.token_ids):
            raise SampleLayoutError(
                f"loss_mask has {len(self.loss_mask)} entries but token_ids has only "
                f"{len(self.token_ids)}; the mask must cover a suffix of the tokens"
            )
        if len(self.logprobs) != len(self.loss_mask):
            raise SampleLayoutError(
                f"logprobs has {len(self.logprobs)} entries but loss_mask has "
                f"{len(self.loss_mask)}; they must cover the same response region"
            )
        if len(self.source_turn) != len(self.token_ids):
            raise SampleLayoutError(
                f"source_turn has {len(self.source_turn)} entries but token_ids has "
                f"{len(self.token_ids)}; provenance needs one entry per token"
            )

    def to_sample(self) -> Sample:
        """The toolkit-wide `Sample` (the identity fields stay behind: the engine keys by session)."""
        return Sample(
            list(self.token_ids),
            self.response_length,
            list(self.loss_mask),
            list(self.logprobs),
            list(self.source_turn),
            self.reward,
            dict(self.metadata),
        )


def full_length_layout(sample: TreeSample | Sample) -> tuple[list[int], list[int], list[float]]:
    """TRL's row layout `(input_ids, completion_mask, old_log_probs)`: mask and logprobs padded to full length."""
    prompt_len = len(sample.token_ids) - sample.response_length
    return (
        list(sample.token_ids),
        [0] * prompt_len + list(sample.loss_mask),
        [0.0] * prompt_len + list(sample.logprobs),
    )


def common_prefix_len(a: Sequence[int], b: Sequence[int], chunk: int = 4096) -> int:
    """Length of the longest common prefix; compares whole chunks first, then token by token.

    Two lists go to `trace_tools.ids.common_prefix_len`, which compares without copying chunk by chunk."""
    if type(a) is list and type(b) is list:
        return _list_prefix_len(a, b)
    limit = min(len(a), len(b))
    matched = 0
    while matched < limit:
        end = min(matched + chunk, limit)
        if a[matched:end] == b[matched:end] if type(a) is type(b) else list(a[matched:end]) == list(b[matched:end]):
            matched = end
            continue
        while a[matched] == b[matched]:
            matched += 1
        return matched
    return matched


class MessageNode:
    """One message of the routing tree.

    The root has `role` and `message` None. A node with `turn` set is a *generated* assistant;
    every other node (system/user/tool, foreign or demoted assistants) is routing-only.
    `turn_index` is 1-based per session (upstream); `source` is the caller's id for provenance
    (the dump's `turn_index`), defaulting to `turn_index`.
    """

    __slots__ = (
        "role",
        "message",
        "metadata",
        "parent",
        "children",
        "turn",
        "turn_index",
        "response_trained",
        "source",
    )

    def __init__(self, role: str | None = None, message: dict | None = None, metadata: dict | None = None):
        self.role = role
        self.message = message
        self.metadata: dict[str, Any] = metadata if metadata is not None else {}
        self.parent: MessageNode | None = None
        self.children: list[MessageNode] = []
        self.turn: TurnRecord | None = None
        self.turn_index: int | None = None
        self.response_trained = False
        self.source: int | None = None

    def __repr__(self) -> str:
        return f"MessageNode(role={self.role!r}, turn_index={self.turn_index}, children={len(self.children)})"

    @property
    def is_root(self) -> bool:
        return self.parent is None

    def add_child(self, child: MessageNode) -> MessageNode:
        child.parent = self
        self.children.append(child)
        return child

    def path_from_root(self) -> list[MessageNode]:
        """The nodes from the root's child down to this node (the root itself excluded)."""
        path: list[MessageNode] = []
        node: MessageNode | None = self
        while node is not None and not node.is_root:
            path.append(node)
            node = node.parent
        return path[::-1]

    def leaves(self) -> Iterator[MessageNode]:
        """Leaves in left-to-right pre-order DFS; an explicit stack, so depth never hits the recursion limit."""
        stack = [self]
        while stack:
            node = stack.pop()
            if not node.children:
                yield node
            else:
                stack.extend(reversed(node.children))


@dataclass
class SessionStats:
    """What the manager measured for one session beyond the samples (keys of the dicts are `source`s).

    `turn_events`: `demoted_by_merge` / `zeroed_by_realign` (docs/metrics.md#per-turn vocabulary).
    `prompt_events`: `clean`, `forked` (opened a new sample by FORK), `realigned` (caused a REALIGN).
    `drift_positions`: the longest common prefix with the held tokens, for each turn whose prompt
    did not extend them (classified REALIGN or FORK).
    """

    counters: Counter = field(default_factory=lambda: Counter({name: 0 for name in COUNTERS}))
    turn_events: dict[int, str] = field(default_factory=dict)
    prompt_events: dict[int, str] = field(default_factory=dict)
    drift_positions: dict[int, int] = field(default_factory=dict)

    def classified(self, source: int, drift: Drift) -> None:
        self.counters[f"drift_{drift.kind.value}"] += 1
        if drift.kind is DriftKind.FORK:
            self.prompt_events[source] = "forked"
        elif drift.kind is DriftKind.REALIGN:
            self.prompt_events[source] = "realigned"
        if drift.size:
            self.drift_positions[source] = drift.lcp


class _SampleBuilder:
    """Accumulates one sample: full token list with parallel loss mask, logprobs and provenance."""

    def __init__(self, fork_threshold: int, realign_gate: str = "output", realign_from: str = "response"):
        self.fork_threshold = fork_threshold
        self.realign_gate = realign_gate
        self.realign_from = realign_from
        self.tokens: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self.source: list[int] = []
        self.last_response_start_idx: int | None = None
        self.leading_prompt_len = 0
        self._last_source = -1
        self._last_trained = False

    def measure_drift(self, turn: TurnRecord) -> Drift:
        lcp = common_prefix_len(self.tokens, turn.prompt_ids)
        size = len(self.tokens) - lcp
        if size == 0:
            return Drift(DriftKind.CLEAN, lcp, 0)
        start = self.last_response_start_idx
        if start is not None and lcp >= start and self._gate_value(turn, size) < self.fork_threshold:
            return Drift(DriftKind.REALIGN, lcp, size)
        return Drift(DriftKind.FORK, lcp, size)

    def classify_token_drift(self, turn: TurnRecord) -> DriftKind:
        return self.measure_drift(turn).kind

    def _gate_value(self, turn: TurnRecord, drift_size: int) -> int:
        # slime gates on what REALIGN would cost the incoming turn; TRL on how much it invalidates.
        return len(turn.output_ids) if self.realign_gate == "output" else drift_size

    def append_turn(self, turn: TurnRecord, kind: DriftKind, *, trained: bool = True, source: int = -1) -> int | None:
        """Append one turn (never FORK); returns the `source` of a turn this REALIGN left with no trained token."""
        if kind is DriftKind.FORK:
            raise ValueError("a FORK opens a new builder; append the turn there as CLEAN")
        first = self.last_response_start_idx is None
        zeroed = None
        if kind is DriftKind.REALIGN:
            zeroed = self.align_to_prompt(turn.prompt_ids)
        else:
            self._append(turn.prompt_ids[len(self.tokens) :], 0, None, -1)
        self.last_response_start_idx = len(self.tokens)
        self._append(turn.output_ids, int(trained), turn.output_log_probs if trained else None, source)
        self._last_source, self._last_trained = source, trained and len(turn.output_ids) > 0
        if first:
            self.leading_prompt_len = len(turn.prompt_ids)
        return zeroed

    def align_to_prompt(self, prompt_ids: Sequence[int]) -> int | None:
        """REALIGN: replace the held tail with the prompt's version, as loss-0 context."""
        start = self.last_response_start_idx or 0
        if self.realign_from == "divergence":
            start = common_prefix_len(self.tokens, prompt_ids)
        erased_all = self._last_trained and start <= (self.last_response_start_idx or 0)
        tail = list(prompt_ids[start:])
        self.tokens[start:] = tail
        self.loss_mask[start:] = [0] * len(tail)
        self.logprobs[start:] = [0.0] * len(tail)
        self.source[start:] = [-1] * len(tail)
        return self._last_source if erased_all else None

    def _append(self, ids: Sequence[int], loss: int, logprobs: Sequence[float] | None, source: int) -> None:
        self.tokens.extend(ids)
        self.loss_mask.extend([loss] * len(ids))
        self.logprobs.extend(logprobs if logprobs else [0.0] * len(ids))
        self.source.extend([source] * len(ids))

    def has_trained_response(self) -> bool:
        return any(self.loss_mask[self.leading_prompt_len :])

    def to_sample(
        self, base: BaseSample, metadata: dict, max_sample_tokens: int = 0, safe_edges: bool = True
    ) -> TreeSample | None:
        """The sample, first prompt stripped from the response region; None when `safe_edges` drops it."""
        start = self.leading_prompt_len
        toks, mask, lps, src = self.tokens, self.loss_mask, self.logprobs, self.source
        if max_sample_tokens and len(toks) > max_sample_tokens:
            cut = max_sample_tokens
            toks, mask, lps, src = toks[:cut], mask[:cut], lps[:cut], src[:cut]
        if safe_edges and not any(mask[start:]):
            return None  # truncated below the first prompt, or every trained token cut off
        return TreeSample(
            token_ids=list(toks),
            response_length=len(mask) - start,
            loss_mask=list(mask[start:]),
            logprobs=list(lps[start:]),
            source_turn=list(src),
            metadata=dict(metadata),
            index=base.index,
            group_index=base.group_index,
            prompt=base.prompt,
            label=base.label,
            rollout_id=base.rollout_id if base.rollout_id is not None else base.index,
        )


class TrajectoryManager:
    """Per-session message trees in, training samples out (slime's manager; see the module docstring).

    `fork_threshold`: None means 1024; `<= 0` disables REALIGN and the rewrite-merge (agentcore now).
    `realign_gate`: "output" (slime: the incoming turn's output length `< fork_threshold`) or
    "drift" (TRL: the number of invalidated held tokens `< fork_threshold`).
    `realign_from`: "response" (slime: the whole last response becomes context) or "divergence"
    (TRL: only the tokens from the longest common prefix on).
    `safe_edges`: guard upstream's edge cases (see docs/upstream_tree.md); False reproduces them.
    """

    def __init__(
        self,
        fork_threshold: int | None = None,
        realign_gate: str = "output",
        realign_from: str = "response",
        safe_edges: bool = True,
    ):
        if realign_gate not in REALIGN_GATES:
            raise UnknownName("realign gate", realign_gate, REALIGN_GATES)
        if realign_from not in REALIGN_STARTS:
            raise UnknownName("realign start", realign_from, REALIGN_STARTS)
        self._fork_threshold = DEFAULT_FORK_THRESHOLD if fork_threshold is None else int(fork_threshold)
        self.realign_gate = realign_gate
        self.realign_from = realign_from
        self.safe_edges = safe_edges
        self._trees: dict[str, MessageNode] = {}
        self._turn_count: dict[str, int] = {}
        self._stats: dict[str, SessionStats] = {}

    @property
    def fork_threshold(self) -> int:
        return self._fork_threshold

    # ---- session bookkeeping -------------------------------------------------------------

    def has_session(self, sid: str) -> bool:
        return sid in self._trees

    def turn_count(self, sid: str) -> int:
        return self._turn_count.get(sid, 0)

    def root(self, sid: str) -> MessageNode | None:
        return self._trees.get(sid)

    def _session_stats(self, sid: str) -> SessionStats:
        stats = self._stats.get(sid)
        if stats is None:
            stats = self._stats[sid] = SessionStats()
        return stats

    def pop_stats(self, sid: str) -> SessionStats:
        """Counters and events of a session (fresh zeros when it recorded nothing); forgets them."""
        return self._stats.pop(sid, None) or SessionStats()

    # ---- layer 1: routing --------------------------------------------------------------------

    def record_turn(
        self,
        sid: str,
        *,
        turn: TurnRecord,
        prompt_messages: Sequence[dict],
        response_message: dict | None,
        metadata: dict | None = None,
        source: int | None = None,
    ) -> None:
        """Route one turn into the session's message tree and attach its generated assistant leaf."""
        if not prompt_messages:
            log.debug("record_turn(%s): empty prompt_messages, turn not recorded", sid)
            return
        self._check_logprobs(turn, source)
        root = self._trees.setdefault(sid, MessageNode())
        self._session_stats(sid)
        node, depth = self.find_mount_point(root, prompt_messages)
        node, depth = self.try_merge_assistant_rewrite(sid, node, prompt_messages, depth)
        for message in prompt_messages[depth:]:
            node = node.add_child(MessageNode(role=message.get("role"), message=message))
        self._hang_leaf(sid, node, turn, response_message, metadata, source)

    def append_to_chain(
        self,
        sid: str,
        *,
        turn: TurnRecord,
        response_message: dict | None,
        metadata: dict | None = None,
        source: int | None = None,
    ) -> None:
        """Hang one turn under the session's previous one, in arrival order, without routing its
        prompt messages: the session stays one linear chain (TRL's message mode), so linearization
        decides CLEAN/REALIGN/FORK on token prefixes alone."""
        self._check_logprobs(turn, source)
        node = self._trees.setdefault(sid, MessageNode())
        self._session_stats(sid)
        while node.children:
            node = node.children[-1]
        self._hang_leaf(sid, node, turn, response_message, metadata, source)

    def _hang_leaf(
        self,
        sid: str,
        node: MessageNode,
        turn: TurnRecord,
        response_message: dict | None,
        metadata: dict | None,
        source: int | None,
    ) -> None:
        """Attach the generated assistant leaf of one turn under `node`."""
        leaf = MessageNode(role="assistant", message=response_message, metadata=dict(metadata or {}))
        leaf.turn, leaf.turn_index = turn, self._turn_count.get(sid, 0) + 1
        leaf.source = leaf.turn_index if source is None else source
        node.add_child(leaf)
        self._turn_count[sid] = leaf.turn_index
        self._stats[sid].prompt_events[leaf.source] = "clean"

    def _check_logprobs(self, turn: TurnRecord, source: int | None) -> None:
        if not turn.output_log_probs or len(turn.output_log_probs) == len(turn.output_ids):
            return
        if not self.safe_edges:  # upstream's bare assert, raised even under `python -O`
            raise AssertionError("len(turn.output_log_probs) must equal len(turn.output_ids)")
        raise LogprobsLengthMismatch(
            f"turn {source}: output_log_probs has {len(turn.output_log_probs)} entries but output_ids has "
            f"{len(turn.output_ids)}; drop the logprobs or fix the row (validation quarantines it as logprobs_length)"
        )

    @staticmethod
    def find_mount_point(root: MessageNode, messages: Sequence[dict]) -> tuple[MessageNode, int]:
        """Descend while some child (the first, in insertion order) equals the next message."""
        node, depth = root, 0
        while depth < len(messages):
            message = messages[depth]
            role = message.get("role")
            # `is` first: replayed history hands back the same message objects, and == on a dict
            # compares it deeply even against itself.
            child = next(
                (c for c in node.children if c.role == role and (c.message is message or c.message == message)), None
            )
            if child is None:
                break
            node, depth = child, depth + 1
        return node, depth

    def try_merge_assistant_rewrite(
        self, sid: str, node: MessageNode, messages: Sequence[dict], depth: int
    ) -> tuple[MessageNode, int]:
        """Absorb a rewritten echo of a short, childless generated leaf instead of branching.

        The only assistant child at the mount point is demoted to routing-only (its tokens never
        train) and adopts the client's message, so later replays descend through it.
        """
        if self._fork_threshold <= 0 or depth >= len(messages) or messages[depth].get("role") != "assistant":
            return node, depth
        candidates = [c for c in node.children if c.role == "assistant"]
        if len(candidates) != 1:
            if candidates:
                log.debug(
                    "record_turn(%s): %d assistant candidates for a rewrite merge; branching", sid, len(candidates)
                )
                self._stats[sid].counters["ambiguous_merges"] += 1
            return node, depth
        child = candidates[0]
        if child.children or child.turn is None or len(child.turn.output_ids) >= self._fork_threshold:
            return node, depth
        self._demote(sid, child, messages[depth])
        return child, depth + 1

    def _demote(self, sid: str, node: MessageNode, client_message: dict) -> None:
        """Make a generated leaf routing-only (its tokens never train) under the client's version of it."""
        assert node.turn is not None and node.source is not None, "only a generated leaf is demoted"
        node.metadata["merged_rewrite"] = {
            "abandoned_turn_index": node.turn_index,
            "abandoned_response_tokens": len(node.turn.output_ids),
        }
        stats = self._stats[sid]
        stats.counters["rewrite_merges"] += 1
        stats.turn_events[node.source] = "demoted_by_merge"
        node.turn, node.turn_index = None, None
        node.message = client_message

    # ---- layer 2: linearization ------------------------------------------------------------

    def get_trajectory(
        self,
        sid: str,
        *,
        base_sample: BaseSample,
        reward: float = 0.0,
        extra_metadata: dict | None = None,
        max_sample_tokens: int = 0,
    ) -> list[TreeSample]:
        """Every leaf's samples in DFS order, each carrying the full reward; consumes the session."""
        root = self._trees.get(sid)
        if root is None:
            return []
        stats = self._session_stats(sid)
        leaves = [leaf for leaf in root.leaves() if not leaf.is_root]
        stats.counters["tree_branches"] = max(len(leaves) - 1, 0)
        samples: list[TreeSample] = []
        for leaf in leaves:
            samples += self._chain_to_samples(
                leaf.path_from_root(), base_sample, extra_metadata, max_sample_tokens, stats
            )
        for sample in samples:
            sample.reward = reward
        del self._trees[sid]
        self._turn_count.pop(sid, None)
        return samples

    def _chain_to_samples(
        self,
        chain: list[MessageNode],
        base: BaseSample,
        extra_metadata: dict | None,
        max_sample_tokens: int,
        stats: SessionStats,
    ) -> list[TreeSample]:
        generated = [n for n in chain if n.role == "assistant" and n.turn is not None]
        metadata = {**(extra_metadata or {}), **chain_metadata(generated)}
        samples = []
        for builder in self._split_chain_into_builders(generated, stats):
            if not builder.has_trained_response():
                stats.counters["dropped_builders"] += 1
                continue
            sample = builder.to_sample(base, metadata, max_sample_tokens, self.safe_edges)
            if sample is None:
                stats.counters["truncation_drops"] += 1
                continue
            samples.append(sample)
        return samples

    def _split_chain_into_builders(self, generated: list[MessageNode], stats: SessionStats) -> list[_SampleBuilder]:
        builders: list[_SampleBuilder] = []
        for node in generated:
            turn, source = node.turn, node.source
            assert turn is not None and source is not None, "a generated node carries its turn and source"
            trained = not node.response_trained
            node.response_trained = True  # claimed even if the span is later REALIGNed or the builder dropped
            if builders:
                drift = builders[-1].measure_drift(turn)
                stats.classified(source, drift)
                if drift.kind is not DriftKind.FORK:
                    zeroed = builders[-1].append_turn(turn, drift.kind, trained=trained, source=source)
                    if zeroed is not None:
                        stats.turn_events[zeroed] = "zeroed_by_realign"
                    continue
            builders.append(self._new_builder())
            builders[-1].append_turn(turn, DriftKind.CLEAN, trained=trained, source=source)
        return builders

    def _new_builder(self) -> _SampleBuilder:
        return _SampleBuilder(self._fork_threshold, self.realign_gate, self.realign_from)


def chain_metadata(generated: list[MessageNode]) -> dict[str, bool]:
    """Per-chain flags shared by all of its samples: last turn truncated, any tool call, any ill-formed call."""
    turns = [n.turn for n in generated if n.turn is not None]  # every one: generated nodes carry a turn
    return {
        "truncated": bool(turns) and turns[-1].finish_reason == "length",
        "use_tool": any(bool((n.message or {}).get("tool_calls")) for n in generated),
        "ill_formed": any(t.ill_formed for t in turns),
    }
