"""slime's 35-case branching matrix (docs/upstream_tree.md#case--test-map), restated over our own toy vocabulary.

Toy chat format: every message renders to `[open, body, close]` with one id band per role; the
generation prompt ends with the assistant `open`, and a response is `[body, close]`, so a faithful
echo of a response re-renders to exactly the ids the model produced. Drift is injected explicitly
by inserting or replacing a marker id.

Each sample is shown as one readable line: tokens by name, trained tokens (loss 1) prefixed with
`+`. Only the response region can carry `+`.
"""

from __future__ import annotations

import dataclasses

import pytest

from trace_tools.errors import ReplayError
from trace_tools.strategies.tree_core import (
    BaseSample,
    LogprobsLengthMismatch,
    TrajectoryManager,
    TreeSample,
    TurnRecord,
    common_prefix_len,
)

OPEN = {"system": 100, "user": 200, "tool": 300, "assistant": 400}
SHORT = {"system": "sys", "user": "usr", "tool": "tool", "assistant": "ai"}
GEN = OPEN["assistant"]
INSERTED, REPLACED = 901, 902


class Toy:
    """A deterministic toy tokenizer: one body id per (role, text), assigned on first use."""

    def __init__(self):
        self.bodies: dict[tuple[str, str], int] = {}
        self.names = {INSERTED: "%drift%", REPLACED: "%drift%"}
        for role, base in OPEN.items():
            self.names[base] = f"<{SHORT[role]}"
            self.names[base + 99] = f"{SHORT[role]}>"

    def body(self, role: str, text: str) -> int:
        if (role, text) not in self.bodies:
            used = sum(1 for r, _ in self.bodies if r == role)
            self.bodies[(role, text)] = OPEN[role] + 1 + used
            self.names[OPEN[role] + 1 + used] = f"{SHORT[role]}:{text}"
        return self.bodies[(role, text)]

    def render(self, messages: list[dict]) -> list[int]:
        ids = []
        for m in messages:
            ids += [OPEN[m["role"]], self.body(m["role"], m["content"]), OPEN[m["role"]] + 99]
        return ids + [GEN]

    def reply(self, text: str) -> list[int]:
        return [self.body("assistant", text), GEN + 99]

    def show(self, sample: TreeSample) -> str:
        start = len(sample.token_ids) - sample.response_length
        marks = [""] * start + ["+" if m else "" for m in sample.loss_mask]
        return " ".join(mark + self.names[t] for mark, t in zip(marks, sample.token_ids))


def m(role: str, text: str) -> dict:
    return {"role": role, "content": text}


SYS, USR = m("system", "brief"), m("user", "hello")


def say(
    mgr: TrajectoryManager,
    toy: Toy,
    sid: str,
    history: list[dict],
    reply: str | None,
    *,
    prompt: list[int] | None = None,
    output: list[int] | None = None,
    lp: list[float] | None = None,
    finish: str = "stop",
) -> tuple[list[int], list[int]]:
    """Record one turn: prompt rendered from `history` unless given; the reply's message is `m(assistant, reply)`."""
    p = list(prompt) if prompt is not None else toy.render(history)
    r = list(output) if output is not None else (toy.reply(reply) if reply is not None else [])
    mgr.record_turn(
        sid,
        turn=TurnRecord(p, r, finish, tuple(lp or ())),
        prompt_messages=history,
        response_message=m("assistant", reply) if reply is not None else None,
    )
    return p, r


def inserted(ids: list[int], at: int) -> list[int]:
    return ids[:at] + [INSERTED] + ids[at:]


def replaced(ids: list[int], at: int) -> list[int]:
    return ids[:at] + [REPLACED] + ids[at + 1 :]


def finish(mgr: TrajectoryManager, sid: str, reward: float = 1.0, **kw) -> list[TreeSample]:
    samples = mgr.get_trajectory(sid, base_sample=BaseSample(index=0), reward=reward, **kw)
    for s in samples:
        assert len(s.loss_mask) == len(s.logprobs) == s.response_length
        assert sum(s.loss_mask) > 0, "a fully masked sample was emitted"
        assert s.reward == reward
    return samples


def leaves(mgr: TrajectoryManager, sid: str):
    return [leaf for leaf in mgr.root(sid).leaves() if not leaf.is_root]


PREFIX = "<sys sys:brief sys> <usr usr:hello usr> <ai"


# ---- group 1: the routing tree -----------------------------------------------------------------


def test_slime_1_1_single_turn_chain():
    mgr, toy = TrajectoryManager(), Toy()
    say(mgr, toy, "s", [SYS, USR], "sum")
    chain = leaves(mgr, "s")[0].path_from_root()
    assert [n.role for n in chain] == ["system", "user", "assistant"]
    assert chain[-1].turn_index == 1
    samples = finish(mgr, "s")
    assert [toy.show(s) for s in samples] == [f"{PREFIX} +ai:sum +ai>"]


def test_slime_1_2_clean_multiturn_with_tool():
    mgr, toy = TrajectoryManager(), Toy()
    say(mgr, toy, "s", [SYS, USR], "ls", finish="tool_calls")
    say(mgr, toy, "s", [SYS, USR, m("assistant", "ls"), m("tool", "a.txt")], "done")
    chain = leaves(mgr, "s")[0].path_from_root()
    assert [n.role for n in chain] == ["system", "user", "assistant", "tool", "assistant"]
    assert mgr.turn_count("s") == 2
    samples = finish(mgr, "s")
    assert [toy.show(s) for s in samples] == [f"{PREFIX} +ai:ls +ai> <tool tool:a.txt tool> <ai +ai:done +ai>"]


def test_slime_1_3_system_fork():
    mgr, toy = TrajectoryManager(), Toy()
    for text in ("terse", "chatty"):
        say(mgr, toy, "s", [m("system", text), USR], "hi")
    assert len(mgr.root("s").children) == 2
    assert len(leaves(mgr, "s")) == 2
    assert [toy.show(s) for s in finish(mgr, "s")] == [
        "<sys sys:terse sys> <usr usr:hello usr> <ai +ai:hi +ai>",
        "<sys sys:chatty sys> <usr usr:hello usr> <ai +ai:hi +ai>",
    ]


def test_slime_1_4_user_fork_shared_system():
    mgr, toy = TrajectoryManager(), Toy()
    say(mgr, toy, "s", [SYS, m("user", "north")], "n")
    say(mgr, toy, "s", [SYS, m("user", "south")], "s")
    root = mgr.root("s")
    assert len(root.children) == 1 and len(root.children[0].children) == 2
    assert [toy.show(s) for s in finish(mgr, "s")] == [
        "<sys sys:brief sys> <usr usr:north usr> <ai +ai:n +ai>",
        "<sys sys:brief sys> <usr usr:south usr> <ai +ai:s +ai>",
    ]


def test_slime_1_5_assistant_message_fork():
    mgr, toy = TrajectoryManager(), Toy()
    say(mgr, toy, "s", [SYS, USR], "first")
    say(mgr, toy, "s", [SYS, USR], "second")
    user_node = mgr.root("s").children[0].children[0]
    assert len(user_node.children) == 2
    assert [toy.show(s) for s in finish(mgr, "s")] == [f"{PREFIX} +ai:first +ai>", f"{PREFIX} +ai:second +ai>"]


def test_slime_1_6_tool_fork_shared_assistant():
    mgr, toy = TrajectoryManager(), Toy()
    call = m("assistant", "grep")
    say(mgr, toy, "s", [SYS, USR], "grep", finish="tool_calls")
    say(mgr, toy, "s", [SYS, USR, call, m("tool", "hit")], "found")
    say(mgr, toy, "s", [SYS, USR, call, m("tool", "miss")], "none")
    shared = mgr.root("s").children[0].children[0].children[0]
    assert shared.role == "assistant" and shared.turn is not None and len(shared.children) == 2
    assert [toy.show(s) for s in finish(mgr, "s")] == [
        f"{PREFIX} +ai:grep +ai> <tool tool:hit tool> <ai +ai:found +ai>",
        f"{PREFIX} ai:grep ai> <tool tool:miss tool> <ai +ai:none +ai>",
    ]


def test_slime_1_7_token_only_drift_no_fork():
    mgr, toy = TrajectoryManager(), Toy()
    p1, _ = say(mgr, toy, "s", [SYS, USR], "one")
    tampered = inserted(p1, 1)
    say(mgr, toy, "s", [SYS, USR], "two", prompt=tampered)
    assert len(mgr.root("s").children) == 1
    assert len(mgr.root("s").children[0].children[0].children) == 2
    samples = finish(mgr, "s")
    assert [toy.show(s) for s in samples] == [
        f"{PREFIX} +ai:one +ai>",
        "<sys %drift% sys:brief sys> <usr usr:hello usr> <ai +ai:two +ai>",
    ]
    assert INSERTED in samples[1].token_ids
    assert INSERTED not in samples[1].token_ids[len(tampered) :]


def test_slime_1_8_multi_tool_per_turn():
    mgr, toy = TrajectoryManager(), Toy()
    first, second = m("tool", "r1"), m("tool", "r2")
    say(mgr, toy, "s", [SYS, USR], "both", finish="tool_calls")
    say(mgr, toy, "s", [SYS, USR, m("assistant", "both"), first, second], "merged")
    chain = leaves(mgr, "s")[0].path_from_root()
    assert [n.role for n in chain] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert chain[3].message == first and chain[4].message == second
    assert [toy.show(s) for s in finish(mgr, "s")] == [
        f"{PREFIX} +ai:both +ai> <tool tool:r1 tool> <tool tool:r2 tool> <ai +ai:merged +ai>"
    ]


def test_slime_1_9_cross_sid_isolation():
    mgr, toy = TrajectoryManager(), Toy()
    say(mgr, toy, "left", [SYS, m("user", "L")], "l")
    say(mgr, toy, "right", [SYS, m("user", "R")], "r")
    assert len(leaves(mgr, "left")) == 1 and len(leaves(mgr, "right")) == 1
    assert mgr.root("left") is not mgr.root("right")
    assert [toy.show(s) for s in finish(mgr, "left")] == ["<sys sys:brief sys> <usr usr:L usr> <ai +ai:l +ai>"]
    assert [toy.show(s) for s in finish(mgr, "right")] == ["<sys sys:brief sys> <usr usr:R usr> <ai +ai:r +ai>"]


def test_slime_1_10_empty_response():
    mgr, toy = TrajectoryManager(), Toy()
    say(mgr, toy, "s", [SYS, USR], None, finish="length")
    leaf = leaves(mgr, "s")[0]
    assert leaf.role == "assistant" and list(leaf.turn.output_ids) == [] and leaf.message is None
    assert finish(mgr, "s") == []


# ---- group 2: linearization --------------------------------------------------------------------


def test_slime_2_1_single_turn_linearize():
    mgr, toy = TrajectoryManager(), Toy()
    _, r = say(mgr, toy, "s", [SYS, USR], "yes")
    leaf = leaves(mgr, "s")[0]
    leaf.turn = dataclasses.replace(leaf.turn, output_log_probs=[-0.25] * len(r))
    samples = mgr.get_trajectory("s", base_sample=BaseSample(index=7, prompt="hi"), reward=1.0)
    assert [toy.show(s) for s in samples] == [f"{PREFIX} +ai:yes +ai>"]
    assert samples[0].logprobs == [-0.25, -0.25]
    assert samples[0].reward == 1.0 and samples[0].index == 7 and samples[0].prompt == "hi"


def test_slime_2_2_clean_multiturn_linearize():
    mgr, toy = TrajectoryManager(), Toy()
    p1, r1 = say(mgr, toy, "s", [SYS, USR], "cat", finish="tool_calls", lp=[-0.5, -0.6])
    p2, r2 = say(mgr, toy, "s", [SYS, USR, m("assistant", "cat"), m("tool", "text")], "ok", lp=[-0.7, -0.8])
    (sample,) = finish(mgr, "s")
    assert toy.show(sample) == f"{PREFIX} +ai:cat +ai> <tool tool:text tool> <ai +ai:ok +ai>"
    bridge = len(p2) - len(p1 + r1)
    assert bridge == 4
    assert sample.logprobs == [-0.5, -0.6] + [0.0] * bridge + [-0.7, -0.8]


def _two_turn_drift(mgr, toy, *, drift_at, replace: bool, lp=True):
    """Turn 1 calls a tool; turn 2's prompt is the honest render with one drift marker."""
    call = m("assistant", "run")
    p1, r1 = say(mgr, toy, "s", [SYS, USR], "run", finish="tool_calls", lp=[-0.5, -0.5] if lp else None)
    honest = toy.render([SYS, USR, call, m("tool", "out")])
    at = drift_at(p1, r1)
    p2 = replaced(honest, at) if replace else inserted(honest, at)
    say(mgr, toy, "s", [SYS, USR, call, m("tool", "out")], "fin", prompt=p2, lp=[-0.4, -0.4] if lp else None)
    return p1, r1, p2


def test_slime_2_3_drift_case_a_forks():
    mgr, toy = TrajectoryManager(), Toy()
    _two_turn_drift(mgr, toy, drift_at=lambda p1, r1: len(p1) - 1, replace=False)
    samples = finish(mgr, "s")
    assert [toy.show(s) for s in samples] == [
        f"{PREFIX} +ai:run +ai>",
        "<sys sys:brief sys> <usr usr:hello usr> %drift% <ai ai:run ai> <tool tool:out tool> <ai +ai:fin +ai>",
    ]


def test_slime_2_4_drift_case_b1_short_replaces():
    mgr, toy = TrajectoryManager(), Toy()
    p1, r1, p2 = _two_turn_drift(mgr, toy, drift_at=lambda p1, r1: len(p1) + len(r1) - 1, replace=True)
    assert common_prefix_len(p1 + r1, p2) == len(p1) + len(r1) - 1
    (sample,) = finish(mgr, "s")
    # the whole turn-1 response span becomes context, not only the drifted token
    assert toy.show(sample) == f"{PREFIX} ai:run %drift% <tool tool:out tool> <ai +ai:fin +ai>"
    assert sample.logprobs == [0.0] * (len(p2) - len(p1)) + [-0.4, -0.4]


def test_slime_2_5_drift_case_b1_long_forks():
    mgr, toy = TrajectoryManager(fork_threshold=1), Toy()
    _two_turn_drift(mgr, toy, drift_at=lambda p1, r1: len(p1) + len(r1) - 1, replace=True, lp=False)
    assert [toy.show(s) for s in finish(mgr, "s")] == [
        f"{PREFIX} +ai:run +ai>",
        f"{PREFIX} ai:run %drift% <tool tool:out tool> <ai +ai:fin +ai>",
    ]


def test_slime_2_6_drift_case_b1_threshold_zero_forks():
    mgr, toy = TrajectoryManager(fork_threshold=0), Toy()
    _two_turn_drift(mgr, toy, drift_at=lambda p1, r1: len(p1) + len(r1) - 1, replace=True, lp=False)
    assert [toy.show(s) for s in finish(mgr, "s")] == [
        f"{PREFIX} +ai:run +ai>",
        f"{PREFIX} ai:run %drift% <tool tool:out tool> <ai +ai:fin +ai>",
    ]


def test_slime_2_7_drift_case_b2_earlier_turn_forks():
    mgr, toy = TrajectoryManager(), Toy()
    a1, t1, a2, t2 = m("assistant", "s1"), m("tool", "o1"), m("assistant", "s2"), m("tool", "o2")
    p1, r1 = say(mgr, toy, "s", [SYS, USR], "s1", finish="tool_calls", lp=[-0.5] * 2)
    say(mgr, toy, "s", [SYS, USR, a1, t1], "s2", finish="tool_calls", lp=[-0.4] * 2)
    p3 = replaced(toy.render([SYS, USR, a1, t1, a2, t2]), len(p1) + len(r1) - 1)
    say(mgr, toy, "s", [SYS, USR, a1, t1, a2, t2], "s3", prompt=p3, lp=[-0.3] * 2)
    assert [toy.show(s) for s in finish(mgr, "s")] == [
        f"{PREFIX} +ai:s1 +ai> <tool tool:o1 tool> <ai +ai:s2 +ai>",
        f"{PREFIX} ai:s1 %drift% <tool tool:o1 tool> <ai ai:s2 ai> <tool tool:o2 tool> <ai +ai:s3 +ai>",
    ]


def test_slime_2_8_fork_reward():
    mgr, toy = TrajectoryManager(), Toy()
    _two_turn_drift(mgr, toy, drift_at=lambda p1, r1: len(p1) - 1, replace=False, lp=False)
    samples = finish(mgr, "s", reward=0.75)
    assert len(samples) == 2 and [s.reward for s in samples] == [0.75, 0.75]


def test_slime_2_9_two_leaves_reward():
    mgr, toy = TrajectoryManager(), Toy()
    say(mgr, toy, "s", [SYS, m("user", "x")], "x")
    say(mgr, toy, "s", [SYS, m("user", "y")], "y")
    samples = finish(mgr, "s", reward=-2.0)
    assert [toy.show(s) for s in samples] == [
        "<sys sys:brief sys> <usr usr:x usr> <ai +ai:x +ai>",
        "<sys sys:brief sys> <usr usr:y usr> <ai +ai:y +ai>",
    ]
    assert [s.reward for s in samples] == [-2.0, -2.0]


def test_slime_2_10_cross_leaf_dedup():
    mgr, toy = TrajectoryManager(), Toy()
    call = m("assistant", "ask")
    p1, _ = say(mgr, toy, "s", [SYS, USR], "ask", finish="tool_calls", lp=[-0.5] * 2)
    say(mgr, toy, "s", [SYS, USR, call, m("tool", "yes")], "go", lp=[-0.4] * 2)
    p3, r3 = say(mgr, toy, "s", [SYS, USR, call, m("tool", "no")], "stop", lp=[-0.3] * 2)
    samples = finish(mgr, "s")
    assert [toy.show(s) for s in samples] == [
        f"{PREFIX} +ai:ask +ai> <tool tool:yes tool> <ai +ai:go +ai>",
        f"{PREFIX} ai:ask ai> <tool tool:no tool> <ai +ai:stop +ai>",
    ]
    assert samples[1].logprobs == [0.0] * (len(p3) - len(p1)) + [-0.3] * len(r3)


def test_slime_2_11_routing_only_assistant_filtered():
    mgr, toy = TrajectoryManager(), Toy()
    a1, t1, a2 = m("assistant", "s1"), m("tool", "o1"), m("assistant", "s2")
    foreign, t2 = m("assistant", "alien"), m("tool", "o2")
    say(mgr, toy, "s", [SYS, USR], "s1", finish="tool_calls")
    say(mgr, toy, "s", [SYS, USR, a1, t1], "s2", finish="tool_calls")
    say(mgr, toy, "s", [SYS, USR, a1, t1, a2, foreign, t2], "s3")
    (leaf,) = leaves(mgr, "s")
    routing = [n for n in leaf.path_from_root() if n.role == "assistant" and n.turn is None]
    assert [n.message["content"] for n in routing] == ["alien"]
    assert [toy.show(s) for s in finish(mgr, "s")] == [
        f"{PREFIX} +ai:s1 +ai> <tool tool:o1 tool> <ai +ai:s2 +ai> <ai ai:alien ai> <tool tool:o2 tool> <ai +ai:s3 +ai>"
    ]


def test_slime_2_12_drop_clears_sid():
    mgr, toy = TrajectoryManager(), Toy()
    say(mgr, toy, "s", [SYS, USR], "a")
    assert mgr.has_session("s")
    assert [toy.show(s) for s in finish(mgr, "s")] == [f"{PREFIX} +ai:a +ai>"]
    assert not mgr.has_session("s")
    assert mgr.get_trajectory("s", base_sample=BaseSample()) == []


# ---- group 3: both layers ----------------------------------------------------------------------


def test_slime_3_1_rewrite_merge_absorbs_short():
    mgr, toy = TrajectoryManager(), Toy()
    rewritten = m("assistant", "ok!")
    say(mgr, toy, "s", [SYS, USR], "ok", finish="tool_calls", lp=[-0.5] * 2)
    say(mgr, toy, "s", [SYS, USR, rewritten, m("tool", "t")], "done", lp=[-0.4] * 2)
    (leaf,) = leaves(mgr, "s")
    merged = leaf.path_from_root()[2]
    assert merged.turn is None and merged.turn_index is None and merged.message == rewritten
    assert merged.metadata["merged_rewrite"] == {"abandoned_turn_index": 1, "abandoned_response_tokens": 2}
    assert [toy.show(s) for s in finish(mgr, "s")] == [f"{PREFIX} ai:ok! ai> <tool tool:t tool> <ai +ai:done +ai>"]


def test_slime_3_2_rewrite_merge_long_forks():
    mgr, toy = TrajectoryManager(fork_threshold=1), Toy()
    say(mgr, toy, "s", [SYS, USR], "ok", finish="tool_calls")
    say(mgr, toy, "s", [SYS, USR, m("assistant", "ok?"), m("tool", "t")], "done")
    assert len(leaves(mgr, "s")) == 2
    assert [toy.show(s) for s in finish(mgr, "s")] == [
        f"{PREFIX} +ai:ok +ai>",
        f"{PREFIX} ai:ok? ai> <tool tool:t tool> <ai +ai:done +ai>",
    ]


def test_slime_3_3_rewrite_merge_threshold_zero_forks():
    mgr, toy = TrajectoryManager(fork_threshold=0), Toy()
    say(mgr, toy, "s", [SYS, USR], "ok", finish="tool_calls")
    say(mgr, toy, "s", [SYS, USR, m("assistant", "ok."), m("tool", "t")], "done")
    assert len(leaves(mgr, "s")) == 2
    assert [toy.show(s) for s in finish(mgr, "s")] == [
        f"{PREFIX} +ai:ok +ai>",
        f"{PREFIX} ai:ok. ai> <tool tool:t tool> <ai +ai:done +ai>",
    ]


def test_slime_3_4_rewrite_merge_ambiguous_forks():
    mgr, toy = TrajectoryManager(), Toy()
    say(mgr, toy, "s", [SYS, USR], "p")
    say(mgr, toy, "s", [SYS, USR], "q")
    say(mgr, toy, "s", [SYS, USR, m("assistant", "r"), m("tool", "t")], "z")
    assert len(leaves(mgr, "s")) == 3
    assert [toy.show(s) for s in finish(mgr, "s")] == [
        f"{PREFIX} +ai:p +ai>",
        f"{PREFIX} +ai:q +ai>",
        f"{PREFIX} ai:r ai> <tool tool:t tool> <ai +ai:z +ai>",
    ]
    counters = mgr.pop_stats("s").counters
    assert (counters["ambiguous_merges"], counters["rewrite_merges"], counters["tree_branches"]) == (1, 0, 2)


def test_slime_3_5_rewrite_merge_match_key_updated():
    mgr, toy = TrajectoryManager(), Toy()
    rewritten, t1, a2, t2 = m("assistant", "hey "), m("tool", "o1"), m("assistant", "next"), m("tool", "o2")
    say(mgr, toy, "s", [SYS, USR], "hey", finish="tool_calls")
    say(mgr, toy, "s", [SYS, USR, rewritten, t1], "next", finish="tool_calls", lp=[-0.4] * 2)
    say(mgr, toy, "s", [SYS, USR, rewritten, t1, a2, t2], "last", lp=[-0.3] * 2)
    assert len(leaves(mgr, "s")) == 1
    assert [toy.show(s) for s in finish(mgr, "s")] == [
        f"{PREFIX} ai:hey  ai> <tool tool:o1 tool> <ai +ai:next +ai> <tool tool:o2 tool> <ai +ai:last +ai>"
    ]


def test_slime_3_6_tree_fork_plus_token_drift():
    mgr, toy = TrajectoryManager(), Toy()
    call, hit, miss, step, more = (
        m("assistant", "call"),
        m("tool", "hit"),
        m("tool", "miss"),
        m("assistant", "step"),
        m("tool", "more"),
    )
    p1, _ = say(mgr, toy, "s", [SYS, USR], "call", finish="tool_calls", lp=[-0.5] * 2)
    say(mgr, toy, "s", [SYS, USR, call, hit], "step", finish="tool_calls", lp=[-0.4] * 2)
    p3 = inserted(toy.render([SYS, USR, call, hit, step, more]), len(p1) - 1)
    say(mgr, toy, "s", [SYS, USR, call, hit, step, more], "end", prompt=p3, lp=[-0.2] * 2)
    say(mgr, toy, "s", [SYS, USR, call, miss], "alt", lp=[-0.1] * 2)
    assert [toy.show(s) for s in finish(mgr, "s")] == [
        f"{PREFIX} +ai:call +ai> <tool tool:hit tool> <ai +ai:step +ai>",
        "<sys sys:brief sys> <usr usr:hello usr> %drift% <ai ai:call ai> <tool tool:hit tool> <ai ai:step ai> "
        "<tool tool:more tool> <ai +ai:end +ai>",
        f"{PREFIX} ai:call ai> <tool tool:miss tool> <ai +ai:alt +ai>",
    ]


def test_slime_3_7_deep_multi_leaf_dedup():
    mgr, toy = TrajectoryManager(), Toy()
    a1, t1, a2 = m("assistant", "s1"), m("tool", "o1"), m("assistant", "s2")
    say(mgr, toy, "s", [SYS, USR], "s1", finish="tool_calls", lp=[-0.5] * 2)
    say(mgr, toy, "s", [SYS, USR, a1, t1], "s2", finish="tool_calls", lp=[-0.4] * 2)
    for label in ("x", "y", "z"):
        say(mgr, toy, "s", [SYS, USR, a1, t1, a2, m("tool", label)], f"end{label}", lp=[-0.3] * 2)
    shared = f"{PREFIX} ai:s1 ai> <tool tool:o1 tool> <ai ai:s2 ai>"
    assert [toy.show(s) for s in finish(mgr, "s")] == [
        f"{PREFIX} +ai:s1 +ai> <tool tool:o1 tool> <ai +ai:s2 +ai> <tool tool:x tool> <ai +ai:endx +ai>",
        f"{shared} <tool tool:y tool> <ai +ai:endy +ai>",
        f"{shared} <tool tool:z tool> <ai +ai:endz +ai>",
    ]


def test_slime_3_8_long_mixed_session():
    """The reference's comment calls turn 4 a REALIGN; the real classification sequence (docs/upstream_tree.md#the-two-layers) is
    CLEAN, CLEAN, CLEAN, FORK, FORK: turn 4's drift lands in the new prompt tail, so it is CLEAN and the
    marker becomes context; turn 5 then diverges before the last response and forks."""
    mgr, toy = TrajectoryManager(), Toy()
    lp = [-0.5, -0.5]
    history = [SYS, USR]
    p1, _ = say(mgr, toy, "s", history, "a0", finish="tool_calls", lp=lp)
    for i in (1, 2):
        history = history + [m("assistant", f"a{i - 1}"), m("tool", f"t{i - 1}")]
        say(mgr, toy, "s", history, f"a{i}", finish="tool_calls", lp=lp)
    history = history + [m("assistant", "a2"), m("tool", "t2")]
    honest = toy.render(history)
    say(mgr, toy, "s", history, "a3", prompt=replaced(honest, len(honest) - 2), finish="tool_calls", lp=lp)
    history = history + [m("assistant", "a3"), m("tool", "t3")]
    say(mgr, toy, "s", history, "a4", finish="tool_calls", lp=lp)
    history = history + [m("assistant", "a4"), m("tool", "t4")]
    say(mgr, toy, "s", history, "a5", prompt=inserted(toy.render(history), len(p1) - 1), lp=lp)
    samples = finish(mgr, "s")
    stats = mgr.pop_stats("s")
    body = (
        "ai:a0 ai> <tool tool:t0 tool> <ai ai:a1 ai> <tool tool:t1 tool> <ai ai:a2 ai> "
        "<tool tool:t2 tool> <ai ai:a3 ai> <tool tool:t3 tool> <ai"
    )
    assert [toy.show(s) for s in samples] == [
        f"{PREFIX} +ai:a0 +ai> <tool tool:t0 tool> <ai +ai:a1 +ai> <tool tool:t1 tool> <ai +ai:a2 +ai> "
        "<tool tool:t2 %drift% <ai +ai:a3 +ai>",
        f"{PREFIX} {body} +ai:a4 +ai>",
        f"<sys sys:brief sys> <usr usr:hello usr> %drift% <ai {body} ai:a4 ai> <tool tool:t4 tool> <ai +ai:a5 +ai>",
    ]
    assert (stats.counters["drift_clean"], stats.counters["drift_realign"], stats.counters["drift_fork"]) == (3, 0, 2)


# ---- group 4: boundaries -----------------------------------------------------------------------


def _mismatched_turn(toy: Toy) -> TurnRecord:
    return TurnRecord(toy.render([SYS, USR]), [401, 402, 403], "stop", (-0.1, -0.2))


def test_slime_4_2_logprobs_length_mismatch_raises():
    toy = Toy()
    with pytest.raises(AssertionError, match="output_log_probs"):
        TrajectoryManager(safe_edges=False).record_turn(
            "s", turn=_mismatched_turn(toy), prompt_messages=[SYS, USR], response_message=m("assistant", "x")
        )
    with pytest.raises(LogprobsLengthMismatch, match="output_log_probs has 2 entries but output_ids has 3") as err:
        TrajectoryManager().record_turn(
            "s", turn=_mismatched_turn(toy), prompt_messages=[SYS, USR], response_message=m("assistant", "x")
        )
    assert isinstance(err.value, ReplayError) and isinstance(err.value, ValueError)


def test_slime_4_3_empty_prompt_messages_skipped():
    mgr = TrajectoryManager()
    mgr.record_turn("s", turn=TurnRecord([1], [2]), prompt_messages=[], response_message=None)
    assert mgr.turn_count("s") == 0 and not mgr.has_session("s")
    assert mgr.get_trajectory("s", base_sample=BaseSample()) == []


def test_slime_4_4_default_base_sample():
    mgr, toy = TrajectoryManager(), Toy()
    say(mgr, toy, "s", [SYS, USR], "a")
    with pytest.raises(TypeError):
        mgr.get_trajectory("s", reward=1.0)  # base_sample is required and keyword-only
    assert mgr.has_session("s")


def test_slime_4_5_mixed_logprobs_across_turns():
    mgr, toy = TrajectoryManager(), Toy()
    p1, r1 = say(mgr, toy, "s", [SYS, USR], "get", finish="tool_calls", lp=[-0.5, -0.5])
    p2, r2 = say(mgr, toy, "s", [SYS, USR, m("assistant", "get"), m("tool", "v")], "put", lp=None)
    (sample,) = finish(mgr, "s")
    assert toy.show(sample) == f"{PREFIX} +ai:get +ai> <tool tool:v tool> <ai +ai:put +ai>"
    assert sample.logprobs == [-0.5, -0.5] + [0.0] * (len(p2) - len(p1 + r1)) + [0.0, 0.0]


def _boundary(threshold: int, new_len: int):
    mgr, toy = TrajectoryManager(fork_threshold=threshold), Toy()
    p1 = toy.render([SYS, USR])
    r1 = [451, 452, 453, 454]
    mgr.record_turn(
        "s", turn=TurnRecord(p1, r1, "tool_calls"), prompt_messages=[SYS, USR], response_message=m("assistant", "four")
    )
    history = [SYS, USR, m("assistant", "four"), m("tool", "t")]
    p2 = replaced(p1 + r1 + [300, toy.body("tool", "t"), 399, GEN], len(p1) + len(r1) - 1)
    r2 = [460 + i for i in range(new_len)]
    mgr.record_turn("s", turn=TurnRecord(p2, r2), prompt_messages=history, response_message=m("assistant", "x"))
    return finish(mgr, "s"), p1, r1, p2, r2


def test_slime_4_6_drift_b1_threshold_boundary():
    forked, p1, r1, p2, r2 = _boundary(threshold=2, new_len=2)  # len(r2) == threshold: FORK
    assert [s.token_ids for s in forked] == [p1 + r1, p2 + r2]
    assert [s.loss_mask for s in forked] == [[1] * 4, [1] * 2]
    (realigned,), p1, r1, p2, r2 = _boundary(threshold=3, new_len=2)  # len(r2) < threshold: REALIGN
    assert realigned.token_ids == p2 + r2
    assert realigned.loss_mask == [0] * (len(p2) - len(p1)) + [1] * len(r2)


def test_rewrite_merge_threshold_boundary():
    """Not an upstream case: the merge needs `len(output) < fork_threshold`, strictly (docs/upstream_tree.md#the-two-layers)."""

    def leaves_after_rewrite(threshold: int) -> int:
        mgr, toy = TrajectoryManager(fork_threshold=threshold), Toy()  # the reply is 2 tokens long
        say(mgr, toy, "s", [SYS, USR], "ok", finish="tool_calls")
        say(mgr, toy, "s", [SYS, USR, m("assistant", "OK"), m("tool", "t")], "done")
        return len(leaves(mgr, "s"))

    assert [leaves_after_rewrite(t) for t in (2, 3)] == [2, 1]
