"""What memoising every piece the fast encoder encodes saves (issue 37), against the rule it
replaced (only pieces of 256 characters or more were memoised), in the same run: each round
replays DUMP through every strategy in two fresh processes, one per rule, alternating which goes
first, and reads the CPU time spent inside `FastEncoder.encode` and in the whole replay.

    python benchmarks/bench_encoder_memo.py [DUMP] [--rounds 3]

DUMP defaults to the bundled sample_traces/. Prints each round and the ratios of the medians
(every piece / long pieces only).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

OLD_RULE_CHARS = 256  # the replaced rule: shorter pieces were encoded every time


def measure(dump: str | None, rule: str) -> dict[str, float]:
    """One replay in this process under `rule` ("every" or "long"); CPU seconds."""
    import tempfile
    import time

    from trace_tools.api import replay
    from trace_tools.render import fast_encoder

    encoder = fast_encoder.FastEncoder
    if rule == "long":
        memoised = encoder._piece

        def long_only(self: fast_encoder.FastEncoder, piece: str) -> list[int]:
            return self._bpe_piece(piece) if len(piece) < OLD_RULE_CHARS else memoised(self, piece)

        encoder._piece = long_only  # type: ignore[method-assign]
    spent = [0.0]
    encode = encoder.encode

    def timed(self: fast_encoder.FastEncoder, text: str) -> list[int]:
        started = time.process_time()
        try:
            return encode(self, text)
        finally:
            spent[0] += time.process_time() - started

    encoder.encode = timed  # type: ignore[method-assign]
    started = time.process_time()
    with tempfile.TemporaryDirectory() as out:
        replay(dump, out=f"{out}/run", workers=1)
    return {"encode": spent[0], "replay": time.process_time() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dump", nargs="?")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", choices=["every", "long"], help=argparse.SUPPRESS)  # a child's rule
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.dump, args.one)))
        return
    seconds: dict[str, list[dict[str, float]]] = {"every": [], "long": []}
    for round_ in range(args.rounds):
        for rule in sorted(seconds, reverse=bool(round_ % 2)):
            child = [sys.executable, __file__, *([args.dump] if args.dump else []), "--one", rule]
            done = subprocess.run(child, capture_output=True, text=True, check=True)
            seconds[rule].append(json.loads(done.stdout.strip().splitlines()[-1]))
            figures = seconds[rule][-1]
            print(
                f"round {round_ + 1} {rule:>5}: encode {figures['encode']:.3f} s, replay {figures['replay']:.2f} s CPU"
            )
    for part in ("encode", "replay"):
        every = statistics.median(f[part] for f in seconds["every"])
        long = statistics.median(f[part] for f in seconds["long"])
        print(f"{part}: every piece {every:.3f} s, long pieces only {long:.3f} s (medians), ratio {every / long:.3f}")


if __name__ == "__main__":
    main()
