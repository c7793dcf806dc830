"""`message-graph` against verifiers' own graph code (verifiers==0.4.0 `verifiers/v1/graph.py`).

A thin shim loads upstream's graph module from an unpacked verifiers 0.4.0 (the directory named
by `VERIFIERS_SRC`, the one holding `verifiers/v1/graph.py`; `pip download verifiers==0.4.0
--no-deps` and unzip it), without verifiers' package init and with the `renderers` import
stubbed, since a message graph needs neither. Random sessions (re-rendered histories, rewritten
echoes, dropped reasoning, compactions, retries) are committed turn by turn into upstream's
graph, with no per-message spans as recorded dumps have none, and into ours; the branches, and
the masks after prime-rl's train-once rule, must be equal. The project does not depend on
verifiers: without `VERIFIERS_SRC` the pinned wheel is downloaded from the package index into the
test's temporary folder and unpacked there; only where the index cannot be reached is the test
skipped, saying so (and under CI, where the index can be reached, it fails instead).
"""

from __future__ import annotations

import importlib
import os
import random
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from trace_tools.strategies.message_graph_core import MessageGraph, trainable_branches


def _unpacked_verifiers(folder: Path) -> Path:
    """verifiers 0.4.0's wheel from the package index, unpacked into `folder`."""
    import subprocess
    import zipfile

    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(folder)]
    done = subprocess.run([*command, "verifiers==0.4.0"], capture_output=True, text=True, timeout=300)
    wheels = sorted(folder.glob("verifiers-0.4.0-*.whl"))
    if done.returncode or not wheels:
        message = f"verifiers 0.4.0 could not be downloaded: {done.stderr.strip()[-200:]}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with zipfile.ZipFile(wheels[0]) as wheel:
        wheel.extractall(folder)
    return folder


@pytest.fixture(scope="module")
def upstream(tmp_path_factory) -> Any:
    named = os.environ.get("VERIFIERS_SRC")
    source = Path(named) if named else _unpacked_verifiers(tmp_path_factory.mktemp("verifiers"))
    if not (source / "verifiers" / "v1" / "graph.py").is_file():
        pytest.fail(f"{source} holds no verifiers/v1/graph.py: set VERIFIERS_SRC to an unpacked verifiers 0.4.0")
    stubs = {
        "renderers": ModuleType("renderers"),
        "renderers.base": ModuleType("renderers.base"),
        "verifiers": ModuleType("verifiers"),
        "verifiers.v1": ModuleType("verifiers.v1"),
    }
    stubs["renderers.base"].RenderedTokens = object  # type: ignore[attr-defined]
    stubs["verifiers"].__path__ = [str(source / "verifiers")]  # type: ignore[attr-defined]
    stubs["verifiers.v1"].__path__ = [str(source / "verifiers" / "v1")]  # type: ignore[attr-defined]
    saved = {name: sys.modules.get(name) for name in stubs}
    sys.modules.update(stubs)
    try:
        yield SimpleNamespace(
            graph=importlib.import_module("verifiers.v1.graph"), types=importlib.import_module("verifiers.v1.types")
        )
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        for name in [n for n in sys.modules if n.startswith("verifiers.")]:
            sys.modules.pop(name)


class UpstreamTrace:
    """The attributes of `vf.Trace` that the graph functions touch."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self._head_index: dict = {}
        self.tools: list = []
        self.mm_token_type_id_map: dict = {}

    def clear_preview(self, key: object) -> None:
        pass


def typed(types: Any, message: dict) -> Any:
    role = message["role"]
    if role == "assistant":
        calls = [
            types.ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
            for c in message.get("tool_calls") or ()
        ]
        return types.AssistantMessage(
            content=message.get("content"),
            reasoning_content=message.get("reasoning_content"),
            tool_calls=calls or None,
        )
    if role == "tool":
        return types.ToolMessage(content=message["content"], tool_call_id=message["tool_call_id"])
    return {"system": types.SystemMessage, "user": types.UserMessage}[role](content=message["content"])


def upstream_branches(upstream: Any, turns: list[tuple]) -> list[tuple[list[int], list[int]]]:
    """Commit every turn into verifiers' graph; each branch's ids and prime-rl's train-once mask."""
    trace = UpstreamTrace()
    for messages, prompt_ids, reply, completion in turns:
        tokens = upstream.types.TurnTokens(
            prompt_ids=prompt_ids, completion_ids=completion, completion_logprobs=[0.0] * len(completion)
        )
        response = upstream.types.Response(
            id="r", created=0, model="m", message=typed(upstream.types, reply), finish_reason="stop", tokens=tokens
        )
        upstream.graph.prepare_turn(trace, [typed(upstream.types, m) for m in messages]).commit(response)
    trained: set[int] = set()
    branches = []
    for leaf in upstream.graph.leaves(trace):
        path, node_id = [], leaf
        while node_id is not None:
            path.append(node_id)
            node_id = trace.nodes[node_id].parent
        ids: list[int] = []
        mask: list[int] = []
        for node_id in reversed(path):
            node = trace.nodes[node_id]
            again = node.sampled and any(node.mask) and node_id in trained
            if node.sampled and any(node.mask):
                trained.add(node_id)
            ids += node.token_ids
            mask += [0 if again else int(m) for m in node.mask]
        if any(mask):
            branches.append((ids, mask))
    return branches


def ours(turns: list[tuple]) -> list[tuple[list[int], list[int]]]:
    graph = MessageGraph()
    for n, (messages, prompt_ids, reply, completion) in enumerate(turns):
        graph.commit(messages, None, prompt_ids, reply, completion, [], n)
    return [(b.token_ids, b.loss_mask) for b in trainable_branches(graph)]


def random_session(rng: random.Random) -> list[tuple]:
    """Turns of an agent loop whose prompts are the served ids, except where the history is
    re-rendered: a reply echoed without its reasoning, with reordered arguments, a drifted id,
    a compaction that restarts from a summary, a retry of the same request, or a rewind to an
    earlier one."""
    vocab = iter(range(1000, 10**6))
    system = {"role": "system", "content": "sys"}
    history: list[dict] = [system, {"role": "user", "content": "task"}]
    served: list[int] = [next(vocab) for _ in range(4)]
    turns: list[tuple] = []
    for n in range(rng.randint(3, 9)):
        prompt_ids = served + [7]  # 7: the generation prompt
        completion = [next(vocab) for _ in range(rng.randint(0, 4))]
        call = {"id": f"c{n}", "function": {"name": "run", "arguments": '{"a": 1, "b": 2}'}}
        reply = {"role": "assistant", "content": None, "reasoning_content": f"think {n}", "tool_calls": [call]}
        turns.append((list(history), prompt_ids, reply, completion))
        if rng.random() < 0.2:
            continue  # a retry: the same request again
        if turns and rng.random() < 0.2:  # a rewind: an earlier request sent again
            messages, ids, _, _ = rng.choice(turns)
            turns.append((messages, ids, reply, [next(vocab)]))
        echo = dict(reply)
        choice = rng.random()
        echoed_ids = prompt_ids + completion
        if choice < 0.2:
            echo.pop("reasoning_content")
        elif choice < 0.35:
            echo["tool_calls"] = [{"id": f"c{n}", "function": {"name": "run", "arguments": '{"b":2,"a":1}'}}]
            echo["content"] = ""
        elif choice < 0.5 and echoed_ids:
            echoed_ids = echoed_ids[:-1] + [5]  # the echo re-renders to different ids
        tool = {"role": "tool", "content": f"out {n}", "tool_call_id": f"c{n}"}
        history = [*history, echo, tool]
        served = echoed_ids + [next(vocab), next(vocab)]
        if rng.random() < 0.1:
            history = [system, {"role": "user", "content": f"summary {n}"}]
            served = [next(vocab) for _ in range(3)]
    return turns


@pytest.mark.parametrize("seed", range(40))
def test_branches_and_masks_equal_verifiers_graph(upstream, seed):
    turns = random_session(random.Random(seed))
    assert ours(turns) == upstream_branches(upstream, turns)


def test_the_hash_rules_are_upstreams(upstream):
    from trace_tools.strategies.message_graph_core import message_key

    pairs = [
        ({"role": "assistant", "content": None}, {"role": "assistant", "content": ""}),
        (
            {
                "role": "assistant",
                "tool_calls": [{"id": "x", "function": {"name": "f", "arguments": '{"b": 1, "a": 2}'}}],
            },
            {"role": "assistant", "tool_calls": [{"id": "x", "function": {"name": "f", "arguments": '{"a":2,"b":1}'}}]},
        ),
        ({"role": "assistant", "content": "a", "reasoning_content": "r"}, {"role": "assistant", "content": "a"}),
        ({"role": "tool", "content": "o", "tool_call_id": "1"}, {"role": "tool", "content": "o", "tool_call_id": "2"}),
        ({"role": "user", "content": "a"}, {"role": "system", "content": "a"}),
    ]
    for left, right in pairs:
        theirs = upstream.graph.message_hash(typed(upstream.types, left)) == upstream.graph.message_hash(
            typed(upstream.types, right)
        )
        assert (message_key(left) == message_key(right)) == theirs, (left, right)
