"""Replay throughput and memory on long SWE sessions, against the naive method, in one run.

    python benchmarks/bench_replay.py                 # 40 swe-long sessions, writes docs/performance.md
    python benchmarks/bench_replay.py --repeat 2      # each row the fastest of two interleaved rounds
    python benchmarks/bench_replay.py --sessions 8 --no-write   # a quick look

The dump: `trace-tools simulate --profile swe-long` (Qwen3, byte-exact and claude-code
behaviours, 25–45 turns a session, contexts ending between 25k and 60k tokens), cached under
`$TRACE_TOOLS_CACHE/bench/`. Every measurement runs in a fresh subprocess on the same dump; wall
time gives turns/s, and the process tree's resident memory is sampled every 20 ms for the peak.
trace_tools' modules are compiled to bytecode first, as `pip install` compiles them for a user.
This machine's speed drifts by ±20 % within an hour, so `--repeat N` measures every row N times
in interleaved rounds (a slow phase then hits each row alike) and keeps each row's fastest run
and its highest peak.

The baseline is the naive method of docs/pipeline.md#where-the-time-goes, written out plainly below (`naive`): for every
turn, transformers' `apply_chat_template(..., tokenize=True)` of the whole conversation with the
dump's template and tokenizer, then the `tree` strategy on those ids, in one process. Ratios are
against it, measured in the same run. The naive prompts are checked to equal ours token for token.
`replay -s tree` is measured as a user types it (default `--workers`, which `replay.executors.auto_workers` picks) and at
`--workers 1`; all strategies at `--workers 1` and `--workers 2`; `reconstruct` as typed and at
`--workers 1`. The `bound` row reads the dump and tokenizes only the text each turn adds (what
reconstruction cannot avoid), in one process, so the distance from `reconstruct` to it is visible; a second table gives each strategy's own time per
turn in the all-strategies run. Each row also reports the CPU time of its process tree.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASKS = {
    "naive": "naive method (full render + tokenize every turn, then tree)",
    "bound": "tokenize only the new text (the reconstruction bound)",
    "reconstruct": "`reconstruct` (default `--workers`)",
    "reconstruct-w1": "`reconstruct --workers 1`",
    "tree": "`replay -s tree` (default `--workers`)",
    "tree-w1": "`replay -s tree --workers 1`",
    "all-w1": "`replay` (all strategies), `--workers 1`",
    "all-w2": "`replay` (all strategies), `--workers 2`",
}


# -- the naive method (docs/pipeline.md#where-the-time-goes) ---------------------------
def naive(dump: Path) -> dict:
    import pyarrow.parquet as pq
    from transformers import PreTrainedTokenizerFast

    from trace_tools.data import Turn
    from trace_tools.io.load import read_dump_meta
    from trace_tools.pipeline.prepared import PreparedTurn
    from trace_tools.render.canonical import canonicalize_messages, canonicalize_response
    from trace_tools.render.tokenizer import ensure_tokenizer_json
    from trace_tools.strategies.base import ReplayContext
    from trace_tools.strategies.tree import TreeStrategy

    meta = read_dump_meta(dump)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(ensure_tokenizer_json(meta.tokenizer)), eos_token="<|im_end|>"
    )
    rows = pq.read_table(dump).to_pylist()
    sessions: dict[str, list[dict]] = {}
    for row in rows:
        sessions.setdefault(row["session_id"], []).append(row)
    prompts = {}
    for session_id, turns in sessions.items():
        prepared = []
        for row in sorted(turns, key=lambda r: r["turn_index"]):
            messages = canonicalize_messages(json.loads(row["messages"]))
            tools = json.loads(row["tools"]) if row["tools"] else None
            ids = tokenizer.apply_chat_template(
                messages,
                tools=tools,
                chat_template=meta.chat_template,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
            turn = Turn(
                session_id,
                row["turn_index"],
                messages,
                row["output_ids"],
                tools=tools,
                output_logprobs=row["output_logprobs"],
                response=json.loads(row["response"]),
                finish_reason=row["finish_reason"],
            )
            prepared.append(PreparedTurn(turn, messages, tools, canonicalize_response(turn.response), ids, "rendered"))
            prompts[(session_id, row["turn_index"])] = ids
        TreeStrategy(ReplayContext()).replay_prepared(session_id, prepared, 0.0)
    return {"turns": len(rows), "prompts": prompts}


# -- the bound: read the dump, tokenize only what each turn adds ---------------------------------
def tokenize_new_text(dump: Path) -> dict:
    """What reconstruction cannot do without: read every turn's messages, parse only what each
    turn appends (`io.rows.HistoryParser`, as the loader does) and encode once each text the
    prompt gains: a new message's content, reasoning and tool calls, and a session's tool
    schemas, which the template renders into its first prompt (no template, no prompt ids
    assembled, nothing compared with the recorded prompt)."""
    import pyarrow.parquet as pq

    from trace_tools.io.load import read_dump_meta
    from trace_tools.io.rows import HistoryParser
    from trace_tools.render.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(read_dump_meta(dump).tokenizer)
    # Read as one Parquet file, not through `pq.read_table`: that goes through pyarrow's dataset
    # layer, which imports pandas (0.25 s here), and `reconstruct` never does.
    rows = pq.ParquetFile(dump).read(columns=["session_id", "turn_index", "messages", "tools"]).to_pylist()
    parsers: dict[str, HistoryParser] = {}
    seen: dict[str, int] = {}  # session → messages already encoded
    encoded = 0
    for row in sorted(rows, key=lambda r: (r["session_id"], r["turn_index"])):
        session = row["session_id"]
        if session not in parsers and row["tools"]:
            encoded += len(tokenizer.encode(row["tools"]))
        messages = parsers.setdefault(session, HistoryParser())(row["messages"])
        new, seen[session] = messages[seen.get(session, 0) :], len(messages)
        for message in new:
            texts = [message.get(key) for key in ("content", "reasoning_content", "tool_calls")]
            text = "".join(t if isinstance(t, str) else json.dumps(t) for t in texts if t)
            encoded += len(tokenizer.encode(text))
    return {"turns": len(rows), "tokens": encoded}


# -- the project's commands ---------------------------------------------------------------------
def project(task: str, dump: Path, out: Path) -> dict:
    if task.startswith("reconstruct"):
        from trace_tools.reconstruct import reconstruct

        workers = 1 if task == "reconstruct-w1" else None  # None: the command's default
        result = reconstruct(dump, owns_process=True, workers=workers)  # as the command line runs it
        return {"turns": result.summary["turns"], "exact": result.summary["exact"]}
    from trace_tools.api import replay

    strategies = ["tree"] if task.startswith("tree") else None
    workers = {"tree": None, "tree-w1": 1, "all-w1": 1, "all-w2": 2}[task]  # None: the command's default
    # As the command line runs it: the process is the replay's (collector paused per session,
    # plots drawn by a helper process while the sessions replay).
    result = replay(dump, out=out, strategies=strategies, workers=workers, owns_process=True)
    return {
        "turns": result.summary["turns_total"],
        "reconstruction": result.reconstruction,
        "strategy_seconds": _strategy_seconds(out),
    }


def _strategy_seconds(out: Path) -> dict[str, float]:
    """Each strategy's own time in a run (the sessions table's `elapsed_s`: its replay of the
    prepared session, after the shared reconstruction)."""
    import pyarrow.parquet as pq

    sessions = pq.read_table(out / "sessions.parquet", columns=["strategy", "elapsed_s"]).to_pydict()
    seconds: dict[str, float] = {}
    for name, elapsed in zip(sessions["strategy"], sessions["elapsed_s"]):
        seconds[name] = seconds.get(name, 0.0) + elapsed
    return seconds


def run_task(task: str, dump: Path, out: Path) -> None:
    """Runs inside the measured subprocess; prints one JSON line. Every row, the naive method and
    the bound included, allocates Arrow's buffers as the command line does (`arrow_pool`)."""
    from trace_tools.arrow_pool import prefer_jemalloc

    started = time.perf_counter()
    prefer_jemalloc()
    run = {"naive": naive, "bound": tokenize_new_text}.get(task)
    result = run(dump) if run else project(task, dump, out)
    elapsed = time.perf_counter() - started
    cpu = sum(
        usage.ru_utime + usage.ru_stime
        for usage in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )
    if task == "naive":
        check = out / "naive-prompts.json"
        check.write_text(json.dumps({f"{s}/{t}": ids for (s, t), ids in result.pop("prompts").items()}))
    print(json.dumps({"elapsed": elapsed, "cpu": cpu, **result}))


# -- measuring ------------------------------------------------------------------------------------
def measure(task: str, dump: Path, scratch: Path) -> dict:
    import psutil

    out = scratch / task
    out.mkdir(parents=True, exist_ok=True)
    env = {key: value for key, value in os.environ.items() if key != "TRACE_TOOLS_WORKERS"}
    command = [sys.executable, __file__, "--task", task, "--dump", str(dump), "--scratch", str(out)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    peak = _sample_peak(psutil.Process(process.pid), process)
    stdout, stderr = process.communicate()
    if process.returncode:
        raise SystemExit(f"{task} failed:\n{stderr[-3000:]}")
    result = json.loads(stdout.strip().splitlines()[-1])
    return {**result, "peak_rss": peak}


def _sample_peak(root, process) -> int:
    peak = 0
    while process.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except Exception:  # a child exiting between listing and reading
            pass
        time.sleep(0.02)
    return peak


def compile_bytecode() -> None:
    """Compile trace_tools' modules to bytecode before measuring, as `pip install` does for a user.
    A checkout run with PYTHONDONTWRITEBYTECODE set (CI and the development machine set it) would
    otherwise compile every module it imports in every measured process, and again in each worker
    and plot helper: 0.1–0.15 s a process on this machine, charged to trace-tools and not to the
    naive method, whose libraries are installed compiled."""
    import compileall

    compileall.compile_dir(ROOT / "trace_tools", quiet=1)


def check_prompts(dump: Path, scratch: Path) -> int:
    """Turns whose naive prompt differs from ours (0 expected)."""
    from trace_tools.pipeline import Pipeline

    naive_prompts = json.loads((scratch / "naive" / "naive-prompts.json").read_text())
    pipeline = Pipeline(dump, prompt_source="rendered")
    differing = 0
    for prepared in pipeline.prepared():
        for p in getattr(prepared, "turns", []):
            differing += naive_prompts[f"{p.turn.session_id}/{p.turn.turn_index}"] != p.prompt_ids
    return differing


def dumps(sessions: int, seed: int) -> tuple[Path, Path]:
    """The benchmark dump and the same dump with every session twice (new ids), cached."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trace_tools.io.cache import CacheKey
    from trace_tools.simulate import simulate

    # Names `cache clear` knows as its own.
    single = CacheKey("bench", f"swe-long-{sessions}-s{seed}").path(".parquet")
    double = CacheKey("bench", f"swe-long-{sessions}x2-s{seed}").path(".parquet")
    single.parent.mkdir(parents=True, exist_ok=True)
    if not single.exists():
        simulate(
            sessions,
            seed,
            template="qwen3",
            behaviours=["byte-exact", "claude-code"],
            out=str(single),
            profile="swe-long",
        )
    if not double.exists():
        table = pq.read_table(single)
        copy = table.set_column(
            0, "session_id", pa.array([f"{s}-copy" for s in table.column("session_id").to_pylist()])
        )
        pq.write_table(
            pa.concat_tables([table, copy]).replace_schema_metadata(table.schema.metadata), double, row_group_size=64
        )
    return single, double


def _shape(dump: Path) -> dict:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(dump, columns=["session_id", "prompt_ids"])
    lengths = pc.list_value_length(table.column("prompt_ids")).to_pylist()
    by_session: dict[str, int] = {}
    for session_id, length in zip(table.column("session_id").to_pylist(), lengths):
        by_session[session_id] = max(by_session.get(session_id, 0), length)
    lengths.sort()
    return {
        "sessions": len(by_session),
        "turns": len(lengths),
        "median_prompt": lengths[len(lengths) // 2],
        "context_min": min(by_session.values()),
        "context_max": max(by_session.values()),
        "mb": dump.stat().st_size / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--no-write", action="store_true", help="do not rewrite docs/performance.md")
    parser.add_argument(
        "--repeat", type=int, default=1, help="measure each row N times in interleaved rounds; keep the fastest"
    )
    parser.add_argument("--only", nargs="+", choices=list(TASKS), help="measure only these (implies --no-write)")
    parser.add_argument("--task", help=argparse.SUPPRESS)
    parser.add_argument("--dump", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.task:
        run_task(args.task, Path(args.dump), Path(args.scratch))
        return
    import tempfile

    compile_bytecode()
    single, double = dumps(args.sessions, args.seed)
    shape = _shape(single)
    print(
        f"dump: {shape['sessions']} sessions, {shape['turns']} turns, median prompt {shape['median_prompt']} tokens, "
        f"contexts end at {shape['context_min']}–{shape['context_max']} tokens, {shape['mb']:.0f} MB",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        results: dict[str, dict] = {}
        doubled: dict[str, dict] = {}
        for round_ in range(max(1, args.repeat)):
            where = scratch / f"round{round_}"  # a fresh run directory each time: nothing to resume
            for task in args.only or TASKS:
                measured = measure(task, single, where)
                seconds, rss = measured["elapsed"], measured["peak_rss"] / 2**30
                print(f"  {task}: {seconds:.1f} s, {measured['cpu']:.1f} s CPU, peak RSS {rss:.2f} GiB", flush=True)
                results[task] = _fastest(results.get(task), measured)
            if not args.only:
                for task in ("all-w1", "all-w2"):
                    doubled[task] = _fastest(doubled.get(task), measure(task, double, where / "double"))
        if args.only:
            return
        differing = check_prompts(single, scratch / "round0")
    table = report(shape, results, doubled, differing, args)
    print(table)
    if not args.no_write:
        write_measured(ROOT / "docs" / "performance.md", table)


PROFILE_HEADING = "\n## Where the time goes"  # written by hand from benchmarks/profile_replay.py


def write_measured(path: Path, table: str) -> None:
    """The measured tables, followed by the page's profile section as it was."""
    kept = path.read_text() if path.exists() else ""
    path.write_text(table + (kept[kept.index(PROFILE_HEADING) :] if PROFILE_HEADING in kept else ""))


def _fastest(best: dict | None, measured: dict) -> dict:
    """The faster of two measurements of a row, with the higher of their peak RSS: on a shared
    machine a slow phase can hit any row, so rounds are interleaved and each row keeps its best."""
    if best is None:
        return measured
    return {**min(best, measured, key=lambda m: m["elapsed"]), "peak_rss": max(best["peak_rss"], measured["peak_rss"])}


def report(shape: dict, results: dict, doubled: dict, differing: int, args: argparse.Namespace) -> str:
    import trace_tools

    base = shape["turns"] / results["naive"]["elapsed"]
    lines = [
        "# Replay performance",
        "",
        f"**Measured, not generated** ({time.strftime('%Y-%m-%d')}, trace-tools {trace_tools.__version__}) by "
        "`python benchmarks/bench_replay.py"
        + (f" --sessions {args.sessions}" if args.sessions != 40 else "")
        + (f" --repeat {args.repeat}" if args.repeat > 1 else "")
        + "` on this machine "
        f"({os.cpu_count()} cores), every row in the same run on the same dump"
        + (
            f" (each row the fastest of {args.repeat} interleaved rounds, with the highest peak RSS)"
            if args.repeat > 1
            else ""
        )
        + f": {shape['sessions']} simulated "
        f"`swe-long` Qwen3 sessions (byte-exact and claude-code), {shape['turns']} turns, median prompt "
        f"{shape['median_prompt']:,} tokens, contexts ending at {shape['context_min']:,}–{shape['context_max']:,} "
        f"tokens, {shape['mb']:.0f} MB of Parquet. Peak RSS is the whole process tree's.",
        "",
        "| | turns/s | vs the naive method | CPU s (process tree) | peak RSS | peak RSS, sessions doubled |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for task, label in TASKS.items():
        rate = shape["turns"] / results[task]["elapsed"]
        again = doubled.get(task)
        growth = (
            f"{again['peak_rss'] / 2**30:.2f} GiB ({again['peak_rss'] / results[task]['peak_rss'] - 1:+.0%})"
            if again
            else ""
        )
        lines.append(
            f"| {label} | {rate:.1f} | {rate / base:.1f}× | {results[task].get('cpu', 0):.1f} "
            f"| {results[task]['peak_rss'] / 2**30:.2f} GiB | {growth} |"
        )
    bound, bound_cpu = results["bound"]["elapsed"], results["bound"]["cpu"]
    lines += [
        "",
        f"`reconstruct` takes {results['reconstruct']['elapsed'] / bound:.2f}× the time of the bound "
        f"(tokenize only the new text, in one process), {results['reconstruct']['cpu'] / bound_cpu:.2f}× its CPU "
        f"time; with `--workers 1`, {results['reconstruct-w1']['elapsed'] / bound:.2f}× and "
        f"{results['reconstruct-w1']['cpu'] / bound_cpu:.2f}×.",
        "",
        "Each strategy's own time in the all-strategies `--workers 1` run (the sessions table's "
        "`elapsed_s`: its replay of a prepared session; the shared reconstruction, rows, shards and "
        "report are not in it):",
        "",
        "| strategy | ms per turn | turns/s |",
        "|---|---:|---:|",
    ]
    for name, seconds in sorted(results["all-w1"].get("strategy_seconds", {}).items(), key=lambda item: -item[1]):
        lines.append(f"| `{name}` | {1000 * seconds / shape['turns']:.2f} | {shape['turns'] / seconds:,.0f} |")
    stats = results["all-w1"].get("reconstruction") or {}
    lines += [
        "",
        f"The naive prompts equal the pipeline's on {shape['turns'] - differing} of {shape['turns']} turns.",
        f"Reconstruction in the all-strategies run: {stats.get('incremental_renders', 0):,} incremental renders, "
        f"{stats.get('full_renders', 0):,} full renders "
        f"({', '.join(f'{k}: {v}' for k, v in (stats.get('full_renders_by_reason') or {}).items()) or 'none'}); "
        f"{stats.get('tokens_encoded', 0):,} tokens encoded, {stats.get('tokens_reused', 0):,} reused.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
