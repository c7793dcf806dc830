"""A real run over training steps, for the tests of per-step views (trackers, report.html curves).

`simulate` writes a dump over `steps` rollout steps whose share of re-serializing harnesses grows
step by step; its step values are then spread out to 0, 10, 20, ... (so a view indexed by step
position instead of step value fails) and the dump is replayed with every default strategy. The
run's `by_step` is what replay itself computed.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

STEP_GAP = 10  # steps 0, 10, 20, ...: the series are indexed by the step's value, not its position


def stepped_run(dest: Path, sessions_per_step: int = 4, steps: int = 4) -> Path:
    """The run directory `dest` of a simulated dump of `steps` steps, `sessions_per_step` sessions each."""
    from trace_tools.api import replay
    from trace_tools.simulate import StepSchedule, simulate

    dest.parent.mkdir(parents=True, exist_ok=True)
    schedule = StepSchedule(steps, growth="json-reserialize", change=None)
    table = simulate(sessions_per_step * steps, seed=6, behaviours=["byte-exact"], max_turns=12, steps=schedule)
    index = table.schema.get_field_index("step")
    spread = pc.multiply(table.column("step"), pa.scalar(STEP_GAP, pa.int64()))
    dump = dest.parent / f"{dest.name}.parquet"
    pq.write_table(table.set_column(index, table.schema.field(index), spread), dump)
    replay(dump, out=dest, workers=1)
    return dest
