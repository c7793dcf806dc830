"""report.html at scale: file size, build time and load time in headless Chromium for a large run.

Writes a synthetic run directory with the files of docs/run_directory.md#what-the-files-hold (plus drift.parquet) for N sessions and
every strategy name (random but well-formed turns, samples with provenance, drift windows and a
few quarantined sessions), builds its report.html, then opens it in headless Chromium: the time
from navigation until the page's script has drawn the overview and the first page of the session
list, and the time to open one session (its chunk decompressed and drawn). Best of `--repeat`.

    python benchmarks/bench_report_html.py --sessions 10000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

EVENTS = ["trained"] * 8 + ["partly_trained", "demoted_by_merge", "zeroed_by_realign", "rolled_back"]
PROMPT_EVENTS = ["clean"] * 8 + ["forked", "realigned", "healed", "restored", "rendered"]
TOOLS = ["Bash", "Read", "Edit", "Grep", "Write", "text"]
CAUSES = ["whitespace", "schema_default", "key_order_or_spacing", "reasoning", "tokenizer_boundary"]
WORDS = [" the", " def", "(", ")", ":", "\n", " return", " x", '"', " =", "}}", "<tool_call>", " if", "_all"]


def synthetic_run(out: Path, sessions: int = 10_000, seed: int = 0) -> Path:
    """A finished run directory (summary.json, run.json, tables, plots, drift.parquet) with `sessions` sessions."""
    from trace_tools.io.rundir import DRIFT_SCHEMA
    from trace_tools.io.write import write_parquet_atomic
    from trace_tools.report.metrics import summarize
    from trace_tools.report.plots import write_plots
    from trace_tools.strategies.registry import available_strategies

    rng = np.random.default_rng(seed)
    strategies = list(available_strategies())
    out.mkdir(parents=True, exist_ok=True)
    shape = _Shape(rng, sessions)
    turns, session_frames, samples = [], [], []
    for name in strategies:
        events, trained = shape.outcome(rng)
        turns.append(shape.turn_frame(rng, name, events, trained))
        frame, table = shape.samples(rng, name, trained)
        session_frames.append(frame)
        samples.append(table)
    tables = {
        "turns": pd.concat(turns, ignore_index=True),
        "sessions": pd.concat(session_frames, ignore_index=True),
        "quarantine": _quarantine(),
        "fidelity": pd.DataFrame({"exact": [True] * 10}),
    }
    for name in ("turns", "sessions", "quarantine"):
        tables[name].to_parquet(out / f"{name}.parquet", index=False)
    pq.write_table(pa.concat_tables(samples), out / "samples.parquet")
    loaded = SimpleNamespace(session_count=sessions + 5, rows=len(shape.gen), vocab_checked=True)
    (out / "summary.json").write_text(json.dumps(summarize(tables, loaded, strategies)))
    (out / "run.json").write_text(
        json.dumps(
            {"trace_tools_version": "synthetic", "created_at": "", "inputs": {"dump": "synthetic"}, "options": {}}
        )
    )
    write_plots(out / "plots", tables)
    drift = [
        _drift_row(rng, shape.ids[s], int(t), CAUSES[c] if c >= 0 else None)
        for s, t, c, last in zip(shape.session, shape.turn, shape.cause, shape.last)
        if not last
    ]
    write_parquet_atomic(pa.Table.from_pylist(drift, schema=DRIFT_SCHEMA), out / "drift.parquet")
    return out


class _Shape:
    """Sessions of 3–20 turns: each turn's generated tokens, the context before it and its drift cause."""

    def __init__(self, rng, sessions: int):
        self.ids = [f"synth-{i:05d}" for i in range(sessions)]
        self.turns = rng.integers(3, 21, sessions)
        self.session = np.repeat(np.arange(sessions), self.turns)
        self.first = np.cumsum(self.turns) - self.turns  # row of each session's turn 0
        self.turn = np.arange(len(self.session)) - np.repeat(self.first, self.turns)
        self.last = self.turn == np.repeat(self.turns, self.turns) - 1
        self.gen = rng.integers(3, 13, len(self.session))
        self.context = rng.integers(3, 11, len(self.session))
        self.cause = np.where(
            (rng.random(len(self.session)) < 0.2) & ~self.last, rng.integers(0, len(CAUSES), len(self.session)), -1
        )
        self.behaviour = np.array(["byte-exact", "claude-code", "streaming", "retry"])[rng.integers(0, 4, sessions)]

    def outcome(self, rng) -> tuple[np.ndarray, np.ndarray]:
        """One strategy's event and trained tokens per turn."""
        events = np.array(EVENTS)[rng.integers(0, len(EVENTS), len(self.gen))]
        trained = np.where(events == "trained", self.gen, np.where(events == "partly_trained", self.gen // 2, 0))
        return events, trained

    def turn_frame(self, rng, name: str, events: np.ndarray, trained: np.ndarray) -> pd.DataFrame:
        tools = np.array(TOOLS)[self.turn % len(TOOLS)]
        prompt_events = np.array(PROMPT_EVENTS)[rng.integers(0, len(PROMPT_EVENTS), len(self.gen))]
        return pd.DataFrame(
            {
                "strategy": name,
                "session_id": np.array(self.ids)[self.session],
                "turn_index": self.turn,
                "tool": tools,
                "tool_names": [[t] for t in tools],
                "generated_tokens": self.gen,
                "trained_tokens": trained,
                "event": events,
                "prompt_event": prompt_events,
                "drift_position": np.nan,
                "prompt_tokens": 100 + 20 * self.turn,
                "genuine": True,
                "behaviour": self.behaviour[self.session],
                "drift_cause": np.where(self.cause >= 0, np.array(CAUSES)[np.maximum(self.cause, 0)], None),
            }
        )

    def samples(self, rng, name: str, trained: np.ndarray) -> tuple[pd.DataFrame, pa.Table]:
        """1–3 samples per session: the first spans every turn, later ones a suffix (a fork re-sending context)."""
        rows, sources, masks = [], [], []
        for s, sid in enumerate(self.ids):
            n, base = int(self.turns[s]), int(self.first[s])
            starts = [0] + sorted({int(x) for x in rng.integers(1, n, int(rng.choice([0, 0, 0, 1, 2])))})
            for k, first in enumerate(starts):
                span = np.arange(base + first, base + (starts[k + 1] if k + 1 < len(starts) else n))
                # three runs per turn: the context before it, its trained prefix, its untrained rest
                lengths = np.stack([self.context[span], trained[span], self.gen[span] - trained[span]], 1).ravel()
                turn = self.turn[span]
                source = np.repeat(np.stack([np.full(len(span), -1), turn, turn], 1).ravel(), lengths)
                mask = np.repeat(np.tile([0, 1, 0], len(span)), lengths)[int(self.context[span[0]]) :]
                rows.append((sid, k, len(source), len(mask)))
                sources.append(source.astype(np.int32))
                masks.append(mask.astype(np.int32))
        table = pa.table(
            {
                "strategy": [name] * len(rows),
                "session_id": [r[0] for r in rows],
                "sample_index": [r[1] for r in rows],
                "token_ids": _lists([np.zeros(r[2], np.int32) for r in rows]),
                "response_length": [r[3] for r in rows],
                "loss_mask": _lists(masks),
                "logprobs": _lists([np.zeros(r[3], np.float32) for r in rows]),
                "source_turn": _lists(sources),
                "reward": [1.0] * len(rows),
            }
        )
        per = (
            pd.DataFrame(rows, columns=["session_id", "sample_index", "n", "response"])
            .groupby("session_id", sort=False)
            .agg(samples=("n", "size"), forwarded_tokens=("n", "sum"))
            .reset_index()
        )
        generated = np.add.reduceat(self.gen, self.first)
        trained_total = np.add.reduceat(trained, self.first)
        per = per.assign(
            strategy=name,
            turns=self.turns,
            forks=per["samples"] - 1,
            generated_tokens=generated,
            trained_tokens=trained_total,
            context_tokens=per["forwarded_tokens"] - trained_total,
            **_counters(),
        )
        return per, table


def _lists(arrays: list[np.ndarray]) -> pa.ListArray:
    offsets = np.concatenate([[0], np.cumsum([len(a) for a in arrays])]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(arrays)))


def _quarantine() -> pd.DataFrame:
    """Five sessions rejected at load, with reasons, so the quarantine summary has something to show."""
    frame = pd.DataFrame(
        {
            "session_id": [f"synth-bad-{i}" for i in range(5)],
            "turn_index": [0, 1, None, 2, 0],
            "reason": ["bad_json", "logprobs_length", "missing_column", "duplicate_turn", "bad_json"],
            "detail": [
                "messages: Expecting value",
                "3 logprobs for 4 ids",
                "no output_ids",
                "turn 2 twice",
                "tools: Expecting ','",
            ],
        }
    )
    frame["turn_index"] = frame["turn_index"].astype("Int32")
    return frame


def _drift_row(rng, sid: str, turn: int, cause: str | None) -> dict:
    drifted = cause is not None

    def words(k):
        return [WORDS[i] for i in rng.integers(0, len(WORDS), k)]

    served, rendered = (int(rng.integers(4, 40)), 40) if drifted else (0, 0)
    return {
        "session_id": sid,
        "turn_index": turn,
        "echo_turn": turn + 1,
        "cause": cause,
        "causes": [cause] if cause else [],
        "token_drift": drifted,
        "divergence": 500 + turn if drifted else None,
        "served_len": 520 + turn,
        "prompt_len": 480,
        "message_diff": ["arguments.replace_all: <missing> → false"] if drifted else [],
        "window_start": 484 + turn if drifted else 0,
        "shared_ids": list(range(16)) if drifted else [],
        "served_ids": list(range(100, 100 + served)),
        "rendered_ids": list(range(200, 200 + rendered)),
        "shared_tokens": words(16) if drifted else [],
        "served_tokens": words(served),
        "rendered_tokens": words(rendered),
    }


def _counters() -> dict[str, int]:
    from trace_tools.data import COUNTERS

    return dict.fromkeys(COUNTERS, 0)


def measure(run: Path, repeat: int = 3) -> dict[str, float]:
    """Build report.html and time it in headless Chromium (best of `repeat`)."""
    from trace_tools.report.html import write_html_report
    from trace_tools.report.html.chromium import Chromium

    started = time.perf_counter()
    page = write_html_report(run)
    build = time.perf_counter() - started
    loads, readies, opens = [], [], []
    with Chromium() as browser:
        for _ in range(repeat):
            loads.append(browser.open(page.as_uri(), ready="window.reportReady"))
            readies.append(browser.evaluate("window.reportReady") / 1000)  # ms since navigation, in the page
            nodes = browser.evaluate("document.getElementsByTagName('*').length")
            first = browser.evaluate("document.querySelector('#session-rows a').getAttribute('href')")
            started = time.perf_counter()
            browser.evaluate(f"location.hash = {json.dumps(first)}")
            browser.wait_for("!!document.getElementById('session-body').dataset.session")
            opens.append(time.perf_counter() - started)
    return {
        "bytes": page.stat().st_size,
        "build_s": build,
        "load_s": min(loads),
        "script_ready_s": min(readies),
        "open_session_s": min(opens),
        "dom_elements": nodes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, help="keep the synthetic run here (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = args.out or Path(tmp) / "run"
        started = time.perf_counter()
        synthetic_run(run, args.sessions)
        print(f"synthetic run of {args.sessions:,} sessions written in {time.perf_counter() - started:.1f} s")
        result = measure(run, args.repeat)
    print(f"report.html: {result['bytes'] / 1e6:.1f} MB, built in {result['build_s']:.1f} s")
    print(
        f"load in Chromium (navigation → overview and session list drawn): {result['load_s']:.2f} s "
        f"(script ready at {result['script_ready_s']:.2f} s); {result['dom_elements']:,} DOM elements"
    )
    print(f"open one session (decompress its chunk, draw it): {result['open_session_s']:.2f} s")


if __name__ == "__main__":
    main()
