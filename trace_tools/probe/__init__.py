"""`trace-tools probe`: drive a real harness through the recorder and measure its echoes
(`probe.run`; docs/probe.md).

The package itself imports nothing: `trace-tools --help` reads the harness records
(`probe.harnesses`) through it, and the probe's own imports bring pyarrow and aiohttp (measured:
with them at package level `--help` took 2.0x the wall time and 77 MiB against 26 MiB).
"""

from __future__ import annotations

from typing import Any

__all__ = ["probe"]


def __getattr__(name: str) -> Any:
    if name == "probe":
        from trace_tools.probe.run import probe

        return probe
    raise AttributeError(f"module 'trace_tools.probe' has no attribute {name!r}")
