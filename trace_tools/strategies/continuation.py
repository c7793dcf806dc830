"""The `continuation` strategy: the cumulative-token family (docs/strategies.md#continuation).

Each recorded request is served as a cumulative-token gateway serves it (`continuation_core`):
the first from its own prompt, every later one from the ids already served plus the rendered new
messages, a break per `on_break`. The recorded output is then appended as if sampled on that
prompt (counterfactual). One sample per run of continued turns: every turn of it trained once, the
glue, tool results and closers as context; a fork starts a new sample whose shared head is
context.

Prompt events: `rendered` (first turn), `continued`, `forked`, `reset`, `failed`. Counters:
`healed_turns` (continued or forked turns), `healed_prefix_tokens` (served ids they reused, after
the junction), `nonlinear` (= breaks, split into `nonlinear_history` and `nonlinear_template`),
`resets`, `restored_echoes`, `server_errors` (failed requests), and in `extra_counters` the breaks
by cause (`breaks_history`, `breaks_role`, `breaks_template`) and
`junction_fixes` (continued turns whose junction inserted or dropped an id).
"""

from __future__ import annotations

from dataclasses import replace

from trace_tools.data import ReplayResult, Sample
from trace_tools.errors import ReplayError
from trace_tools.pipeline.prepared import PreparedSession, PreparedTurn
from trace_tools.render.upstream import ArgumentFormError, took_lenient
from trace_tools.strategies.base import Strategy
from trace_tools.strategies.continuation_core import Continuation, Step
from trace_tools.strategies.declarations import CONTINUATION
from trace_tools.strategies.helpers import failure_reason
from trace_tools.strategies.tree import check_request, record_failures, turn_record
from trace_tools.strategies.tree_core import BaseSample, DriftKind, _SampleBuilder


class ContinuationStrategy(Strategy):
    declaration = CONTINUATION

    def replay_session(self, prepared: PreparedSession) -> ReplayResult:
        if self.ctx.renderer is None:
            raise ReplayError(f"strategy {self.name} renders prompts; pass --tokenizer (and --chat-template)")
        state = Continuation(self.upstream, self.setting("on_break"))
        builders: list[_SampleBuilder] = []
        result = ReplayResult()
        failures: dict[int, str] = {}
        for turn in prepared.turns:
            index = turn.turn.turn_index
            try:
                step = self._serve(state, turn)
            except ArgumentFormError as exc:
                failures[index] = failure_reason(exc)
                continue
            result.prompt_events[index] = step.event
            if step.ids is None:
                failures[index] = f"the history is not an append ({step.cause})"
                continue
            if step.event != "continued":  # a first turn, a reset or a fork opens a sample
                builders.append(_SampleBuilder(0))
            builders[-1].append_turn(replace(turn_record(turn), prompt_ids=step.ids), DriftKind.CLEAN, source=index)
            state.commit(turn, step)
        result.counters.update(state.counters)
        result.samples = _samples(builders, prepared)
        record_failures(result, failures)
        return result

    def _serve(self, state: Continuation, prepared: PreparedTurn) -> Step:
        """The step for one turn; a prompt of its own (first turn, reset) fails where upstream's render does."""
        try:
            step = state.step(prepared)
            if step.event in ("rendered", "reset") and prepared.prompt_origin == "rendered":
                check_request(self.upstream, prepared)
        finally:
            if took_lenient(self.upstream):
                state.counters["lenient_renders"] += 1
        return step


def _samples(builders: list[_SampleBuilder], prepared: PreparedSession) -> list[Sample]:
    """One sample per builder that trains a token, with the session reward."""
    base = BaseSample(rollout_id=prepared.session_id)
    samples = []
    for builder in builders:
        sample = builder.to_sample(base, {"sid": prepared.session_id}) if builder.has_trained_response() else None
        if sample is not None:
            sample.reward = prepared.reward
            samples.append(sample.to_sample())
    return samples
