"""The strategy interface: what a strategy is given (`ReplayContext`) and what it implements (`Strategy`).

A strategy turns one recorded session into training samples the way one trajectory manager
does. The pipeline (`trace_tools.pipeline`) prepares each session once (canonical messages,
responses, prompt ids); the engine (`trace_tools.replay`) owns iteration, timing, error capture
and the run directory; a strategy only implements `replay_session(prepared) -> ReplayResult`.

What a strategy is (name, label, parameters, template facts, counterfactual or not) is its
`declaration` (`strategies.declarations`); the class copies those facts into its attributes. Options are
read with `self.setting(name)`: typed, defaulted and checked against the declaration, never
parsed by hand. Finding a strategy by its name is `strategies.registry`'s job; what several
strategies share (failure reasons, releasing a tree) is in `strategies.helpers`.
"""

from __future__ import annotations

from abc import ABC
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trace_tools.data import ReplayResult, Session
from trace_tools.options import Param
from trace_tools.pipeline.prepared import PreparedSession, prepare_session
from trace_tools.render.base import RendererLike
from trace_tools.render.upstream import upstream_render
from trace_tools.strategies.declarations import Declaration


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
    """One trajectory-management strategy; subclasses are small modules under strategies/.

    A subclass sets `declaration`; its name, parameters (read through `setting`), kind and
    upstream system become class attributes here, so that no view keeps a second copy."""

    declaration: ClassVar[Declaration]
    name: ClassVar[str]
    params: ClassVar[tuple[Param, ...]] = ()
    counterfactual: ClassVar[bool] = False
    renders_prompts: ClassVar[bool] = True
    upstream_system: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declaration = cls.__dict__.get("declaration")
        if declaration is not None:
            cls.name = declaration.name
            cls.params = declaration.params
            cls.counterfactual = declaration.counterfactual
            cls.renders_prompts = declaration.renders_prompts
            cls.upstream_system = declaration.upstream_system

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
