"""`read_samples`: the samples a trainer was given, from whatever post-manager dump holds them.

    report = ReadReport()
    for sample in read_samples(["dump_details/"], report=report):
        ...
    report.by_reason  # {"length_mismatch": 2}: samples refused, each with a one-line reason

The format is detected from the paths (docs/trainer_dumps.md): a folder or files of `.pt` →
`slime` (slime / miles rollout and train data), `dashboard_columns/*.parquet` →
`miles-dashboard`, `step_*/rank_*.jsonl` → `prime-rl`; `fmt` names it instead. Samples are yielded
one at a time; a sample that fails a check (`trainer.checks.SAMPLE_REASONS`) is not yielded but
counted in the report, with its first examples. A path or file that cannot be read at all
(missing, unreadable, a `.pt` that pickles code) stops the read with `UnusableInput`: one line
naming the file and the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_tools.errors import UnknownName, UnusableInput
from trace_tools.trainer.checks import Item, Note, Quarantined, ReadOptions
from trace_tools.trainer.miles_dashboard import read_miles_dashboard
from trace_tools.trainer.prime_rl import read_prime_rl
from trace_tools.trainer.records import TrainerSample
from trace_tools.trainer.slime import read_slime

Reader = Callable[[list[Path], ReadOptions], Iterator[Item]]
FORMATS: dict[str, tuple[Reader, str]] = {
    "slime": (read_slime, ".pt"),
    "miles-dashboard": (read_miles_dashboard, ".parquet"),
    "prime-rl": (read_prime_rl, ".jsonl"),
}
# Folders of a --dump-details directory that hold each format's files (others, such as miles'
# policy_loss_debug/*.pt, are not samples).
FOLDERS = {"slime": ("rollout_data", "train_data"), "miles-dashboard": ("dashboard_columns",)}
MAX_EXAMPLES = 20
MAX_PICKLE_BYTES = 128 * 2**20


@dataclass
class ReadReport:
    """What a read found: samples yielded, samples refused (by reason, first examples), notes."""

    files: int = 0
    formats: list[str] = field(default_factory=list)
    samples: int = 0
    quarantined: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)
    examples: list[Quarantined] = field(default_factory=list)  # the first MAX_EXAMPLES refused samples
    notes: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.quarantined == 0

    def count(self, item: Quarantined) -> None:
        self.quarantined += 1
        self.by_reason[item.reason] = self.by_reason.get(item.reason, 0) + 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(item)

    def to_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "formats": self.formats,
            "samples": self.samples,
            "quarantined": self.quarantined,
            "by_reason": self.by_reason,
            "examples": [{"source": e.source, "reason": e.reason, "detail": e.detail} for e in self.examples],
            "notes": self.notes,
        }


def read_samples(
    paths: Sequence[str | Path],
    *,
    fmt: str | None = None,
    vocab_size: int | None = None,
    tokenizer: str | None = None,
    report: ReadReport | None = None,
    max_pickle_bytes: int = MAX_PICKLE_BYTES,
) -> Iterator[TrainerSample]:
    """The samples of `paths` (files or folders), one at a time, in file order.

    `vocab_size` (or the size of `tokenizer`) bounds token ids; `report` collects the accounting.
    Paths and the format are checked here, before the first sample is asked for."""
    if fmt is not None and fmt not in FORMATS:
        raise UnknownName("sample-dump format", fmt, list(FORMATS))
    groups = files_by_format(paths, fmt)
    options = ReadOptions(vocab_size=_vocab_bound(vocab_size, tokenizer), max_pickle_bytes=max_pickle_bytes)
    report = report if report is not None else ReadReport()
    report.files = sum(len(files) for files in groups.values())
    report.formats = list(groups)
    return _read(groups, options, report)


def _read(groups: dict[str, list[Path]], options: ReadOptions, report: ReadReport) -> Iterator[TrainerSample]:
    for name, files in groups.items():
        for item in FORMATS[name][0](files, options):
            if isinstance(item, TrainerSample):
                report.samples += 1
                yield item
            elif isinstance(item, Quarantined):
                report.count(item)
            elif isinstance(item, Note):
                report.notes.append(item.text)


def files_by_format(paths: Sequence[str | Path], fmt: str | None = None) -> dict[str, list[Path]]:
    """{format: its files, in the order given}, each path's format detected unless `fmt` names it."""
    if not paths:
        raise UnusableInput("no sample dump given; pass rollout_data/*.pt, dashboard_columns/ or token_exports/")
    groups: dict[str, list[Path]] = {}
    for given in paths:
        path = Path(given).expanduser()
        if not path.exists():
            raise UnusableInput(f"no such file or directory: {given}; pass a sample dump file or its folder")
        name, files = _detect(path, fmt)
        groups.setdefault(name, []).extend(files)
    return groups


def _detect(path: Path, fmt: str | None) -> tuple[str, list[Path]]:
    names = [fmt] if fmt is not None else list(FORMATS)
    if path.is_file():
        name = fmt or _format_of_file(path)
        return name, [path]
    for name in names:
        files = _files_under(path, name)
        if files:
            return name, files
    wanted = (
        f"{FORMATS[fmt][1]} files" if fmt else "rollout_data/*.pt, dashboard_columns/*.parquet or step_*/rank_*.jsonl"
    )
    raise UnusableInput(f"no sample dump under {path}: expected {wanted}; pass the dump folder or its files")


def _files_under(root: Path, name: str) -> list[Path]:
    found = sorted(p for p in root.rglob(f"*{FORMATS[name][1]}") if p.is_file())
    if name == "prime-rl":
        return [p for p in found if p.name.startswith("rank_") or p.parent.name.startswith("step_")]
    folders = FOLDERS.get(name, ())
    in_folders = [p for p in found if p.parent.name in folders]
    return in_folders or (found if name == "slime" else [])


def _format_of_file(path: Path) -> str:
    suffix = path.suffix
    if suffix == ".jsonl" and path.parent.name == "trajectory":
        raise UnusableInput(
            f"{path} (miles trajectory) holds no token ids; pass the --dump-details folder, whose "
            "dashboard_columns/ or rollout_data/ hold the samples"
        )
    for name, (_, wanted) in FORMATS.items():
        if suffix == wanted:
            return name
    raise UnusableInput(
        f"{path}: a {suffix or 'suffix-less'} file is no sample dump this reads; pass .pt (slime/miles), "
        ".parquet (miles dashboard_columns) or .jsonl (prime-rl token exports)"
    )


def _vocab_bound(vocab_size: int | None, tokenizer: str | None) -> int | None:
    if vocab_size is not None or tokenizer is None:
        return vocab_size
    from trace_tools.io.vocab import vocab_size_for

    return vocab_size_for(tokenizer)
