"""A simulated training run: sessions spread over steps, with a schedule that changes over them.

`--steps N` puts session `i` of `S` in step `i * N // S` (steps in order, as even as `S` allows)
and its rows carry `step` and `weight_version` (`v<step>`). Two documented changes play over
the steps (docs/simulator.md#over-training-steps):

* **growth**: a `growth` echo behaviour (default `json-reserialize`) joins the recipe of a share
  of each step's sessions that grows linearly, `step / (N - 1)`: none at the first step, every
  session at the last. Within a step the first `round(share * sessions)` sessions play it.
* **change**: from step `change_at` on, every session also plays `change` (default
  `claude-code`: a harness upgraded mid-run).

An echo behaviour added to a `byte-exact` session replaces `byte-exact`. The ground truth per
step (`StepSchedule.truth`) goes into the dump's file metadata as `trace_tools.steps`.
"""

from __future__ import annotations

from dataclasses import dataclass

from trace_tools.errors import TraceToolsError, UsageError
from trace_tools.simulate.behaviours import ECHO_BEHAVIOURS, parse_recipes

NO_BEHAVIOUR = "none"


@dataclass(frozen=True)
class StepSchedule:
    """How the behaviour mix changes over `steps` training steps (module docstring)."""

    steps: int
    growth: str | None = "json-reserialize"
    change: str | None = "claude-code"
    change_at: int | None = None

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise TraceToolsError(f"--steps must be at least 1 (got {self.steps})")
        if self.change_at is not None and not 0 <= self.change_at < self.steps:
            raise TraceToolsError(f"--change-at must be a step in 0..{self.steps - 1} (got {self.change_at})")
        for option, name in (("--growth", self.growth), ("--change", self.change)):
            if name is not None and name not in ECHO_BEHAVIOURS:
                raise TraceToolsError(
                    f"{option} takes an echo behaviour ({', '.join(ECHO_BEHAVIOURS)}) or {NO_BEHAVIOUR} (got {name})"
                )

    def step_of(self, index: int, sessions: int) -> int:
        return index * self.steps // sessions

    def growth_share(self, step: int) -> float:
        return step / (self.steps - 1) if self.steps > 1 else 0.0

    def grown(self, step: int, sessions_in_step: int) -> int:
        """How many of a step's sessions (the first ones) play the growth behaviour."""
        return round(self.growth_share(step) * sessions_in_step) if self.growth else 0

    def changed(self, step: int) -> bool:
        return self.change is not None and self.change_at is not None and step >= self.change_at

    def recipes(self, base: list[tuple[str, ...]], sessions: int) -> list[tuple[str, ...]]:
        """Each session's recipe: the base cycle's, plus what its step's schedule adds."""
        out = []
        for index in range(sessions):
            step = self.step_of(index, sessions)
            rank = index - self._first(step, sessions)
            extra = [self.growth] if rank < self.grown(step, self._count(step, sessions)) else []
            extra += [self.change] if self.changed(step) else []
            out.append(_with(base[index % len(base)], [name for name in extra if name]))
        return out

    def truth(self, sessions: int) -> list[dict]:
        """Per step: sessions, the growth behaviour's sessions and share, whether the change is on."""
        return [
            {
                "step": step,
                "weight_version": weight_version(step),
                "sessions": self._count(step, sessions),
                "growth_sessions": self.grown(step, self._count(step, sessions)),
                "growth_share": self.growth_share(step) if self.growth else 0.0,
                "changed": self.changed(step),
            }
            for step in range(self.steps)
        ]

    def arguments(self) -> dict:
        return {"steps": self.steps, "growth": self.growth, "change": self.change, "change_at": self.change_at}

    def _first(self, step: int, sessions: int) -> int:
        return -(-step * sessions // self.steps)  # the smallest index whose step is `step`

    def _count(self, step: int, sessions: int) -> int:
        return self._first(step + 1, sessions) - self._first(step, sessions)


def weight_version(step: int) -> str:
    return f"v{step}"


def schedule_from_options(steps: int | None, growth: str, change: str, change_at: int | None) -> StepSchedule | None:
    """The schedule `simulate --steps N --growth B --change B --change-at K` asks for (None without --steps);
    `none` switches a scheduled behaviour off."""
    if steps is None:
        if change_at is not None:
            raise UsageError("--change-at needs --steps N (the run's length in steps)")
        return None
    return StepSchedule(steps, _behaviour(growth), _behaviour(change), change_at)


def _behaviour(value: str) -> str | None:
    return None if value == NO_BEHAVIOUR else value


def _with(recipe: tuple[str, ...], extra: list[str]) -> tuple[str, ...]:
    """`recipe` plus `extra` (an added echo rewrite replaces byte-exact), checked like `--behaviour a+b`."""
    names = set(recipe) | set(extra)
    if extra:
        names.discard("byte-exact")
    return parse_recipes(["+".join(sorted(names))])[0]
