"""Linear healing: the text-space delta path against the full render, on simulated sessions.

Simulates N sessions, prepares their turns once, then heals every session twice in the same run:
with the delta path (render text, encode only the closer and the new tail) and with the full path
(render and tokenize the stored history and the extended history every turn). Each path gets a
fresh renderer so neither benefits from the other's caches; each is timed `--repeat` times and
the best run is kept. Prints per-path time, prompt tokens fed per second and the speed ratio
(baseline = full path), and checks that both paths fed identical ids on every turn.

    python benchmarks/bench_linear_delta.py --sessions 40 --template qwen3.5
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def prepared_sessions(sessions: int, seed: int, template: str):
    from trace_tools.io.load import load
    from trace_tools.simulate import simulate
    from trace_tools.strategies.base import ReplayContext, prepare

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.parquet"
        simulate(sessions=sessions, seed=seed, template=template, out=str(path))
        dump = load(path)
    ctx = ReplayContext(_renderer(dump.meta), prompt_source="recorded" if _all_recorded(dump) else "auto")
    return dump.meta, [(s.session_id, prepare(s, ctx).turns) for s in dump.sessions]


def _all_recorded(dump) -> bool:
    return all(t.prompt_ids is not None for s in dump.sessions for t in s.turns)


def _renderer(meta):
    from trace_tools.render.renderer import Renderer

    return Renderer.from_spec(meta.tokenizer, None, dump_meta=meta)


def heal_all(meta, sessions, delta: bool):
    """(seconds, outcomes per session) for one pass with a fresh renderer."""
    from trace_tools.strategies.linear_core import LinearHealer, heal_session

    healer = LinearHealer(_renderer(meta), delta=delta)
    started = time.perf_counter()
    outcomes = [heal_session(healer, sid, turns) for sid, turns in sessions]
    return time.perf_counter() - started, outcomes


def best_of(meta, sessions, delta: bool, repeat: int):
    runs = [heal_all(meta, sessions, delta) for _ in range(repeat)]
    return min(runs, key=lambda run: run[0])


def summarize(outcomes) -> tuple[int, int]:
    """(prompt tokens fed over all turns, healed turns)."""
    every = [o for session in outcomes for o in session]
    return sum(len(o.ids) for o in every), sum(o.event == "healed" for o in every)


def differing_turns(delta_outcomes, full_outcomes) -> int:
    return sum(
        d.ids != f.ids or d.event != f.event for ds, fs in zip(delta_outcomes, full_outcomes) for d, f in zip(ds, fs)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--template", default="qwen3.5", choices=["qwen3", "qwen3.5"])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    meta, sessions = prepared_sessions(args.sessions, args.seed, args.template)
    turns = sum(len(t) for _, t in sessions)
    full_s, full = best_of(meta, sessions, False, args.repeat)
    delta_s, delta = best_of(meta, sessions, True, args.repeat)
    tokens, healed = summarize(full)
    print(
        f"{args.sessions} sessions, {turns} turns, {healed} healed turns, {tokens} prompt tokens fed "
        f"(template {args.template}, best of {args.repeat})"
    )
    for name, seconds in (("full", full_s), ("delta", delta_s)):
        print(f"  {name:<5} {seconds * 1000:9.1f} ms  {tokens / seconds:12,.0f} tokens/s")
    print(f"  speed ratio delta/full: {full_s / delta_s:.2f}x (baseline = full path)")
    print(f"  turns where the paths fed different ids: {differing_turns(delta, full)}")


if __name__ == "__main__":
    main()
