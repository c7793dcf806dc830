"""One simulated session: the harness loop, the gateway's records, and the ground truth.

The harness keeps each conversation twice, in lockstep: `wire` (what it sends, echo behaviours
applied) and `pristine` (the same history with every assistant message exactly as the gateway
returned it). The rows record `wire`; the ground truth (`IdealSequences`) follows `pristine`, so
"what an ideal manager trains" never depends on how the harness mangled its echoes.

Randomness comes from three streams seeded by (seed, session index): `plan` (workspace, episode,
event positions; independent of the template, so both families simulate the same episodes),
`harness` (echo ids), `sample` (tokens, logprobs, timings).
"""

from __future__ import annotations

import copy
import hashlib
import random
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from trace_tools.render.canonical import canonicalize_response
from trace_tools.render.harness_echo import HarnessEcho
from trace_tools.simulate import episode, manual, prose
from trace_tools.simulate.behaviours import Echo, clear_old_tool_results
from trace_tools.simulate.episode import Step
from trace_tools.simulate.formats import Family, response_message, wire_from_parsed
from trace_tools.simulate.gateway import IdealSequences, LinearGateway, canonical
from trace_tools.simulate.profiles import PROFILES, Profile
from trace_tools.simulate.sampling import logprobs, split_merged_tokens, truncation_point
from trace_tools.simulate.tools import MAIN_TOOLS, SUBAGENT_TOOLS, tool_schemas
from trace_tools.simulate.workspace import build_workspace, plural

EPOCH_US = int(datetime(2025, 3, 3, 9, 0, tzinfo=timezone.utc).timestamp() * 1_000_000)
EDIT_TOOLS = ("Edit", "MultiEdit", "Write")
# A history edit clears every tool result except the most recent ones.
KEEP_RECENT_RESULTS = 2
# The fewest model turns a session needs for its behaviours to have room.
MIN_TURNS = {"compaction": 5, "history-edit": 5, "subagent": 4, "truncation": 3, "retry": 2}


@dataclass
class Conversation:
    """One conversation the harness holds: its branch label, tools and the two histories."""

    branch: str
    tools: list[dict]
    wire: list[dict]
    pristine: list[dict]
    echoes: list[int | None] = field(default_factory=list)  # per message: the turn it echoes

    @classmethod
    def start(cls, branch: str, tools: list[dict], system: str, user: str) -> "Conversation":
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return cls(branch, tools, copy.deepcopy(messages), messages, [None, None])

    def fork(self, branch: str) -> "Conversation":
        return Conversation(
            branch, self.tools, copy.deepcopy(self.wire), copy.deepcopy(self.pristine), list(self.echoes)
        )

    def add_reply(self, turn: int, response: dict, echo: dict) -> None:
        self.wire.append(echo)
        self.pristine.append(copy.deepcopy(response))
        self.echoes.append(turn)

    def add_results(self, texts: list[str]) -> None:
        """Tool messages answering the last reply's calls (each history answers its own call ids)."""
        for history in (self.wire, self.pristine):
            calls = history[-1].get("tool_calls") or []
            history.extend({"role": "tool", "tool_call_id": c["id"], "content": t} for c, t in zip(calls, texts))
        self.echoes.extend([None] * len(texts))

    def add_user(self, text: str) -> None:
        for history in (self.wire, self.pristine):
            history.append({"role": "user", "content": text})
        self.echoes.append(None)


@dataclass
class SimContext:
    """What every session of one `simulate` call shares."""

    seed: int
    family: Family
    renderer: Any
    recording: str
    max_turns: int = 40
    profile: Profile = PROFILES["swe"]
    harness_profile: HarnessEcho | None = None  # what the `harness-profile` behaviour plays


class SessionBuilder:
    """Builds the rows of one session; `build()` returns them in arrival order."""

    def __init__(self, ctx: SimContext, index: int, recipe: tuple[str, ...]):
        self.ctx, self.index, self.recipe = ctx, index, recipe
        self.session_id = f"sim-{ctx.family.name}-s{ctx.seed}-{index:04d}"
        key = f"{ctx.seed}/{index}"
        self.plan_rng, self.sample_rng = random.Random(f"{key}/plan"), random.Random(f"{key}/sample")
        self.gateway_rng = random.Random(f"{key}/gateway")
        self.echo = Echo(recipe, random.Random(f"{key}/harness"), ctx.harness_profile)
        self.linear = LinearGateway(ctx.renderer) if ctx.recording == "linear" else None
        self.ideal = IdealSequences(ctx.renderer)
        self.rows: list[dict[str, Any]] = []
        self.branch_counts: dict[str, int] = {}
        self.clock = EPOCH_US + (ctx.seed % 1000) * 3_600_000_000 + index * 1_800_000_000
        self.special = set(ctx.renderer.tokenizer.backend.get_added_tokens_decoder())

    # -- the session --------------------------------------------------------------------------
    def build(self) -> list[dict[str, Any]]:
        profile = self.ctx.profile
        ws = build_workspace(self.plan_rng, profile.modules, profile.functions)
        ws.verbose = profile.manual
        self.echo.cwd = ws.root  # the harness works in the repository and says so in its prompts
        turns = self._turn_count()
        task_at = self.plan_rng.randint(1, turns - 2) if "subagent" in self.recipe else None
        steps = self.ctx.family.turn_steps(episode.plan_main(self.plan_rng, ws, turns, task_at=task_at))
        events = self._events(steps)
        bug = ws.planted_bug
        task = prose.task_text(self.plan_rng, bug.name, bug.path, plural(bug.noun))
        conv = Conversation.start("main", self._tools(MAIN_TOOLS), self._system(prose.MAIN_SYSTEM, ws), task)
        for i, step in enumerate(steps):
            if events.get("compaction") == i:
                conv = self._compact(conv, ws, steps[:i])
            if events.get("history-edit") == i:
                conv = self._edit_history(conv)
            self._run_step(conv, step, ws, retry=events.get("retry") == i, truncate=events.get("truncation") == i)
        self._finish()
        return self.rows

    def _system(self, template: str, ws: Any) -> str:
        base = template.format(root=ws.root)
        return manual.system_prompt(base, ws) if self.ctx.profile.manual else base

    def _tools(self, names: tuple[str, ...]) -> list[dict]:
        tools = tool_schemas(names)
        return manual.with_notes(tools) if self.ctx.profile.manual else tools

    def _turn_count(self) -> int:
        low = min(self.ctx.profile.min_turns, self.ctx.max_turns)
        turns = low + int(self.plan_rng.betavariate(1.4, 3.2) * (self.ctx.max_turns - low))
        needed = max([MIN_TURNS.get(name, 3) for name in self.recipe] + [3])
        if "compaction" in self.recipe and "history-edit" in self.recipe:
            needed += 1
        return max(turns, needed)

    def _events(self, steps: list[Step]) -> dict[str, int]:
        """Which step each session behaviour happens at (indices into the main steps)."""
        last = len(steps) - 1
        events: dict[str, int] = {}
        if "truncation" in self.recipe:
            events["truncation"] = next(
                (i for i, s in enumerate(steps) if any(c.name in EDIT_TOOLS for c in s.calls)), last
            )
        if "retry" in self.recipe:
            choices = [i for i in range(1, last + 1) if i != events.get("truncation")]
            events["retry"] = self.plan_rng.choice(choices)
        # An edit needs old tool results to clear, so it comes first when both happen (a compacted
        # history has none yet); both need three earlier turns.
        if "history-edit" in self.recipe:
            events["history-edit"] = self.plan_rng.randint(3, last - ("compaction" in self.recipe))
        if "compaction" in self.recipe:
            events["compaction"] = self.plan_rng.randint(events.get("history-edit", 2) + 1, last)
        return events

    def _run_step(self, conv: Conversation, step: Step, ws: Any, retry: bool = False, truncate: bool = False) -> None:
        superseded = None
        if retry:
            superseded = self._generate(conv, episode.resample(self.plan_rng, step), kind="superseded")
        if truncate:
            cut = self._generate(conv, step, kind="truncated", truncate=True)
            conv.add_reply(cut, self.rows[cut]["response"], self.echo(self.rows[cut]["response"]))
            conv.add_user(prose.TRUNCATION_NUDGE)
            step = episode.resample(self.plan_rng, step)
        turn = self._generate(conv, step, kind="retry" if retry else "turn")
        if superseded is not None:
            self.rows[superseded]["metadata"]["superseded_by"] = turn
            self.rows[turn]["metadata"]["retry_of"] = superseded
        response = self.rows[turn]["response"]
        conv.add_reply(turn, response, self.echo(response))
        if step.subagent:
            self._run_subagent(step, ws)
        if step.calls:
            conv.add_results(step.results)

    def _run_subagent(self, step: Step, ws: Any) -> None:
        prompt = step.calls[0].arguments["prompt"]
        sub = Conversation.start(
            self._new_branch("subagent"), self._tools(SUBAGENT_TOOLS), self._system(prose.SUB_SYSTEM, ws), prompt
        )
        for sub_step in step.subagent:
            self._run_step(sub, sub_step, ws)

    def _compact(self, conv: Conversation, ws: Any, done: list[Step]) -> Conversation:
        """Ask for a summary on the current history, then start over from the summary."""
        conv.add_user(prose.COMPACT_REQUEST)
        summary = episode.summary_step(self.plan_rng, ws, done)
        self._generate(conv, summary, kind="summary")
        text = prose.COMPACT_CONTINUE.format(summary=summary.content)
        return Conversation.start(self._new_branch("compaction"), conv.tools, conv.wire[0]["content"], text)

    def _edit_history(self, conv: Conversation) -> Conversation:
        edited = conv.fork(self._new_branch("edit"))
        cleared = [
            clear_old_tool_results(h, KEEP_RECENT_RESULTS, prose.CLEARED_RESULT) for h in (edited.wire, edited.pristine)
        ]
        if not all(cleared):
            raise AssertionError("simulator bug: a history edit found no old tool result to clear")
        return edited

    def _new_branch(self, kind: str) -> str:
        self.branch_counts[kind] = self.branch_counts.get(kind, 0) + 1
        return f"{kind}-{self.branch_counts[kind]}"

    # -- one generation ------------------------------------------------------------------------
    def _generate(self, conv: Conversation, step: Step, kind: str, truncate: bool = False) -> int:
        """Record one generation call on `conv`; returns its turn index."""
        turn = len(self.rows)
        request, tools = copy.deepcopy(conv.wire), conv.tools
        messages = canonical(request)
        prompt_ids, prompt_event = self._prompt(messages, tools)
        step, text = self.ctx.family.emitted(step, self.ctx.renderer.decode(prompt_ids[-4:]))
        output_ids, splits = self._output_ids(text, truncate)
        response, finish = self._reply(step, output_ids, tools, truncate)
        stored = canonicalize_response(response, "slime")
        assert stored is not None, "slime canonicalization keeps an assistant reply"
        rewrite = self.ideal.turn(
            conv.branch, canonical(conv.pristine), tools, output_ids, stored, commit=kind != "superseded"
        )
        if self.linear is not None:
            self.linear.commit(prompt_ids, output_ids, messages, stored, tools)
        started, finished = self._timing(len(prompt_ids), len(output_ids), kind)
        self.rows.append(
            {
                "session_id": self.session_id,
                "turn_index": turn,
                "messages": request,
                "tools": tools,
                "output_ids": output_ids,
                "output_logprobs": logprobs(self.sample_rng, output_ids, self.special, set(splits)),
                "prompt_ids": None if self.ctx.recording == "none" else prompt_ids,
                "response": response,
                "finish_reason": finish,
                "request_id": self._request_id(turn),
                "started_at": started,
                "finished_at": finished,
                "chat_template_kwargs": None,
                "reward": None,
                "metadata": self._turn_truth(conv, turn, kind, rewrite, len(splits), prompt_event),
            }
        )
        return turn

    def _prompt(self, messages: list[dict], tools: list[dict]) -> tuple[list[int], str]:
        if self.linear is not None:
            return self.linear.prompt(messages, tools)
        return self.ctx.renderer.render(messages, tools, True), "rendered"

    def _reply(self, step: Step, output_ids: list[int], tools: list[dict], truncate: bool) -> tuple[dict, str]:
        """(the gateway's response message, finish_reason). A cut-off reply is whatever the parser
        makes of it. A measured harness's protocol decides how the row records the reply."""
        if truncate:
            parsed = self.ctx.renderer.parse_response(output_ids, tools).message
            response, finish = wire_from_parsed(parsed, tools, self.gateway_rng), "length"
        else:
            response, finish = response_message(step, tools, self.gateway_rng), "tool_calls" if step.calls else "stop"
        return (self.echo.harness.served(response) if self.echo.harness else response), finish

    def _output_ids(self, text: str, truncate: bool) -> tuple[list[int], list[int]]:
        renderer = self.ctx.renderer
        ids = renderer.encode(text)
        splits: list[int] = []
        if "noncanonical-tokenization" in self.recipe and (not self.rows or self.sample_rng.random() < 0.4):
            ids, splits = split_merged_tokens(renderer.tokenizer, ids, self.sample_rng, self.sample_rng.randint(1, 2))
        if truncate:
            cut = truncation_point(renderer.tokenizer, ids, self.sample_rng, self.ctx.family.call_opener)
            ids, splits = ids[:cut], [p for p in splits if p < cut - 1]
        return ids, splits

    def _timing(self, prompt_tokens: int, output_tokens: int, kind: str) -> tuple[int, int]:
        """(started, finished) in µs; a superseded call overlaps its retry (the client gave up first)."""
        start = self.clock
        seconds = (0.04 + prompt_tokens / 9000 + output_tokens * 0.016) * self.sample_rng.uniform(0.85, 1.3)
        finish = start + int(seconds * 1_000_000)
        if kind == "superseded":
            self.clock = start + int((finish - start) * self.sample_rng.uniform(0.4, 0.8))
        else:
            self.clock = finish + int(self.sample_rng.uniform(0.15, 4.0) * 1_000_000)
        return start, finish

    def _request_id(self, turn: int) -> str:
        digest = hashlib.sha256(f"{self.session_id}/{turn}".encode()).hexdigest()
        return f"chatcmpl-{digest[:24]}"

    # -- ground truth ----------------------------------------------------------------------------
    def _turn_truth(
        self, conv: Conversation, turn: int, kind: str, rewrite: bool, splits: int, prompt_event: str
    ) -> dict[str, Any]:
        echo_of = [t for t in conv.echoes if t is not None]
        rewritten = [
            t for t, wire, kept in zip(conv.echoes, conv.wire, conv.pristine) if t is not None and wire != kept
        ]
        truth = {
            "behaviours": list(self.recipe),
            "genuine": kind != "superseded",
            "branch": conv.branch,
            "kind": kind,
            "echo_of": echo_of,
            "rewritten_echoes": rewritten,
            "template_rewrite": rewrite,
            "noncanonical_splits": splits,
        }
        if self.linear is not None:
            truth["linear_event"] = prompt_event
        return truth

    def _finish(self) -> None:
        samples, forwarded = len(self.ideal.branches), self.ideal.forwarded_tokens()
        for row in self.rows:
            row["metadata"].update(ideal_samples=samples, ideal_forwarded_tokens=forwarded)
        self.rows[-1]["reward"] = 1.0 if self.plan_rng.random() < 0.6 else 0.0
