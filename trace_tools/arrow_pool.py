"""Arrow's allocator in the processes trace-tools owns: the command line and the processes it starts."""

from __future__ import annotations

import os

POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"  # Arrow's own: read once, at a process's first allocation


def prefer_jemalloc() -> str | None:
    """Make jemalloc the allocator of Arrow's buffers in this process and in the processes it
    starts (replay workers, the plot helper inherit the variable). Returns the pool chosen, or None
    when the user already chose one in ARROW_DEFAULT_MEMORY_POOL or this pyarrow has no jemalloc.

    Why (docs/performance.md#arrows-allocator): reading a dump decodes its large columns batch by
    batch, and pyarrow's default allocator (mimalloc) puts them in fresh memory, which a virtual
    machine can be slow to hand out the first time. On the benchmark's dump the first full read
    took 0.5–2.1 s of wall time under mimalloc (up to 1.3 s of it in the kernel) and 0.5–0.7 s
    under jemalloc, with a lower peak.
    """
    if os.environ.get(POOL_VARIABLE):
        return None
    import pyarrow as pa

    if "jemalloc" not in pa.supported_memory_backends():
        return None
    pa.set_memory_pool(pa.jemalloc_memory_pool())
    os.environ[POOL_VARIABLE] = "jemalloc"
    return "jemalloc"
