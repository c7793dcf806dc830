"""Tokens per second and peak memory of `audit_samples` as the number of rollout steps grows.

    python benchmarks/bench_audit_samples.py                 # 10 / 100 copies of the sample's tree samples
    python benchmarks/bench_audit_samples.py --copies 300

The bundled sample (`sample_traces/qwen3.parquet`) is replayed with `tree` once; its 28 samples
are then handed to the audit `copies` times, each copy its own sessions, ten copies per rollout
step. The audit holds one step's samples at a time, so peak memory should stay flat while the
tokens grow (the table of the replayed samples, the tokenizer and the libraries are most of it).
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]


def copies_of(rows: list[dict[str, Any]], copies: int) -> Iterator[Any]:
    from trace_tools.trainer.records import TrainerSample

    for copy in range(copies):
        for i, row in enumerate(rows):
            yield TrainerSample(
                source=f"copy{copy}#{i}",
                tokens=row["token_ids"],
                response_length=row["response_length"],
                loss_mask=row["loss_mask"],
                session_id=f"{row['session_id']}-{copy}",
                step=copy // 10,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, nargs="+", default=[10, 100])
    args = parser.parse_args()

    import pyarrow.parquet as pq

    from trace_tools.api import replay
    from trace_tools.trainer.audit import audit_samples

    with tempfile.TemporaryDirectory() as tmp:
        replay(ROOT / "sample_traces" / "qwen3.parquet", out=Path(tmp) / "run", strategies=["tree"])
        rows = pq.read_table(Path(tmp) / "run" / "samples.parquet").to_pylist()
    for copies in args.copies:
        started = time.perf_counter()
        run = audit_samples(copies_of(rows, copies), tokenizer="qwen3", chat_template="qwen3").to_json()["run"]
        seconds = time.perf_counter() - started
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"{copies:>5} copies: {run['samples']} samples, {run['forwarded_tokens']:,} tokens in {seconds:.1f} s "
            f"= {run['forwarded_tokens'] / seconds:,.0f} tokens/s; peak RSS so far {peak:.0f} MiB"
        )


if __name__ == "__main__":
    main()
