"""The `areal` strategy: AReaL's InteractionCache and its two export styles (docs/strategies.md#areal).

`concat`: each call's parent is the earlier call whose messages plus its text reply,
`{"role": "assistant", "content": <text>}`, form the longest strict prefix of this call's
messages, compared as they were sent (any other key on the echoed reply, such as its tool calls,
and no parent is found). A call with a parent is fed the parent's prompt + output ids followed by
AReaL's own ChatML text of the remaining messages; one without is fed that text of all its
messages. Tools are never rendered. Every leaf (a call no later call descends from) is one
sample: its prompt + output, with the ancestors' outputs trained where they sit. Upstream trains
an ancestor shared by several leaves in each of them; here it trains in the first leaf only, so
that no generated token carries loss twice (the one deliberate deviation).

`individual`: every call is its own sample, the recorded (or rendered) prompt then its output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Sequence

from trace_tools.data import ReplayResult, Sample
from trace_tools.pipeline.prepared import PreparedSession, PreparedTurn
from trace_tools.strategies.base import Strategy
from trace_tools.strategies.declarations import AREAL
from trace_tools.strategies.helpers import failure_reason
from trace_tools.strategies.tree import record_failures

# AReaL's default `messages_delimiter_start` / `_end` (its "concat" chat format follows Qwen's ChatML).
START, END = "<|im_start|>", "<|im_end|>"


class UnfinishedParent(ValueError):
    reason = "an earlier call has no reply (upstream refuses every later call)"


@dataclass(eq=False)
class Interaction:
    """One call in the cache: the messages as sent, its text reply, the ids fed and sampled."""

    source: int
    messages: list[dict]
    created: int  # whole seconds, as upstream's `created` field
    prompt_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    output_text: str | None = None
    parent: Interaction | None = None
    has_child: bool = False


def chatml(messages: Sequence[dict]) -> str:
    """AReaL's concat text: each message's role and content as Python formats them (a None content
    is the text "None"), then the assistant opener. A message without content fails, as upstream."""
    parts = [f"{START}{message['role']}\n{message['content']}{END}\n" for message in messages]
    return "".join(parts) + f"{START}assistant\n"


def find_parent(cache: Sequence[Interaction], messages: list[dict]) -> Interaction | None:
    """The longest earlier call whose messages + text reply are a strict prefix of `messages`
    (upstream's order: longest first, then the later `created` second, then insertion order)."""
    for candidate in sorted(cache, key=lambda c: (len(c.messages), c.created), reverse=True):
        if candidate.output_text is None:
            raise UnfinishedParent("Parent interaction output_text and messages must be set")
        data = [*candidate.messages, {"role": "assistant", "content": candidate.output_text}]
        if len(data) < len(messages) and messages[: len(data)] == data:
            return candidate
    return None


def concat_sample(leaf: Interaction, trained: set[int], reward: float) -> Sample:
    """A leaf's prompt + output; each ancestor's output trained here unless an earlier leaf did."""
    chain: list[Interaction] = []
    node: Interaction | None = leaf
    while node is not None:
        chain.append(node)
        node = node.parent
    tokens = [*leaf.prompt_ids, *leaf.output_ids]
    first = len(chain[-1].prompt_ids)  # the root's prompt is the sample's prompt, and every call's prefix
    size = len(tokens) - first  # mask and logprobs cover the response region only, built that long
    mask, logprobs, source = [0] * size, [0.0] * size, [-1] * len(tokens)
    for call in chain:
        start = len(call.prompt_ids)
        end = start + len(call.output_ids)
        logprobs[start - first : end - first] = call.logprobs
        source[start:end] = [call.source] * len(call.output_ids)
        if id(call) not in trained:
            trained.add(id(call))
            mask[start - first : end - first] = [1] * len(call.output_ids)
    return Sample(tokens, size, mask, logprobs, source, reward)


def individual_sample(call: Interaction, reward: float) -> Sample:
    n = len(call.output_ids)
    return Sample(
        [*call.prompt_ids, *call.output_ids],
        n,
        [1] * n,
        call.logprobs,
        [-1] * len(call.prompt_ids) + [call.source] * n,
        reward,
    )


class ArealStrategy(Strategy):
    declaration = AREAL

    def replay_session(self, prepared: PreparedSession) -> ReplayResult:
        concat = self.setting("areal_export") == "concat"
        cache: list[Interaction] = []
        result = ReplayResult()
        failures: dict[int, str] = {}
        for turn in prepared.turns:
            call = Interaction(turn.turn.turn_index, turn.turn.messages, _created(turn))
            try:
                result.prompt_events[call.source] = self.feed(call, turn, cache, concat)
            except UnfinishedParent as exc:
                failures[call.source] = failure_reason(exc)
            except (KeyError, TypeError):  # upstream's f-string reads message["role"] and ["content"]
                failures[call.source] = "a message without role or content (AReaL's concat text reads both)"
            cache.append(call)  # upstream caches the call before building its prompt
        answered = [call for call in cache if call.output_text is not None]
        if concat:
            leaves = [call for call in answered if not call.has_child]
            trained: set[int] = set()
            result.samples = [concat_sample(leaf, trained, prepared.reward) for leaf in leaves]
            result.counters["tree_branches"] = max(len(leaves) - 1, 0)
        else:
            result.samples = [individual_sample(call, prepared.reward) for call in answered]
        record_failures(result, failures)
        return result

    def feed(self, call: Interaction, prepared: PreparedTurn, cache: list[Interaction], concat: bool) -> str:
        """Find the call's parent, build the ids AReaL feeds, record the reply; its prompt event."""
        if concat:
            call.parent = find_parent(cache, call.messages)
            remaining = call.messages[len(call.parent.messages) + 1 :] if call.parent else call.messages
            # Without a parent the text is the whole conversation's, the last call's and a turn, so
            # most of its ids are the last call's; a parent's short remainder encodes whole as before.
            encode = getattr(prepared.renderer, "encode_growing", prepared.renderer.encode)
            text_ids = encode(chatml(remaining))
            parent = call.parent
            call.prompt_ids = [*parent.prompt_ids, *parent.output_ids, *text_ids] if parent else list(text_ids)
        else:
            call.prompt_ids = list(prepared.prompt_ids)
        turn = prepared.turn
        call.output_ids = list(turn.output_ids)
        logprobs = list(turn.output_logprobs or ())
        call.logprobs = (logprobs + [0.0] * len(call.output_ids))[: len(call.output_ids)]
        call.output_text = _text_reply(turn.response or prepared.response_message)
        if call.parent is None:
            return "new_root"
        call.parent.has_child = True
        return "clean"


def _text_reply(response: dict[str, Any] | None) -> str:
    """The reply's text content, tool calls and reasoning parsed out (upstream's `output_text`)."""
    content = (response or {}).get("content")
    return content if isinstance(content, str) else ""


def _created(prepared: PreparedTurn) -> int:
    started: datetime | None = prepared.turn.started_at
    return int(started.timestamp()) if started else 0
