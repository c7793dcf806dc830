"""v2: the trajectory forest (docs/upstream_session.md#v2-the-trajectory-forest, HEAD behaviour): attach points,
retry trimming and exactly-once masking."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from trace_tools.data import Sample
from trace_tools.strategies.session_core.assembly import assemble_records
from trace_tools.strategies.session_core.errors import (
    ServerError,
    TruncatedExtension,
)
from trace_tools.strategies.session_core.matchers import (
    Matcher,
    matches,
    remembered,
    strict_match,
)
from trace_tools.strategies.session_core.records import (
    Generation,
    Record,
    SessionRequest,
    TurnOutcome,
    check_prefix,
    gate_roles,
    noting_lenient,
    serve,
)
from trace_tools.strategies.session_core.tito import TitoTokenizer

MAX_NODES = 1024


@dataclass(eq=False)
class TrajectoryNode:
    """One generation in the forest: the messages it added and the full root→node snapshot."""

    seq: int
    delta_messages: list[dict]
    token_ids: list[int]
    completion_span: tuple[int, int]
    record: Record
    parent: "TrajectoryNode | None" = None
    children: list["TrajectoryNode"] = field(default_factory=list)

    @property
    def finish_reason(self) -> str:
        return self.record.generation.finish_reason or ""

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    def path_nodes(self) -> list["TrajectoryNode"]:
        path: list[TrajectoryNode] = []
        node: TrajectoryNode | None = self
        while node is not None:
            path.append(node)
            node = node.parent
        return path[::-1]

    def path_messages(self) -> list[dict]:
        return [m for node in self.path_nodes() for m in node.delta_messages]


class SessionTree:
    """Roots and nodes in creation order; `seq` is the creation index and the only ordering key."""

    def __init__(self, max_nodes: int = MAX_NODES):
        self.roots: list[TrajectoryNode] = []
        self.nodes: list[TrajectoryNode] = []
        self.max_nodes = max_nodes
        self.branches = 0  # nodes created beside an existing sibling, plus roots − 1 (`tree_branches`)

    def leaves(self) -> list[TrajectoryNode]:
        return [node for node in self.nodes if not node.children]

    def create_node(
        self,
        parent: TrajectoryNode | None,
        delta: list[dict],
        token_ids: list[int],
        span: tuple[int, int],
        record: Record,
    ) -> TrajectoryNode:
        if len(self.nodes) >= self.max_nodes:
            raise ValueError(f"session tree is full ({self.max_nodes} nodes)")
        node = TrajectoryNode(len(self.nodes), delta, token_ids, span, record, parent)
        siblings = parent.children if parent is not None else self.roots
        self.branches += bool(siblings)
        siblings.append(node)
        self.nodes.append(node)
        return node


@dataclass(slots=True)
class AttachPoint:
    node: TrajectoryNode | None  # None = a new root
    matched: int  # request messages the node's path consumes
    overlap: int  # deepest partial agreement seen (diagnostics)


def find_attach_point(tree: SessionTree, request: Sequence[dict], match: Matcher) -> AttachPoint:
    """The node whose whole path the request repeats, consuming the most request messages.

    A node whose delta the request only partly repeats is never a candidate, nor is anything
    below it; ties go to the latest node. Pure: the tree is not touched.
    """
    best, best_matched, overlap = None, -1, 0
    stack = [(root, 0) for root in reversed(tree.roots)]
    while stack:
        node, offset = stack.pop()
        agreed = _delta_agreement(node.delta_messages, request, offset, match)
        overlap = max(overlap, offset + agreed)
        if agreed < len(node.delta_messages):
            continue
        matched = offset + agreed
        if matched > best_matched or (matched == best_matched and best is not None and node.seq > best.seq):
            best, best_matched = node, matched
        stack.extend((child, matched) for child in reversed(node.children))
    return AttachPoint(best, best_matched if best is not None else 0, overlap)


def _delta_agreement(delta: Sequence[dict], request: Sequence[dict], offset: int, match: Matcher) -> int:
    agreed = 0
    while agreed < len(delta) and offset + agreed < len(request):
        if not matches(match, delta[agreed], request[offset + agreed]):
            break
        agreed += 1
    return agreed


class SessionForest:
    """v2 session state: the tree plus the active leaf (the view GET and tokenization follow)."""

    def __init__(self, max_nodes: int = MAX_NODES):
        self.tree = SessionTree(max_nodes)
        self.active_leaf: TrajectoryNode | None = None

    def prompt_for(
        self, request: list[dict], tools: list[dict] | None, tito: TitoTokenizer, match: Matcher
    ) -> tuple[list[int], str]:
        attach = find_attach_point(self.tree, request, match)
        node = attach.node
        if node is not None and node.truncated:
            raise TruncatedExtension(f"truncated generation cannot be extended (node {node.seq} stopped on length)")
        self.active_leaf = node  # the view moves before generation, even if a later check fails
        if node is None:
            return tito.full_render(request, tools), "new_root" if self.tree.roots else "root"
        stored = node.path_messages()
        gate_roles(request, len(stored), tito.family.allowed_append_roles)
        ids = tito.merge_tokens(stored, stored + request[len(stored) :], node.token_ids, tools)
        return ids, "sibling" if node.children else "child"

    def commit(
        self, request: list[dict], prompt_ids: list[int], turn_index: int, generation: Generation, max_trim: int
    ) -> TrajectoryNode:
        parent = self.active_leaf
        record = Record(turn_index, prompt_ids, generation)
        all_ids = record.all_ids
        check_prefix(parent.token_ids if parent else [], all_ids, max_trim)
        consumed = len(parent.path_messages()) if parent else 0
        try:
            node = self.tree.create_node(
                parent, request[consumed:] + [generation.message], all_ids, (len(prompt_ids), len(all_ids)), record
            )
        except ValueError as exc:  # upstream: not a SessionError, so a 500
            raise ServerError(str(exc)) from exc
        self.active_leaf = node
        return node


def serve_v2(state: SessionForest, request: SessionRequest, tito: TitoTokenizer, match: Matcher) -> TurnOutcome:
    """One chat request against a v2 session with the recorded generation as the reply."""
    outcome = TurnOutcome(request.turn_index)

    def run() -> None:
        request_tito = tito.for_request(request.chat_template_kwargs)
        outcome.prompt_ids, outcome.placement = state.prompt_for(request.messages, request.tools, request_tito, match)
        state.commit(
            request.messages,
            outcome.prompt_ids,
            request.turn_index,
            request.generation,
            request_tito.family.max_trim_tokens,
        )

    return serve(outcome, run)


def replay_v2(
    requests: Sequence[SessionRequest], tito: TitoTokenizer, match: Matcher = strict_match, max_nodes: int = MAX_NODES
) -> tuple[SessionForest, list[TurnOutcome]]:
    state, match = SessionForest(max_nodes), remembered(match)
    return state, [noting_lenient(serve_v2(state, request, tito, match), tito) for request in requests]


@dataclass
class LeafSample:
    """One leaf's merged sample plus the path it came from (for picking and exactly-once masking)."""

    leaf: TrajectoryNode
    path: list[TrajectoryNode]
    sample: Sample


def collect_v2(tree: SessionTree, max_trim: int, max_seq_len: int | None = None) -> list[LeafSample]:
    """compute → truncate → merge per leaf, in seq order; a leaf truncated to nothing is dropped."""
    material = []
    for leaf in tree.leaves():
        path = leaf.path_nodes()
        merged = assemble_records([n.record for n in path], leaf.token_ids, max_trim, max_seq_len)
        if merged is None:
            continue
        metadata = {
            "leaf": {
                "node_id": leaf.seq,
                "parent": leaf.parent.seq if leaf.parent else None,
                "path_node_ids": [n.seq for n in path],
                "response_id": leaf.record.generation.response_id,
            }
        }
        material.append(LeafSample(leaf, path, merged.to_sample(metadata=metadata)))
    return material


def drop_retries(samples: Sequence[LeafSample]) -> tuple[list[LeafSample], list[LeafSample]]:
    """HEAD's default picker: a leaf with a later sibling was retried and is trimmed.

    Roots and leaves without a later sibling survive (an abandoned deep branch included).
    Survivors come deepest first, then latest first. Returns (kept, trimmed).
    """
    kept: list[LeafSample] = []
    trimmed: list[LeafSample] = []
    for item in samples:
        parent = item.leaf.parent
        later = parent is not None and any(c.seq > item.leaf.seq for c in parent.children)
        (trimmed if later else kept).append(item)
    kept.sort(key=lambda s: (len(s.path), s.leaf.seq), reverse=True)
    return kept, trimmed


def default_postprocess(samples: Sequence[LeafSample], reward: float | None) -> None:
    """Exactly-once masking: each node's completion trains only in the earliest kept leaf holding it.

    Only `loss_mask` is zeroed on a shared span; logprobs stay as they were (upstream). A scalar
    reward, when given, is broadcast to every sample.
    """
    owner: dict[int, int] = {}
    for item in samples:
        for node in item.path:
            owner[node.seq] = min(owner.get(node.seq, item.leaf.seq), item.leaf.seq)
    for item in samples:
        _mask_unowned(item, owner)
        if reward is not None:
            item.sample.reward = reward


def _mask_unowned(item: LeafSample, owner: dict[int, int]) -> None:
    sample = item.sample
    response_start = len(sample.token_ids) - sample.response_length
    for node in item.path:
        if owner[node.seq] == item.leaf.seq:
            continue
        lo, hi = node.completion_span
        a, b = max(lo - response_start, 0), min(hi - response_start, sample.response_length)
        if b > a:
            sample.loss_mask[a:b] = [0] * (b - a)


def samples_v2(
    tree: SessionTree, max_trim: int, max_seq_len: int | None = None, reward: float | None = None
) -> tuple[list[LeafSample], list[LeafSample]]:
    """The v2 samples op with the default hooks: (emitted, trimmed)."""
    kept, trimmed = drop_retries(collect_v2(tree, max_trim, max_seq_len))
    default_postprocess(kept, reward)
    return kept, trimmed
