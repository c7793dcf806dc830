"""verifiers v1's message graph as prime-rl trains it, on plain token lists (docs/strategies.md#message-graph).

One node per distinct message, keyed by its parent and a content hash (`message_key`). A turn
walks its prompt's messages down the graph by key, keeps the walked nodes whose token slices
still equal the prompt's ids at their position, and hangs the rest of the prompt plus the reply
under the last kept node. Concatenating a root-to-leaf path's tokens gives that branch's exact
prompt + completion; each branch is one sample, and a sampled node shared by several branches
carries loss only in the first branch that contains it.

Recorded dumps carry no per-message token spans, so every new input node holds no tokens of its
own and the turn's unmatched prompt ids travel with the reply's node, ahead of its completion:
verifiers' own path for a renderer that attributes no spans. Branch tokens and masks are those
of the span-attributing renderer; only the node a scaffold token sits in differs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from trace_tools.memo import IdentityMemo

NodeKey = tuple[int, str]  # (parent id, or -1 with the tools hash for a root; message hash)


def _canonical_arguments(arguments: Any) -> str:
    """Tool-call arguments compared as JSON values: key order and whitespace do not count."""
    if not isinstance(arguments, str):
        return json.dumps(arguments, sort_keys=True, separators=(",", ":"))
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return arguments


def _content_fields(content: Any) -> list[str]:
    if isinstance(content, list):
        fields = ["content_parts"]
        for part in content:
            kind = part.get("type", "") if isinstance(part, dict) else "text"
            fields.append(kind)
            if kind == "text":
                fields.append(part.get("text", "") if isinstance(part, dict) else str(part))
            else:
                image = part.get("image_url") or {}
                fields.append(image.get("url", "") if isinstance(image, dict) else str(image))
        return fields
    return ["content_text", "" if content is None else str(content)]  # None and "" are one message


def _tool_call_fields(call: dict) -> list[str]:
    function = call.get("function") or call
    kind = call.get("type") or "function"
    arguments = function.get("arguments", "")
    return [
        "tool_call",
        kind,
        str(call.get("id") or ""),
        str(function.get("name") or ""),
        str(function.get("namespace") or ""),
        arguments if kind == "custom" and isinstance(arguments, str) else _canonical_arguments(arguments),
    ]


def message_key(message: dict) -> str:
    """The content hash of a message: role, content, an assistant's reasoning and tool calls, a
    tool result's call id; nothing else a harness may attach. Length-prefixed fields, so no two
    different field lists hash alike."""
    role = str(message.get("role", ""))
    fields = [role, *_content_fields(message.get("content"))]
    if role == "assistant":
        if message.get("reasoning_content") is not None:
            fields += ["reasoning_content", str(message["reasoning_content"])]
        for call in message.get("tool_calls") or ():
            fields += _tool_call_fields(call)
    elif role == "tool":
        fields += ["tool_call_id", str(message.get("tool_call_id") or "")]
    digest = hashlib.blake2b(digest_size=16)
    for value in fields:
        data = value.encode()
        digest.update(len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


def tools_key(tools: Sequence[dict] | None) -> str:
    """Roots are keyed by the tools rendered into the prompt as well."""
    return hashlib.blake2b(json.dumps(list(tools or ()), sort_keys=True).encode(), digest_size=16).hexdigest()


@dataclass(eq=False, slots=True)
class Node:
    """One message and the token ids it adds to its path; a reply's node ends with its `completion`."""

    parent: int | None
    key: NodeKey
    token_ids: list[int]
    completion: int = 0  # sampled tokens at the end of token_ids (a reply's node only)
    source: int = -1  # the turn whose reply this node is
    logprobs: list[float] = field(default_factory=list)


@dataclass
class Committed:
    """What one turn did to the graph: how many prompt messages it reused and whether the new
    nodes start beside an existing sibling (a branch)."""

    reused: int
    forked: bool


class MessageGraph:
    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.head: dict[NodeKey, int] = {}  # key -> the latest node with it
        self.children: dict[int, int] = {}  # parent id -> number of children
        self.hashes: IdentityMemo[str] = IdentityMemo()  # a session's turns share their history's objects

    def key(self, parent: int | None, message: dict, tools: Sequence[dict] | None) -> NodeKey:
        digest = self.hashes.get(message, message_key)
        return (-1, self.hashes.get(tools, tools_key) + digest) if parent is None else (parent, digest)

    def commit(
        self,
        messages: Sequence[dict],
        tools: Sequence[dict] | None,
        prompt_ids: Sequence[int],
        reply: dict,
        completion: Sequence[int],
        logprobs: Sequence[float],
        source: int,
    ) -> Committed:
        """Add one served request: prompt messages, the ids fed, the reply and its sampled ids."""
        prefix, path_len = self._token_prefix(self._message_prefix(messages, tools), prompt_ids)
        parent = prefix[-1] if prefix else None
        while len(prefix) < len(messages):  # an older variant of the next message may still fit
            match = self._variant(self.key(parent, messages[len(prefix)], tools), prompt_ids, path_len)
            if match is None:
                break
            prefix.append(match)
            parent, path_len = match, path_len + len(self.nodes[match].token_ids)
        forked = self.children.get(parent if parent is not None else -1, 0) > 0
        for message in messages[len(prefix) :]:
            parent = self._add(Node(parent, self.key(parent, message, tools), []))
        lps = [*logprobs, *[0.0] * len(completion)][: len(completion)]  # a missing logprob reads 0.0
        ids = [*prompt_ids[path_len:], *completion]
        self._add(Node(parent, self.key(parent, reply, tools), ids, len(completion), source, lps))
        return Committed(len(prefix), forked)

    def _message_prefix(self, messages: Sequence[dict], tools: Sequence[dict] | None) -> list[int]:
        """The nodes the prompt's messages walk to by key alone (the latest variant of each)."""
        prefix: list[int] = []
        parent: int | None = None
        for message in messages:
            found = self.head.get(self.key(parent, message, tools))
            if found is None:
                break
            prefix.append(found)
            parent = found
        return prefix

    def _token_prefix(self, prefix: list[int], prompt_ids: Sequence[int]) -> tuple[list[int], int]:
        """The leading nodes of `prefix` whose token slices equal the prompt's ids in place."""
        offset = 0
        for kept, node_id in enumerate(prefix):
            ids = self.nodes[node_id].token_ids
            if prompt_ids[offset : offset + len(ids)] != ids:
                return prefix[:kept], offset
            offset += len(ids)
        return prefix, offset

    def _variant(self, key: NodeKey, prompt_ids: Sequence[int], start: int) -> int | None:
        """Among the nodes with `key`, the one with the longest token slice the prompt repeats at
        `start` (the latest first on a tie)."""
        best: int | None = None
        for node_id in range(len(self.nodes) - 1, -1, -1):
            ids = self.nodes[node_id].token_ids
            if self.nodes[node_id].key == key and prompt_ids[start : start + len(ids)] == ids:
                if best is None or len(ids) > len(self.nodes[best].token_ids):
                    best = node_id
        return best

    def _add(self, node: Node) -> int:
        self.nodes.append(node)
        node_id = len(self.nodes) - 1
        self.head[node.key] = node_id
        parent = node.parent if node.parent is not None else -1
        self.children[parent] = self.children.get(parent, 0) + 1
        return node_id

    def leaves(self) -> list[int]:
        """Nodes no node hangs under, in creation order: one per branch."""
        return [n for n in range(len(self.nodes)) if n not in self.children]

    def path(self, leaf: int) -> list[Node]:
        nodes: list[Node] = []
        current: int | None = leaf
        while current is not None:
            nodes.append(self.nodes[current])
            current = self.nodes[current].parent
        return nodes[::-1]


@dataclass
class Branch:
    """One branch as a sample: its tokens, loss mask, logprobs and producing turn per token."""

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    source_turn: list[int]
    response_start: int


def trainable_branches(graph: MessageGraph) -> list[Branch]:
    """Every branch that trains a token; a shared sampled node trains in its first branch only."""
    trained: set[int] = set()
    branches: list[Branch] = []
    for leaf in graph.leaves():
        branch = Branch([], [], [], [], -1)
        for node in graph.path(leaf):
            context = len(node.token_ids) - node.completion
            if node.completion and branch.response_start < 0:
                branch.response_start = len(branch.token_ids) + context
            first = node.completion > 0 and id(node) not in trained
            if first:
                trained.add(id(node))
            branch.token_ids += node.token_ids
            branch.loss_mask += [0] * context + [int(first)] * node.completion
            branch.logprobs += [0.0] * context + node.logprobs
            branch.source_turn += [-1] * context + [node.source] * node.completion
        if any(branch.loss_mask):
            branches.append(branch)
    return branches
