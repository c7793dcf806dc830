"""`checkpoint-tree`: our token-checkpoint tree (rules in docs/checkpoint_tree.md).

Each recorded turn attaches at the deepest node whose path its canonical messages repeat (up to
cosmetic echo rewrites), reuses that node's exact ids, renders only the appended messages and
becomes a child; a request that extends nothing starts a new root from a full render. Linear
sessions give one sample; subagents and genuine edits give real branches; a retry supersedes its
earlier sibling while that is still a leaf. Recorded outputs are reused on the assembled prompts
(counterfactual), and no generated token is zeroed or re-emitted because of drift.

Options (`declarations.CHECKPOINT_PARAMS`):
* `retries`: "supersede" (default) trims a leaf that a later sibling re-generated from the same
  request; "keep" keeps every sibling as its own sample (e.g. n>1 sampling on purpose).
* `echo_rules` (True): False matches messages by dict equality only (for comparison).
* `harness_profile` ("auto"): the measured harness profiles whose echo rewrites are recognised
  besides the generic ones: "auto" every profile trace-tools ships, "none" none, or a
  profile.json from `trace-tools probe` (or a shipped name such as `claude-code-2.1.332`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from trace_tools.data import ReplayResult, Session, Turn
from trace_tools.errors import ReplayError
from trace_tools.ids import common_prefix_len, same_items
from trace_tools.pipeline.prepared import PreparedSession, PreparedTurn, prompt_for
from trace_tools.render.harness_echo import HarnessEcho, load_profile, shipped_echoes, working_directory
from trace_tools.strategies.base import ReplayContext, Strategy, prepare
from trace_tools.strategies.checkpoint_core import (
    Assembly,
    AssemblyFailed,
    AttachPoint,
    CheckpointTree,
    Node,
    PromptAssembler,
    build_samples,
)
from trace_tools.strategies.declarations import CHECKPOINT_TREE
from trace_tools.strategies.helpers import release_tree


@lru_cache(maxsize=8)
def harness_echoes(value: str) -> tuple[HarnessEcho, ...]:
    """The profiles a `harness_profile` value names, ready to apply."""
    if value == "none":
        return ()
    if value == "auto":
        return shipped_echoes()
    return (HarnessEcho(load_profile(value)),)


# Counters this strategy fills (zeros included): its declaration's.
OWN_COUNTERS = CHECKPOINT_TREE.counters
EXTRA_COUNTERS = (
    "new_roots",
    "boundary_fallbacks",
    "boundary_unverified",
    "render_failed",
    "restored_distinct_echoes",
    "truncated_extensions",
    "counterfactual_prompts",
)


@dataclass(slots=True)
class TurnInput:
    """What the tree needs from one recorded turn, canonicalized like the other strategies."""

    turn: Turn
    messages: list[dict]
    tools: list[dict] | None
    response: dict
    template_kwargs: dict[str, Any]
    call_ids: dict[int, tuple[str, ...]] = field(default_factory=dict)  # wire ids per assistant position
    issued: tuple[str, ...] = ()  # the tool-call ids the gateway returned with the response


class CheckpointTreeStrategy(Strategy):
    declaration = CHECKPOINT_TREE

    def replay_session(self, prepared: PreparedSession) -> ReplayResult:
        harnesses = harness_echoes(self.setting("harness_profile"))
        replayer = CheckpointReplay(self.ctx, self.setting("retries"), self.setting("echo_rules"), harnesses)
        for turn in prepared.turns:
            replayer.step(turn_input(turn))
        result = replayer.finish(prepared.reward)
        release_tree(replayer.tree.roots)
        return result


def turn_input(prepared: PreparedTurn | Turn, ctx: ReplayContext | None = None) -> TurnInput:
    """Canonical request and response of a prepared turn (the translate step every strategy
    shares); a raw `Turn` is prepared with `ctx` first."""
    if not isinstance(prepared, PreparedTurn):
        prepared = prepare(Session(prepared.session_id, [prepared]), ctx or ReplayContext()).turns[0]
    turn = prepared.turn
    return TurnInput(
        turn,
        prepared.messages,
        prepared.tools,
        prepared.response_message or {"role": "assistant", "content": ""},
        prepared.template_kwargs,
        wire_call_ids(turn.messages, prepared.messages),
        call_ids_of(turn.response),
    )


def call_ids_of(message: Any) -> tuple[str, ...]:
    """The tool-call ids of a wire assistant message (empty unless every call has one)."""
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    ids = [call.get("id") if isinstance(call, dict) else None for call in calls or ()]
    if not ids or not all(isinstance(i, str) and i for i in ids):
        return ()
    return tuple(str(i) for i in ids)


def wire_call_ids(raw: list[Any], canonical: list[dict]) -> dict[int, tuple[str, ...]]:
    """{position in the canonical request: the wire tool-call ids of the assistant message there}.

    Canonicalization drops the ids but keeps every assistant message, in order, so the k-th
    canonical assistant is the k-th wire one; a policy that does not is given no ids."""
    wire = [m for m in raw if isinstance(m, dict) and m.get("role") == "assistant"]
    positions = [p for p, m in enumerate(canonical) if m.get("role") == "assistant"]
    if len(wire) != len(positions):
        return {}
    return {p: ids for p, m in zip(positions, wire) if (ids := call_ids_of(m))}


class CheckpointReplay:
    """One session's tree, grown turn by turn, then turned into a ReplayResult."""

    def __init__(
        self,
        ctx: ReplayContext,
        retries: str = "supersede",
        echo_rules: bool = True,
        harnesses: tuple[HarnessEcho, ...] = (),
    ):
        if ctx.renderer is None:
            raise ReplayError("checkpoint-tree renders prompts; pass --tokenizer (and --chat-template)")
        self.ctx = ctx
        self.retries = retries
        self.tree = CheckpointTree(echo_rules=echo_rules, harnesses=harnesses)
        self.assembler = PromptAssembler(ctx.renderer)
        self.result = ReplayResult()
        self.counters: Counter = Counter({name: 0 for name in (*OWN_COUNTERS, *EXTRA_COUNTERS)})
        self.restored_nodes: set[int] = set()

    def step(self, item: TurnInput) -> Node:
        """Attach one turn: extend the deepest matching checkpoint, or start a new root."""
        if not self.tree.nodes:
            self.tree.cwd = working_directory(item.messages)  # what `cd {cwd} && ` rules need
        attach = self.tree.find_attach(item.messages, item.tools, item.template_kwargs, item.call_ids)
        self.counters["unrecognized_echoes"] += int(attach.unrecognized)
        if attach.node is None:
            return self._new_root(item, "new_root")
        depth = len(attach.node.path)
        appended, carried = self.tree.restore_carried(item.messages[depth:], item.tools, item.call_ids, depth)
        try:
            assembly = self.assembler.extend(attach.node, appended, item.tools, item.template_kwargs)
        except AssemblyFailed as failure:
            self.counters[failure.reason] += 1
            self.counters["resets"] += 1
            return self._new_root(item, "reset")
        node = self._add(attach.node, item, [*attach.node.path, *appended], assembly.ids)
        self._count_attach(item, attach, carried, assembly)
        self.result.prompt_events[item.turn.turn_index] = _prompt_event(attach, carried, assembly.mode)
        return node

    def _new_root(self, item: TurnInput, event: str) -> Node:
        """A full render of the request (carried echoes restored), or the recorded ids when the
        prompt source allows: for a root they are exactly what the engine saw."""
        request, carried = self.tree.restore_carried(item.messages, item.tools, item.call_ids)
        self._count_echoes((), carried)
        self.counters["new_roots"] += 1
        prompt_ids, _ = prompt_for(item.turn, request, item.tools, self.ctx.renderer, self.ctx.prompt_source)
        self.result.prompt_events[item.turn.turn_index] = event
        return self._add(None, item, request, prompt_ids)

    def _add(self, parent: Node | None, item: TurnInput, request: list[dict], prompt_ids: list[int]) -> Node:
        turn = item.turn
        return self.tree.add(
            parent,
            turn.turn_index,
            request,
            item.response,
            item.tools,
            item.template_kwargs,
            prompt_ids,
            turn.output_ids,
            turn.output_logprobs,
            turn.finish_reason,
            item.issued,
        )

    def _count_echoes(self, echoed: tuple[int, ...], carried: list[Node], path_echoes: int = 0) -> None:
        self.counters["restored_echoes"] += path_echoes + len(carried)
        self.restored_nodes.update(echoed)
        self.restored_nodes.update(node.seq for node in carried)

    def _count_attach(self, item: TurnInput, attach: AttachPoint, carried: list[Node], assembly: Assembly) -> None:
        parent, turn = attach.node, item.turn
        assert parent is not None, "only a request that attached to a node is counted here"
        self._count_echoes(attach.echoed_nodes, carried, attach.echoes)
        self.counters["healed_turns"] += 1
        self.counters["healed_prefix_tokens"] += len(parent.token_ids) + len(assembly.glue)
        self.counters["boundary_fallbacks"] += assembly.mode == "anchored"
        self.counters["truncated_extensions"] += parent.truncated
        if turn.prompt_ids is not None and not same_items(turn.prompt_ids, assembly.ids):
            self.counters["counterfactual_prompts"] += 1
            self.result.drift_positions[turn.turn_index] = common_prefix_len(turn.prompt_ids, assembly.ids)

    def finish(self, reward: float) -> ReplayResult:
        """Trim superseded retries, emit one sample per surviving leaf, fill counters and events."""
        trimmed = self.tree.superseded_leaves() if self.retries == "supersede" else []
        self.result.samples = [sample for _, sample in build_samples(self.tree, trimmed, reward)]
        for node in trimmed:
            self.result.turn_events[node.turn_index] = "trimmed"
        self.counters["trimmed_leaves"] = len(trimmed)
        self.counters["tree_branches"] = self.tree.branches
        self.counters["restored_distinct_echoes"] = len(self.restored_nodes)
        self.result.counters = self.counters
        return self.result


def _prompt_event(attach: AttachPoint, carried: list[Node], mode: str) -> str:
    """forked (a new sibling) > anchored (template rewrote history) > restored (echo recognised) > clean."""
    assert attach.node is not None, "a new root has no prompt event to choose"
    if len(attach.node.children) > 1:
        return "forked"
    if mode == "anchored":
        return "anchored"
    return "restored" if attach.echoes or carried else "clean"
