"""trace-tools: offline trace replay and analysis for agent-RL rollout gateways.

The Python API (everything returns pandas DataFrames or plain objects holding them):

    import trace_tools as tt
    dump = tt.load("dump.parquet")                 # sessions + quarantine
    result = tt.replay("dump.parquet", out="runs/r1", strategies=["tree", "linear"])
    run = tt.open_run("runs/r1")                   # run.turns, run.sessions, run.coverage_by_tool()
    tt.explain("dump.parquet", "session-id")       # drift findings of one session
    tt.compare("runs/r1", strategies=["tree", "linear"])
    tt.simulate(sessions=8, seed=0, out="sim.parquet")

Attributes load lazily, so `import trace_tools` stays cheap.
"""

from __future__ import annotations

import importlib
import sys
import types

__version__ = "0.1.0"

_LAZY = {
    "load": ("trace_tools.io.load", "load"),
    "iter_sessions": ("trace_tools.io.load", "iter_sessions"),
    "validate": ("trace_tools.pipeline.validate", "validate"),
    "replay": ("trace_tools.api", "replay"),
    "open_run": ("trace_tools.api", "open_run"),
    "explain": ("trace_tools.replay.explain", "explain"),
    "write_html_report": ("trace_tools.report.html", "write_html_report"),
    "compare": ("trace_tools.report.compare", "compare"),
    "compare_by_behaviour": ("trace_tools.report.compare", "compare_by_behaviour"),
    "compare_by_step": ("trace_tools.report.compare", "compare_by_step"),
    "gate": ("trace_tools.report.gate", "gate"),
    "reconstruct": ("trace_tools.reconstruct", "reconstruct"),
    "simulate": ("trace_tools.simulate", "simulate"),
    "Renderer": ("trace_tools.render.renderer", "Renderer"),
    "available_strategies": ("trace_tools.strategies.registry", "available_strategies"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'trace_tools' has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """`replay`, `simulate` and `reconstruct` name both an API function and a submodule. Importing
    a submodule sets the package attribute of that name to it, so the first `tt.replay(...)` (which
    imports `trace_tools.replay`) would turn the next into "'module' object is not callable". On
    the package the function wins; the submodules stay importable by their full names."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
