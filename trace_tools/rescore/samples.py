"""`rescore --samples`: the mismatch each strategy's samples hand the trainer, attributed and corrected.

A replay run's samples (`RUN/samples/`) hold, per emitted sample, its token ids, the loss mask and the
rollout logprobs over the response region and, per token, the turn that generated it. Each
trained token is

1. scored in the sample's own context (the trainer's logprob): `score_samples` plans every sample
   of a session together, so samples that share a prefix -- one strategy's growing chains, or two
   strategies emitting the same sequence -- are forwarded once (`plan.py`, `scoring.py`);
   `compare` also takes trainer logprobs from elsewhere (a trainer's own export, aligned to the
   samples by token identity), in the same per-sample layout;
2. attributed: its turn's tool, simulator behaviour and drift cause (`turns.parquet`), the
   strategy's event for the turn's context (`prompt_event`), and whether the context it is
   trained in is the one the model was served (the sample's tokens before the turn equal the
   turn's recorded `prompt_ids`, and the turn's tokens its `output_ids`);
3. measured (`mismatch.py`) and put through the correction modes (`corrections.py`).

Results go into the run directory: `strategies[NAME]["mismatch"]` in summary.json and
`mismatch_tokens.parquet`, `mismatch_turns.parquet`, `mismatch_sessions.parquet`.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from trace_tools.data import Session, behaviour_label
from trace_tools.errors import TraceToolsError, UnknownName, UnusableInput
from trace_tools.io.rundir import MISMATCH_TABLES
from trace_tools.rescore import align, corrections, mismatch, plan

SAMPLE_COLUMNS = [
    "strategy",
    "session_id",
    "sample_index",
    "token_ids",
    "response_length",
    "loss_mask",
    "logprobs",
    "source_turn",
]
TURN_INFO = ["tool", "behaviour", "drift_cause", "prompt_event"]
# The strategy's word for how it built a turn's context → the provenance it names (others are kept as they are).
CONTEXT_ORIGINS = {
    "clean": "unreported",  # the strategy saw nothing to report, yet the context is not the served one
    "rendered": "re-rendered",
    "healed": "healed_splice",
    "realigned": "realigned",
    "restored": "restored_echo",
}
SERVED = "served"
UNKNOWN = "unknown"
UNLABELLED = behaviour_label(None)  # what replay writes for a session without simulator ground truth
NO_CAUSE = "none"
GROUPS = {  # summary key → token column; sequences are turns inside samples for these
    "by_tool": "tool",
    "by_drift_cause": "cause",
    "by_context": "context_origin",
}
CORRECTION_GROUPS = {"by_tool": "tool", "by_drift_cause": "cause"}
TURN_METRICS = ("k1_kl", "k3_kl", "log_ppl_diff", "mean_abs_diff", "max_abs_diff")
NO_ROLLOUT_LOGPROB = "no_rollout_logprob"
NOT_SCORED = "not_scored"
NOT_ALIGNED = "not_aligned"  # trainer logprobs from files: no trainer sample aligned covers the token


@dataclass
class SampleMismatch:
    """Per-token, per-turn and per-session tables and the per-strategy summaries of one run."""

    tokens: pd.DataFrame
    turns: pd.DataFrame
    sessions: pd.DataFrame
    strategies: dict[str, dict[str, Any]]
    run: dict[str, Any] = field(default_factory=dict)  # model, options, throughput: summary.json["mismatch"]

    def headlines(self) -> dict[str, Any]:
        """Per strategy `max_abs_diff`, `k3_kl`, `log_ppl_abs_diff`, overall and by behaviour (`--json`)."""
        out: dict[str, Any] = {}
        for name, entry in self.strategies.items():
            out[name] = mismatch.headline(entry)
            if entry.get("by_behaviour"):
                out[name]["by_behaviour"] = {b: mismatch.headline(m) for b, m in entry["by_behaviour"].items()}
        return out


# -- reading the run --------------------------------------------------------------------------------
def load_samples(run_dir: Path, strategies: Sequence[str] | None = None) -> pd.DataFrame:
    """The samples of `strategies` (all when None), or an error naming the fix."""
    from trace_tools.io.rundir import require_run
    from trace_tools.io.sample_parts import read_samples

    run = require_run(run_dir)
    table = read_samples(run, SAMPLE_COLUMNS)
    if table is None or not table.num_rows:
        raise UnusableInput(f"{run} holds no samples (replayed with --no-samples?); replay again without --no-samples")
    samples = table.to_pandas()
    present = list(dict.fromkeys(samples["strategy"]))
    if strategies:
        unknown = [s for s in strategies if s not in present]
        if unknown:
            raise UnknownName("strategy", unknown[0], present)
        samples = samples[samples["strategy"].isin(list(strategies))]
    return samples.reset_index(drop=True)


def turn_info(run_dir: Path) -> pd.DataFrame:
    """turns.parquet's attribution columns, keyed by strategy, session and turn, with the drift
    cause each turn's context inherits (the latest earlier turn of its session whose echo drifted)."""
    from trace_tools.io.rundir import read_table

    turns = read_table(run_dir, "turns", ["strategy", "session_id", "turn_index", *TURN_INFO])
    for column in TURN_INFO:
        if column not in turns:
            turns[column] = None
    turns = turns.sort_values(["strategy", "session_id", "turn_index"]).reset_index(drop=True)
    causes = turns["drift_cause"].where(turns["drift_cause"].notna(), None)
    shifted = causes.groupby([turns["strategy"], turns["session_id"]]).shift(1)
    turns["context_drift_cause"] = shifted.groupby([turns["strategy"], turns["session_id"]]).ffill()
    return turns.set_index(["strategy", "session_id", "turn_index"])


@dataclass
class ServedTurns:
    """The dump's recorded prompt (as a digest: a long dump's prompts would not fit in memory) and
    output ids per turn of the sessions asked for, to tell a served context from another."""

    prompts: dict[tuple[str, int], bytes]
    outputs: dict[tuple[str, int], np.ndarray]
    problem: str | None = None  # why the check could not be made, when it could not
    steps: dict[str, int] = field(default_factory=dict)  # session → its rollout step, where the dump has one

    @classmethod
    def from_run(cls, run_dir: Path, sessions: set[str], dump: str | os.PathLike | None = None) -> "ServedTurns":
        from trace_tools.io.load import iter_sessions
        from trace_tools.io.rundir import load_run_info

        source = dump or load_run_info(run_dir).get("inputs", {}).get("dump")
        if not source:
            return cls({}, {}, "run.json names no dump")
        prompts: dict[tuple[str, int], bytes] = {}
        outputs: dict[tuple[str, int], np.ndarray] = {}
        steps: dict[str, int] = {}
        columns = ("session_id", "turn_index", "output_ids", "prompt_ids", "step")
        try:
            for session in iter_sessions(str(source), columns=columns):
                if not isinstance(session, Session) or session.session_id not in sessions:
                    continue
                if session.step is not None:
                    steps[session.session_id] = session.step
                for turn in session.turns:
                    key = (turn.session_id, turn.turn_index)
                    outputs[key] = np.asarray(turn.output_ids, dtype=np.int64)
                    if turn.prompt_ids is not None:
                        prompts[key] = _digest(turn.prompt_ids)
        except TraceToolsError as error:
            return cls({}, {}, f"the dump {source} could not be read ({error})")
        return cls(prompts, outputs, None, steps)

    def served(self, key: tuple[str, int], context: np.ndarray, run: np.ndarray) -> bool | None:
        """Whether `context` is the turn's served prompt and `run` (its tokens in the sample) a prefix
        of its served output; None when the dump recorded no prompt ids for it."""
        prompt = self.prompts.get(key)
        if prompt is None:
            return None
        output = self.outputs.get(key, np.empty(0, dtype=np.int64))
        return bool(len(run) <= len(output) and np.array_equal(run, output[: len(run)]) and _digest(context) == prompt)


def _digest(ids: Any) -> bytes:
    """A fingerprint of a token id sequence: BLAKE2b-128 of its int64 bytes."""
    return hashlib.blake2b(np.asarray(ids, dtype=np.int64).tobytes(), digest_size=16).digest()


# -- trained tokens and their attribution -----------------------------------------------------------
def trained_tokens(samples: pd.DataFrame, turns: pd.DataFrame, served: ServedTurns) -> pd.DataFrame:
    """One row per trained token (loss mask 1) of every sample, with its rollout logprob and attribution.

    `sample_row` indexes `samples`; `response_position` indexes the sample's response region (the
    layout of the `logprobs` and `loss_mask` columns, and of trainer logprobs given to `compare`)."""
    parts = [_sample_tokens(row, i, served) for i, row in enumerate(samples.itertuples(index=False))]
    parts = [p for p in parts if p is not None]
    if not parts:
        return pd.DataFrame(columns=_TOKEN_COLUMNS)
    tokens = pd.concat(parts, ignore_index=True)
    keys = pd.MultiIndex.from_arrays([tokens["strategy"], tokens["session_id"], tokens["turn_index"]])
    info = turns.reindex(keys)
    for column in [*TURN_INFO, "context_drift_cause"]:
        tokens[column] = info[column].to_numpy() if column in info else None
    tokens["tool"] = tokens["tool"].fillna(UNKNOWN)
    tokens["behaviour"] = tokens["behaviour"].fillna(UNKNOWN)
    # A token's drift cause: what made its context differ (an earlier turn's echo), else its own turn's.
    tokens["cause"] = tokens["context_drift_cause"].fillna(tokens["drift_cause"]).fillna(NO_CAUSE)
    origin = tokens["prompt_event"].map(lambda e: CONTEXT_ORIGINS.get(e, e) if isinstance(e, str) else UNKNOWN)
    tokens["context_origin"] = np.where(tokens["context_served"].eq(True), SERVED, origin)
    tokens["step"] = tokens["session_id"].map(served.steps).astype("Int64")
    return tokens[_TOKEN_COLUMNS]


_TOKEN_COLUMNS = [
    "strategy",
    "session_id",
    "sample_index",
    "sample_row",
    "response_position",
    "position",
    "turn_index",
    "token_id",
    "rollout_logprob",
    "tool",
    "behaviour",
    "drift_cause",
    "context_drift_cause",
    "cause",
    "prompt_event",
    "context_served",
    "context_origin",
    "step",
]


def _sample_tokens(sample: Any, row: int, served: ServedTurns) -> pd.DataFrame | None:
    ids = np.asarray(sample.token_ids, dtype=np.int64)
    length = int(sample.response_length)
    start = len(ids) - length
    trained = np.flatnonzero(np.asarray(sample.loss_mask, dtype=np.int8) == 1)
    if trained.size == 0:
        return None
    positions = start + trained
    source = np.asarray(sample.source_turn, dtype=np.int64)
    turn_of = source[positions]
    context_served = np.empty(trained.size, dtype=object)
    for turn in np.unique(turn_of):
        mine = turn_of == turn
        context_served[mine] = _turn_served(served, sample.session_id, int(turn), ids, source, positions[mine][0])
    logprobs = np.asarray(sample.logprobs, dtype=np.float64)
    return pd.DataFrame(
        {
            "strategy": sample.strategy,
            "session_id": sample.session_id,
            "sample_index": int(sample.sample_index),
            "sample_row": row,
            "response_position": trained,
            "position": positions,
            "turn_index": turn_of,
            "token_id": ids[positions],
            "rollout_logprob": logprobs[trained] if logprobs.size == length else np.nan,
            "context_served": context_served,
        }
    )


def _turn_served(
    served: ServedTurns, session_id: str, turn: int, ids: np.ndarray, source: np.ndarray, first: int
) -> bool | None:
    """Is the turn's run of tokens (the stretch around its first trained token that it generated)
    in its served context?"""
    if turn < 0:
        return False  # a trained token no turn generated: never what the engine sampled
    begin = first
    while begin > 0 and source[begin - 1] == turn:
        begin -= 1
    end = first
    while end < len(ids) and source[end] == turn:
        end += 1
    return served.served((session_id, turn), ids[:begin], ids[begin:end])


# -- scoring ----------------------------------------------------------------------------------------
def sample_inputs(samples: pd.DataFrame, vocab_size: int) -> list[plan.TurnInput]:
    """One scoring input per sample: the sequence up to its last trained token, scored from its
    first trained token on (the plan shares prefixes between the samples of a session)."""
    inputs = []
    for row in samples.itertuples(index=False):
        ids = [int(i) for i in row.token_ids]
        start = len(ids) - int(row.response_length)
        trained = np.flatnonzero(np.asarray(row.loss_mask, dtype=np.int8) == 1)
        if trained.size == 0:
            inputs.append(plan.TurnInput(row.session_id, int(row.sample_index), [], None, [], skip_reason="untrained"))
            continue
        first, last = start + int(trained[0]), start + int(trained[-1])
        prompt, output = ids[:first], ids[first : last + 1]
        reason = plan.sequence_problem(prompt, output, vocab_size)
        inputs.append(plan.TurnInput(row.session_id, int(row.sample_index), output, None, prompt, skip_reason=reason))
    return inputs


def score_samples(
    scoring_model: Any,
    samples: pd.DataFrame,
    *,
    share_prefix: bool = True,
    max_batch_tokens: int | None = None,
    chunk_positions: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> tuple[list[np.ndarray], dict[str, Any]]:
    """Per sample, the model's logprobs over its response region (NaN where not scored), and the
    scorer's throughput figures."""
    from trace_tools.rescore.scoring import score_turns

    inputs = sample_inputs(samples, scoring_model.vocab_size)
    scored = score_turns(
        scoring_model,
        inputs,
        share_prefix=share_prefix,
        max_batch_tokens=max_batch_tokens,
        chunk_positions=chunk_positions,
        on_progress=on_progress,
    )
    out = []
    for row, turn, values in zip(samples.itertuples(index=False), inputs, scored.recomputed):
        length = int(row.response_length)
        full = np.full(length, np.nan)
        if values is not None:
            offset = len(turn.prompt_ids or []) - (len(row.token_ids) - length)
            full[offset : offset + len(values)] = values
        out.append(full)
    throughput = scored.throughput(inputs)
    throughput["samples_per_s"] = len(samples) / scored.seconds if scored.seconds > 0 else None
    return out, throughput


# -- comparing and summing up -----------------------------------------------------------------------
def compare(tokens: pd.DataFrame, trainer_logprobs: Sequence[np.ndarray]) -> pd.DataFrame:
    """`tokens` with `trainer_logprob` (from per-sample arrays over the response region, e.g.
    `score_samples` or a trainer export aligned by token identity), `delta` = rollout − trainer
    and `log_ratio` = trainer − rollout; `compared` is False where either logprob is missing."""
    tokens = tokens.copy()
    values = np.full(len(tokens), np.nan)
    rows = tokens["sample_row"].to_numpy()
    positions = tokens["response_position"].to_numpy()
    for row in np.unique(rows):
        mine = rows == row
        values[mine] = np.asarray(trainer_logprobs[row], dtype=np.float64)[positions[mine]]
    tokens["trainer_logprob"] = values
    tokens["delta"] = tokens["rollout_logprob"] - values
    tokens["log_ratio"] = -tokens["delta"]
    tokens["compared"] = np.isfinite(tokens["delta"].to_numpy())
    return tokens


def with_outcomes(tokens: pd.DataFrame, options: corrections.CorrectionOptions) -> pd.DataFrame:
    """`tokens` with one column per correction mode: the token's outcome (`corrections.KEPT`,
    `CLIPPED`, `MASKED`), null where it was not compared -- what report.html's token strip shows."""
    tokens = tokens.copy()
    outcomes = {mode: pd.Series(pd.NA, index=tokens.index, dtype="Int8") for mode in corrections.MODES}
    for _, part in tokens[tokens["compared"]].groupby("strategy", sort=False):
        found = corrections.token_outcomes(part["log_ratio"].to_numpy(), part["sample_row"].to_numpy(), options)
        for mode, values in found.items():
            outcomes[mode].loc[part.index] = values
    return tokens.assign(**outcomes)


def summarize(
    tokens: pd.DataFrame, missing: str = NOT_SCORED
) -> tuple[dict[str, dict[str, Any]], pd.DataFrame, pd.DataFrame]:
    """Per strategy the summary.json block, the per-turn table and the per-session table, from
    `with_outcomes`' tokens; `missing` names why a token with a rollout logprob has no trainer logprob."""
    strategies: dict[str, dict[str, Any]] = {}
    turn_tables, session_tables = [], []
    for name, part in tokens.groupby("strategy", sort=False):
        compared = part[part["compared"]].reset_index(drop=True)
        entry = _metrics(compared, "sample_row")
        if not compared["behaviour"].isin([UNKNOWN, UNLABELLED]).all():  # the dump has simulator ground truth
            entry["by_behaviour"] = _grouped(compared, "behaviour", "sample_row")
        if compared["step"].notna().any():  # the per-step curve, where the dump records steps
            entry["by_step"] = _grouped(compared[compared["step"].notna()], "step", "sample_row")
        for key, column in GROUPS.items():
            entry[key] = _grouped(compared, column, "segment")
        entry["not_compared"] = _not_compared(part, missing)
        outcomes = {mode: compared[mode].to_numpy(dtype=np.int8) for mode in corrections.MODES}
        entry["corrections"] = corrections.preview(compared, outcomes, CORRECTION_GROUPS)
        strategies[str(name)] = entry
        turn_tables.append(_turn_table(compared, outcomes))
        session_tables.append(_session_table(compared))
    return strategies, _concat(turn_tables), _concat(session_tables)


def _metrics(tokens: pd.DataFrame, sequence: str) -> dict[str, Any]:
    keys = tokens["sample_row"] if sequence == "sample_row" else _segments(tokens)
    return mismatch.mismatch_metrics(tokens["trainer_logprob"], tokens["rollout_logprob"], keys)


def _segments(tokens: pd.DataFrame) -> np.ndarray:
    """A label per (sample, turn): the sequences of the per-tool, per-cause and per-context metrics."""
    return tokens["sample_row"].to_numpy() * (1 << 20) + tokens["turn_index"].to_numpy()


def _grouped(tokens: pd.DataFrame, column: str, sequence: str) -> dict[str, Any]:
    return {str(value): _metrics(part, sequence) for value, part in tokens.groupby(column, sort=True, dropna=False)}


def _not_compared(tokens: pd.DataFrame, reason: str) -> dict[str, Any]:
    missing = tokens[~tokens["compared"]]
    reasons = np.where(missing["rollout_logprob"].notna(), reason, NO_ROLLOUT_LOGPROB)
    counts = pd.Series(reasons, dtype=object).value_counts()
    return {"tokens": int(len(missing)), "by_reason": {str(k): int(v) for k, v in counts.items()}}


def _turn_table(tokens: pd.DataFrame, outcomes: dict[str, np.ndarray]) -> pd.DataFrame:
    keys = ["strategy", "session_id", "sample_index", "turn_index"]
    labels = ["tool", "behaviour", "cause", "context_origin"]
    rows = []
    frame = tokens.assign(**{f"{mode}_masked": outcomes[mode] == corrections.MASKED for mode in outcomes})
    for key, part in frame.groupby(keys, sort=True):
        metrics = mismatch.mismatch_metrics(part["trainer_logprob"], part["rollout_logprob"], np.zeros(len(part)))
        row = dict(zip(keys, key))
        row.update({label: part[label].iloc[0] for label in labels})
        row["tokens"] = len(part)
        row.update({name: metrics[name] for name in TURN_METRICS})
        row.update({f"{mode}_masked": float(part[f"{mode}_masked"].mean()) for mode in outcomes})
        rows.append(row)
    return pd.DataFrame(rows)


def _session_table(tokens: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (strategy, session_id), part in tokens.groupby(["strategy", "session_id"], sort=True):
        metrics = mismatch.mismatch_metrics(part["trainer_logprob"], part["rollout_logprob"], part["sample_row"])
        rows.append({"strategy": strategy, "session_id": session_id, **metrics})
    return pd.DataFrame(rows)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# -- the command ------------------------------------------------------------------------------------
def rescore_samples(
    run_dir: str | os.PathLike,
    model: Any = "tiny-qwen3",
    *,
    strategies: Sequence[str] | None = None,
    device: str = "auto",
    dtype: str = "auto",
    max_batch_tokens: int | None = None,
    chunk_positions: int | None = None,
    options: corrections.CorrectionOptions | None = None,
    trainer_logprobs: Sequence[np.ndarray] | None = None,
    trainer_dump: Sequence[str | os.PathLike] | None = None,
    trainer_format: str | None = None,
    dump: str | os.PathLike | None = None,
    write: bool = True,
    on_progress: Callable[[int, int], None] | None = None,
) -> SampleMismatch:
    """Score (or take) the trainer logprobs of a run's samples, measure, attribute and preview
    corrections; with `write`, into the run directory (module docstring).

    `trainer_logprobs`: per row of `load_samples(run_dir, strategies)`, an array over the sample's
    response region; `trainer_dump`: a trainer's own sample files (`trace_tools.trainer.read_samples`
    paths, `trainer_format` its format when not detected), aligned to the samples by token identity
    (`align.py`). With either, no model is loaded. `dump` overrides the dump run.json names (for
    the served-context check)."""
    run = Path(run_dir)
    options = options or corrections.CorrectionOptions()
    samples = load_samples(run, strategies)
    served = ServedTurns.from_run(run, set(samples["session_id"]), dump)
    tokens = trained_tokens(samples, turn_info(run), served)
    info: dict[str, Any] = {"options": options.as_dict(), "served_context_check": served.problem or "made"}
    missing = NOT_SCORED
    if trainer_dump is not None:
        if trainer_logprobs is not None:
            raise TraceToolsError("give trainer logprobs either as arrays or as a trainer dump, not both")
        alignment = align.read_and_align(samples, trainer_dump, trainer_format)
        trainer_logprobs, missing = alignment.logprobs, NOT_ALIGNED
        info["model"] = {"model": "trainer logprobs from " + ", ".join(str(p) for p in trainer_dump)}
        info["alignment"] = alignment.as_dict()
    elif trainer_logprobs is None:
        trainer_logprobs, info["model"], info["throughput"] = _score(
            model, samples, device, dtype, max_batch_tokens, chunk_positions, on_progress
        )
    else:
        _check_layout(samples, trainer_logprobs)
        info["model"] = {"model": "trainer logprobs (given)"}
    tokens = with_outcomes(compare(tokens, trainer_logprobs), options)
    strategy_entries, turns, sessions = summarize(tokens, missing)
    result = SampleMismatch(tokens, turns, sessions, strategy_entries, info)
    if write:
        write_results(run, result)
    return result


def _check_layout(samples: pd.DataFrame, trainer_logprobs: Sequence[np.ndarray]) -> None:
    """Given trainer logprobs must cover each sample's response region, one array per sample."""
    if len(trainer_logprobs) != len(samples):
        raise TraceToolsError(f"trainer logprobs for {len(trainer_logprobs)} samples, but the run has {len(samples)}")
    for row, values in zip(samples.itertuples(index=False), trainer_logprobs):
        if len(values) != int(row.response_length):
            raise TraceToolsError(
                f"trainer logprobs of {row.strategy} {row.session_id} sample {row.sample_index}: {len(values)} "
                f"values for a response region of {row.response_length} tokens; align them to the sample first"
            )


def _score(
    model: Any,
    samples: pd.DataFrame,
    device: str,
    dtype: str,
    max_batch_tokens: int | None,
    chunk_positions: int | None,
    on_progress: Callable[[int, int], None] | None,
) -> tuple[list[np.ndarray], dict[str, Any], dict[str, Any]]:
    from trace_tools.rescore import require_torch

    require_torch()
    from trace_tools.rescore.models import ScoringModel, load_model
    from trace_tools.rescore.scoring import check_head

    scoring_model = model if isinstance(model, ScoringModel) else load_model(model, device, dtype)
    check_head(scoring_model)
    started = time.perf_counter()
    values, throughput = score_samples(
        scoring_model,
        samples,
        max_batch_tokens=max_batch_tokens,
        chunk_positions=chunk_positions,
        on_progress=on_progress,
    )
    throughput["wall_s"] = time.perf_counter() - started
    return values, scoring_model.identity(), throughput


def write_results(run: Path, result: SampleMismatch) -> None:
    """The three tables, each strategy's block plus the run's `mismatch` block in summary.json, and
    report.html re-rendered where the run has one (its token strips, `report/html/token_strip.py`)."""
    from trace_tools.io.rundir import load_summary
    from trace_tools.io.write import write_json_atomic, write_parquet_atomic

    summary = load_summary(run)
    for name, entry in result.strategies.items():
        summary.setdefault("strategies", {}).setdefault(name, {})["mismatch"] = entry
    summary["mismatch"] = result.run
    tokens = result.tokens.drop(columns=["sample_row"]).astype({"context_served": "boolean"})
    for name, frame in zip(MISMATCH_TABLES, (tokens, result.turns, result.sessions)):
        write_parquet_atomic(frame, run / name)
    write_json_atomic(summary, run / "summary.json")
    if (run / "report.html").exists():  # the run has a page: its token strips show what was just scored
        from trace_tools.report.html import write_html_report

        write_html_report(run)
