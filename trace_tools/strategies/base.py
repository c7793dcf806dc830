"""Strategy interface and registry.

A strategy turns one recorded session into training samples the way one trajectory manager
does. The pipeline (`trace_tools.pipeline`) prepares each session once (canonical messages,
responses, prompt ids); the engine (`trace_tools.replay`) owns iteration, timing, error capture
and the run directory; a strategy only implements `replay_session(prepared) -> ReplayResult`.

To add one: subclass `Strategy`, set `name` (and `counterfactual` if it changes the ids the
engine would have seen), implement `replay_session`, and decorate the class with `@register`.
"""
from __future__ import annotations

from abc import ABC
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trace_tools.data import ReplayResult, Session, Turn
from trace_tools.errors import UnknownName
from trace_tools.pipeline.prepared import PreparedSession, prepare_session
from trace_tools.render.base import RendererLike

REGISTRY: dict[str, type["Strategy"]] = {}


def register(cls: type["Strategy"]) -> type["Strategy"]:
    REGISTRY[cls.name] = cls
    return cls


@dataclass
class ReplayContext:
    """Everything a strategy may need besides the session itself.

    `renderer` is None only in unit tests that never render. `params` carries strategy options
    (e.g. fork_threshold, realign_gate, realign_from, on_nonlinear, rollback, matcher); each
    strategy reads the keys it knows and ignores the rest.
    """

    renderer: RendererLike | None = None
    canonicalization: str = "slime"
    prompt_source: str = "auto"  # auto | recorded | rendered
    params: dict[str, Any] = field(default_factory=dict)

    def param(self, key: str, default: Any) -> Any:
        value = self.params.get(key)
        return default if value is None else value


class Strategy(ABC):
    """One trajectory-management strategy; subclasses are small modules under strategies/."""

    name: ClassVar[str]
    counterfactual: ClassVar[bool] = False  # True when replay feeds ids the engine never saw
    description: ClassVar[str] = ""

    def __init__(self, ctx: ReplayContext):
        self.ctx = ctx

    def replay(self, session: Session | PreparedSession) -> ReplayResult:
        """Replay one session; raise to have the engine quarantine it as `replay_error`.

        The engine passes the pipeline's `PreparedSession`; a raw `Session` (tests, notebooks) is
        prepared here first, with this context's renderer, canonicalization and prompt source.
        """
        if not isinstance(session, PreparedSession):
            session = prepare(session, self.ctx)
        return self.replay_session(session)

    def replay_session(self, prepared: PreparedSession) -> ReplayResult:
        """Replay one prepared session (canonical messages, responses and prompt ids per turn).

        Every strategy implements this (a strategy may instead override `replay` itself)."""
        raise NotImplementedError(f"strategy {self.name} implements neither replay_session nor replay")


def prepare(session: Session, ctx: ReplayContext) -> PreparedSession:
    """A session prepared the way the engine prepares it, for this context."""
    return prepare_session(session, ctx.renderer, ctx.canonicalization, ctx.prompt_source)


def get_strategy(name: str) -> type[Strategy]:
    _load_builtin_strategies()
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownName("strategy", name, sorted(REGISTRY)) from None


def available_strategies() -> list[str]:
    """Registered names in the DESIGN §3 column order."""
    _load_builtin_strategies()
    order = ["tree", "echo-restore", "linear", "linear+restore", "chains", "session-v1", "session-v2",
             "checkpoint-tree"]
    return [n for n in order if n in REGISTRY] + sorted(set(REGISTRY) - set(order))


def _load_builtin_strategies() -> None:
    import importlib

    for module in ("tree", "echo_restore", "linear", "chains", "session_v1", "session_v2", "checkpoint_tree"):
        try:
            importlib.import_module(f"trace_tools.strategies.{module}")
        except ModuleNotFoundError as exc:  # a strategy module not written yet
            if exc.name != f"trace_tools.strategies.{module}":
                raise


def turn_tools(turn: Turn) -> list[dict] | None:
    return turn.tools or None
