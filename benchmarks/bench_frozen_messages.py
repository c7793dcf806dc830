"""What freezing canonical messages costs replay (issue 24): every strategy, in this process, over
the same sessions, with `pipeline.prepared.freeze` as it is and replaced by the identity, in
interleaved rounds (alternating which goes first, so a slow phase of the machine hits both).

    python benchmarks/bench_frozen_messages.py [DUMP] [--rounds 6]

DUMP defaults to the bundled sample_traces/. Prints each round's seconds and the ratio of the
medians (frozen / plain).
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dump", nargs="?")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()

    from trace_tools.pipeline import Pipeline
    from trace_tools.pipeline import prepared as prepared_module
    from trace_tools.replay.engine import default_dump
    from trace_tools.replay.session import ReplayOptions, SessionReplayer
    from trace_tools.strategies.registry import available_strategies

    sessions = [s for s in Pipeline(args.dump or default_dump()) if hasattr(s, "turns")]
    freeze = prepared_module.freeze
    modes = {"frozen": freeze, "plain": lambda value: value}
    seconds: dict[str, list[float]] = {mode: [] for mode in modes}
    for round_ in range(args.rounds):
        for mode in sorted(modes, reverse=bool(round_ % 2)):
            prepared_module.freeze = modes[mode]
            replayer = SessionReplayer(ReplayOptions(list(available_strategies()), write_samples=False), pause_gc=True)
            started = time.perf_counter()
            for session in sessions:
                replayer(session)
            seconds[mode].append(time.perf_counter() - started)
    prepared_module.freeze = freeze
    for mode, times in seconds.items():
        print(f"{mode:>6}: " + " ".join(f"{t:.2f}" for t in times) + f"  median {statistics.median(times):.2f} s")
    print(f"frozen / plain (medians): {statistics.median(seconds['frozen']) / statistics.median(seconds['plain']):.3f}")


if __name__ == "__main__":
    main()
