"""`audit-samples`: what a trainer was actually given, read from its own sample dump.

    result = audit_dumps(["rollout_data/"], tokenizer="qwen3", out="runs/audit")   # files a trainer read
    result = audit_samples(samples, tokenizer="qwen3")                             # any TrainerSamples
    result.to_json()["run"]["trained_tokens_by_tool"]

Every `TrainerSample` is checked (`audit_session.check_sample`; a sample whose lists disagree is
set aside as a quarantine row, never a traceback), measured against the earlier samples of its
session (re-emitted context, tokens trained twice) and read with the model family's template and
parser (`audit_tokens.TokenMarkers`): the loss-mask rules of `audit_rules` and the trained tokens
by tool. Per rollout step and for the whole run: samples, sessions, forwarded, trained and
re-emitted tokens. With a per-call dump (`calls`), the named strategy is replayed on it and its
samples compared with the trainer's (`audit_compare`). `out` writes a run directory that
`report`, `compare` and `gate` read as a run with one strategy, `trainer` (`audit_tables`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from trace_tools.errors import UnusableInput
from trace_tools.trainer.audit_rules import Tally
from trace_tools.trainer.audit_session import (
    BadSample,
    SampleStats,
    SessionAudit,
    Span,
    check_sample,
    logprobs_cover,
    session_key,
)
from trace_tools.trainer.audit_tokens import TokenMarkers
from trace_tools.trainer.records import TrainerSample


@dataclass
class Totals:
    """What one rollout step (or the whole run) gave the trainer."""

    samples: int = 0
    sessions: set[str] = field(default_factory=set)
    forwarded_tokens: int = 0
    trained_tokens: int = 0
    reemitted_tokens: int = 0
    trained_tokens_by_tool: dict[str, int] = field(default_factory=dict)

    def add(self, session: str, stats: SampleStats) -> None:
        self.samples += 1
        self.sessions.add(session)
        self.forwarded_tokens += stats.forwarded
        self.trained_tokens += stats.trained
        self.reemitted_tokens += stats.reemitted
        for span in stats.spans:
            self.trained_tokens_by_tool[span.tool] = self.trained_tokens_by_tool.get(span.tool, 0) + span.tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "sessions": len(self.sessions),
            "samples_per_session": self.samples / len(self.sessions) if self.sessions else 0.0,
            "forwarded_tokens": self.forwarded_tokens,
            "trained_tokens": self.trained_tokens,
            "reemitted_tokens": self.reemitted_tokens,
            "one_sample_tokens": self.forwarded_tokens - self.reemitted_tokens,
            "trained_tokens_by_tool": dict(sorted(self.trained_tokens_by_tool.items())),
        }


@dataclass
class SessionTotals:
    step: int | None
    samples: int = 0
    forwarded_tokens: int = 0
    trained_tokens: int = 0
    reemitted_tokens: int = 0

    def add(self, stats: SampleStats) -> None:
        self.samples += 1
        self.forwarded_tokens += stats.forwarded
        self.trained_tokens += stats.trained
        self.reemitted_tokens += stats.reemitted


@dataclass
class Audit:
    """Everything the samples showed; `sessions` keeps each session's samples when they are compared."""

    markers: TokenMarkers
    keep_samples: bool = False
    tally: Tally = field(default_factory=Tally)
    run: Totals = field(default_factory=Totals)
    steps: dict[str, Totals] = field(default_factory=dict)
    session_totals: dict[str, SessionTotals] = field(default_factory=dict)
    spans: list[Span] = field(default_factory=list)
    quarantine: list[dict[str, Any]] = field(default_factory=list)
    sessions: dict[str, SessionAudit] = field(default_factory=dict)
    set_aside: int = 0  # samples quarantined: by the audit's checks, and by the dump reader's
    _open_step: Any = None

    def add(self, sample: TrainerSample) -> None:
        try:
            view = check_sample(sample, self.markers.renderer.vocab_size)
        except BadSample as bad:
            self.quarantine.append(_quarantine_row(sample, bad))
            self.set_aside += 1
            return
        if not view.response_length:
            self.tally.note("empty_responses", 1, view.source)
        if not logprobs_cover(sample):
            self.tally.note("logprobs_mismatch", 1, view.source)
        self._enter_step(view.step)
        session = self.sessions.get(view.session)
        if session is None:
            session = self.sessions[view.session] = SessionAudit(view.session, self.markers, self.tally)
        stats = session.add(view)
        self.spans += stats.spans
        self.run.add(view.session, stats)
        self.steps.setdefault(_step_key(view.step), Totals()).add(view.session, stats)
        self.session_totals.setdefault(view.session, SessionTotals(view.step)).add(stats)

    def _enter_step(self, step: int | None) -> None:
        """A new rollout step closes the sessions of the earlier ones (a dump lists a step's samples
        together), so memory holds one step's samples, unless they are kept for a comparison."""
        if step != self._open_step and not self.keep_samples:
            self.close()
            self.sessions.clear()
        self._open_step = step

    def refused_by_reader(self, report: Any) -> None:
        """The reader's refused samples: a quarantine row for each it kept an example of, and
        `set_aside` counting them all."""
        self.set_aside += int(report.quarantined)
        self.quarantine += [
            {"session_id": None, "turn_index": None, "reason": item.reason, "detail": f"{item.source}: {item.detail}"}
            for item in report.examples
        ]

    def close(self) -> None:
        for session in self.sessions.values():
            session.close()
            if not self.keep_samples:
                session.views.clear()


def _step_key(step: int | None) -> str:
    return "none" if step is None else str(step)


def _quarantine_row(sample: TrainerSample, bad: BadSample) -> dict[str, Any]:
    return {
        "session_id": session_key(sample),
        "turn_index": None,
        "reason": bad.reason,
        "detail": f"{sample.source}: {bad}",
    }


@dataclass
class AuditResult:
    """The audit's numbers (`summary`, what summary.json holds), and where its run directory is."""

    summary: dict[str, Any]
    run_dir: Path | None = None

    @property
    def ok(self) -> bool:
        audit = self.summary["audit"]
        comparison = audit.get("comparison")
        return audit["ok"] and (comparison is None or comparison["equal"])

    def to_json(self) -> dict[str, Any]:
        audit = self.summary["audit"]
        return {
            "ok": self.ok,
            "run": audit["run"],
            "steps": audit["steps"],
            "rules": audit["rules"],
            "notes": audit["notes"],
            "quarantined_samples": audit["quarantined_samples"],
            "comparison": audit.get("comparison"),
            "run_dir": str(self.run_dir) if self.run_dir else None,
        }


def audit_dumps(paths: Sequence[str | Path], **options: Any) -> AuditResult:
    """Read a trainer's sample dumps (`trainer.read.read_samples`: slime / miles `.pt`, miles
    dashboards, prime-rl exports) and audit them; the samples the reader refused join the audit's
    quarantine. `options` are `audit_samples`'."""
    read = importlib.import_module("trace_tools.trainer.read")
    report = read.ReadReport()
    return audit_samples(read.read_samples(paths, report=report), reader_report=report, **options)


def audit_samples(
    samples: Iterable[TrainerSample],
    *,
    tokenizer: str | None = None,
    chat_template: str | None = None,
    calls: str | Path | None = None,
    strategy: str = "tree",
    out: str | Path | None = None,
    overwrite: bool = False,
    reader_report: Any = None,
) -> AuditResult:
    """Audit `samples` (module docstring); `calls`: a per-call dump of the same run to replay
    `strategy` on and compare with; `out`: the run directory to write; `reader_report`: the
    reader's accounting (`trainer.read.ReadReport`), whose refused samples are quarantined too."""
    from trace_tools.io.dump_files import read_dump_meta
    from trace_tools.render.renderer import Renderer
    from trace_tools.strategies.registry import get_strategy
    from trace_tools.trainer.audit_tables import build_summary, prepare_run_dir, tables, write_run

    if calls is not None:
        get_strategy(strategy)  # a mistyped name stops before any work, listing the strategies
    # Without --tokenizer / --chat-template, the per-call dump of the same run names them.
    renderer = Renderer.from_spec(tokenizer, chat_template, dump_meta=read_dump_meta(calls) if calls else None)
    if out is not None:
        prepare_run_dir(Path(out), overwrite)
    audit = Audit(TokenMarkers(renderer), keep_samples=calls is not None)
    for sample in samples:
        audit.add(sample)
    audit.close()
    if reader_report is not None:
        audit.refused_by_reader(reader_report)
    if not audit.run.samples and not audit.quarantine:
        raise UnusableInput("the dump holds no samples; pass the files a trainer read (rollout_data/*.pt, ...)")
    comparison = None
    if calls is not None:
        from trace_tools.trainer.audit_compare import compare_with_strategy

        comparison = compare_with_strategy(audit, calls, strategy, tokenizer, chat_template)
    frames = tables(audit)
    summary = build_summary(audit, frames, comparison)
    run_dir = write_run(Path(out), frames, summary) if out is not None else None
    return AuditResult(summary, run_dir)
