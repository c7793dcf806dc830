"""Arrow's allocator in the processes trace-tools owns: the command line and the processes it starts."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"  # Arrow's own: read once, as pyarrow loads


def prefer_jemalloc() -> str | None:
    """Make jemalloc the allocator of Arrow's buffers in this process and in the processes it
    starts (replay workers, the plot helper inherit the variable). Returns the pool chosen, or None
    when the user already chose one in ARROW_DEFAULT_MEMORY_POOL or this pyarrow has no jemalloc.

    Why (docs/performance.md#arrows-allocator): reading a dump decodes its large columns batch by
    batch, and pyarrow's default allocator (mimalloc) puts them in fresh memory, which a virtual
    machine can be slow to hand out the first time. On the benchmark's dump the first full read
    took 0.5–2.1 s of wall time under mimalloc (up to 1.3 s of it in the kernel) and 0.5–0.7 s
    under jemalloc, with a lower peak. Called before pyarrow loads (the command line calls it first
    thing, without importing pyarrow), it also holds for Arrow's own allocations: all strategies
    at `--workers 2` took 0.915× the wall time.
    """
    if os.environ.get(POOL_VARIABLE):
        return None
    if "pyarrow" not in sys.modules and _built_with_jemalloc():
        # Arrow's C++ reads the variable once, as pyarrow loads, and pyarrow's calls then use the
        # same pool. Set only afterwards, it reaches the buffers pyarrow allocates (`set_memory_pool`
        # below) but not Arrow's own: Parquet's page and level buffers, IPC compression, which
        # stayed on mimalloc and its page faults.
        os.environ[POOL_VARIABLE] = "jemalloc"
        return "jemalloc"
    import pyarrow as pa

    if "jemalloc" not in pa.supported_memory_backends():
        return None
    pa.set_memory_pool(pa.jemalloc_memory_pool())
    os.environ[POOL_VARIABLE] = "jemalloc"
    return "jemalloc"


def _built_with_jemalloc() -> bool:
    """Whether the installed pyarrow has jemalloc, read without importing it: from the build
    configuration its wheels ship (`include/arrow/util/config.h`). False when that file is absent,
    and the caller then sets the variable after the import, as for a pyarrow already loaded."""
    spec = importlib.util.find_spec("pyarrow")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        config = Path(folder, "include", "arrow", "util", "config.h")
        try:
            return "#define ARROW_JEMALLOC\n" in config.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
    return False


def arrow_without_pandas() -> bool:
    """Keep pyarrow from importing pandas in a process that never uses pandas: the command line's
    replay and its workers (`report.finish` writes the report in a helper process). True when
    pyarrow now holds pandas for missing.

    pyarrow looks for pandas on its first conversion of Python objects (`pa.array([...])`, every
    table built from rows), and imports it if installed: 0.2 s of CPU time in every such process
    (docs/performance.md#no-pandas-in-the-replaying-process). Here that first look happens while
    importing pandas fails, so pyarrow records it missing and never looks again on that path.
    pandas itself stays importable, and pyarrow finds it again as soon as anything asks it for
    pandas (`to_pandas`); `pandas_interop()` does so at once."""
    if "pandas" in sys.modules:
        return False
    import pyarrow as pa

    blocker = _NoPandas()
    sys.meta_path.insert(0, blocker)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(blocker)
    return True


def pandas_interop() -> None:
    """pyarrow's conversions of pandas objects as pyarrow makes them with pandas found, in a process
    `arrow_without_pandas` ran in (a no-op elsewhere): the first `to_pandas` looks for it again."""
    import pyarrow as pa

    pa.table({"_": [0]}).to_pandas()


class _NoPandas:
    """An import finder that fails `import pandas` (only while pyarrow takes its first look)."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pandas":
            raise ModuleNotFoundError("pandas is not imported in this process", name=name)
        return None
