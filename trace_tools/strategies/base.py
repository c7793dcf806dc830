"""Strategy interface and registry.

A strategy turns one recorded session into training samples the way one trajectory manager
does. The pipeline (`trace_tools.pipeline`) prepares each session once (canonical messages,
responses, prompt ids); the engine (`trace_tools.replay`) owns iteration, timing, error capture
and the run directory; a strategy only implements `replay_session(prepared) -> ReplayResult`.

To add one: subclass `Strategy`, set `name` (and `counterfactual` if it changes the ids the
engine would have seen), declare its options in `params` (`trace_tools.options.Param`), implement
`replay_session`, and decorate the class with `@register`. Options are read with
`self.setting(name)`: typed, defaulted and checked against the declaration, never parsed by hand.
"""

from __future__ import annotations

import re
from abc import ABC
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable

from trace_tools.data import ReplayResult, Session, Turn
from trace_tools.errors import UnknownName
from trace_tools.options import Param, check_known
from trace_tools.pipeline.prepared import PreparedSession, prepare_session
from trace_tools.render.base import RendererLike
from trace_tools.render.upstream import upstream_render
from trace_tools.strategies import BUILTIN_STRATEGIES

REGISTRY: dict[str, type["Strategy"]] = {}

# Declared by every strategy that reproduces an upstream system's render (docs/upstream_families.md).
LENIENT_RENDER = Param(
    "lenient_render",
    bool,
    False,
    "pass tool-call arguments as JSON text to a template that needs text; upstream passes dicts "
    "and fails those requests (every report labels a run that sets this)",
)
_NUMBER = re.compile(r"\d+")


def register(cls: type["Strategy"]) -> type["Strategy"]:
    REGISTRY[cls.name] = cls
    return cls


@dataclass
class ReplayContext:
    """Everything a strategy may need besides the session itself.

    `renderer` is None only in unit tests that never render. `params` carries the options of
    every strategy of a run (e.g. fork_threshold, matcher, rollback); each strategy reads the keys
    it declares (`Strategy.params`) and ignores the rest. `check_params` vets them all up front.
    """

    renderer: RendererLike | None = None
    canonicalization: str = "slime"
    prompt_source: str = "auto"  # auto | recorded | rendered
    params: dict[str, Any] = field(default_factory=dict)


class Strategy(ABC):
    """One trajectory-management strategy; subclasses are small modules under strategies/."""

    name: ClassVar[str]
    counterfactual: ClassVar[bool] = False  # True when replay feeds ids the engine never saw
    description: ClassVar[str] = ""
    params: ClassVar[tuple[Param, ...]] = ()  # declared options, read through `setting`
    renders_prompts: ClassVar[bool] = True  # False: works from recorded prompt ids without a tokenizer
    # The upstream system whose renders this strategy reproduces ("miles", "slime", ...), or None.
    upstream_system: ClassVar[str | None] = None

    def __init__(self, ctx: ReplayContext):
        self.ctx = ctx
        self.settings = {param.name: param.parse(ctx.params.get(param.name)) for param in self.params}
        self._upstream: Any = None

    @property
    def upstream(self) -> Any:
        """The context's renderer as `upstream_system` uses it: renders fail where that system's
        fail (`trace_tools.render.upstream`), unless the strategy's `lenient_render` is set."""
        if self._upstream is None and self.ctx.renderer is not None:
            lenient = bool(self.settings.get("lenient_render", False))
            self._upstream = upstream_render(self.ctx.renderer, self.upstream_system or "upstream", lenient)
        return self._upstream

    def setting(self, name: str) -> Any:
        """The typed value of a declared option (its default when not given)."""
        return self.settings[name]

    def replay(self, session: Session | PreparedSession) -> ReplayResult:
        """Replay one session; raise to have the engine quarantine it as `replay_error`.

        The engine passes the pipeline's `PreparedSession`; a raw `Session` (tests, notebooks) is
        prepared here first, with this context's renderer, canonicalization and prompt source.
        """
        if not isinstance(session, PreparedSession):
            session = prepare(session, self.ctx)
        result = self.replay_session(session)
        if self.settings.get("lenient_render"):
            result.counters["lenient_renders"] += 0  # present, zero too, in a run that asked for it
        return result

    def replay_session(self, prepared: PreparedSession) -> ReplayResult:
        """Replay one prepared session (canonical messages, responses and prompt ids per turn).

        Every strategy implements this (a strategy may instead override `replay` itself)."""
        raise NotImplementedError(f"strategy {self.name} implements neither replay_session nor replay")


def prepare(session: Session, ctx: ReplayContext) -> PreparedSession:
    """A session prepared the way the engine prepares it, for this context."""
    return prepare_session(session, ctx.renderer, ctx.canonicalization, ctx.prompt_source)


def failure_reason(exc: BaseException) -> str:
    """How a request the upstream system answers with an error is counted and shown: the error's
    own `reason` where it names one, else its first line with every number written N (so that
    the same failure at different positions counts once)."""
    reason = getattr(exc, "reason", None)
    if isinstance(reason, str) and reason:
        return reason
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return _NUMBER.sub("N", first_line)[:200]


def release_tree(roots: Iterable[Any]) -> None:
    """Unlink a finished tree's `parent`/`children` references so that reference counting frees it.

    A linked tree is a reference cycle, and only the cyclic garbage collector frees cycles, after
    walking every token-id list they hold: on long sessions that walk cost more than some strategies.
    """
    stack = list(roots)
    while stack:
        node = stack.pop()
        stack += node.children
        node.children = []
        node.parent = None


def get_strategy(name: str) -> type[Strategy]:
    _load_builtin_strategies()
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownName("strategy", name, sorted(REGISTRY)) from None


def available_strategies() -> list[str]:
    """Registered names in the DESIGN §3 column order."""
    _load_builtin_strategies()
    order = list(BUILTIN_STRATEGIES)
    return [n for n in order if n in REGISTRY] + sorted(set(REGISTRY) - set(order))


def declared_params() -> dict[str, Param]:
    """Every option any registered strategy declares, by name (strategies that share one share its declaration)."""
    _load_builtin_strategies()
    return {param.name: param for cls in REGISTRY.values() for param in cls.params}


def check_params(strategies: list[str], params: Mapping[str, Any]) -> dict[str, Any]:
    """Validate options before any work: the typed values of `params` (None values dropped).

    Raises `UnknownName` for an unknown strategy, `UsageError` for an option no strategy declares
    and `InvalidOption` for a value outside its declaration; each message lists the valid choices.
    """
    for name in strategies:
        get_strategy(name)
    given = {key: value for key, value in params.items() if value is not None}
    declared = declared_params()
    check_known(given, declared, "strategy parameter")
    return {key: declared[key].parse(value) for key, value in given.items()}


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
