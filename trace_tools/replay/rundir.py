"""The run directory contract (DESIGN §6): shard files, resume markers, and the merged outputs."""
from __future__ import annotations

import json
import platform
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from trace_tools.data import QuarantineEntry
from trace_tools.errors import TraceToolsError

TABLES = ("turns", "sessions", "samples", "quarantine", "fidelity")


@dataclass
class ShardRows:
    turns: list[dict[str, Any]] = field(default_factory=list)
    sessions: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    quarantine: list[QuarantineEntry] = field(default_factory=list)
    fidelity: list[dict[str, Any]] = field(default_factory=list)


def prepare(run_dir: Path, fingerprint: str) -> None:
    """Create the directory; keep finished shards only when the options are the same as before."""
    marker = run_dir / "shards" / "FINGERPRINT"
    if marker.exists() and marker.read_text().strip() != fingerprint:
        shutil.rmtree(run_dir / "shards")
    (run_dir / "shards").mkdir(parents=True, exist_ok=True)
    marker.write_text(fingerprint)


def shard_done(run_dir: Path, index: int) -> bool:
    return (run_dir / "shards" / f"{index:05d}.done").exists()


def write_shard(run_dir: Path, index: int, rows: ShardRows, write_samples: bool) -> None:
    from trace_tools.io.write import write_parquet_atomic

    base = run_dir / "shards" / f"{index:05d}"
    for name in TABLES:
        if name == "samples" and not write_samples:
            continue
        records = getattr(rows, name)
        if name == "quarantine":
            records = [asdict(entry) for entry in records]
        write_parquet_atomic(pd.DataFrame(records), Path(f"{base}.{name}.parquet"))
    Path(f"{base}.done").write_text("ok")


def read_tables(run_dir: Path, shards: int) -> dict[str, pd.DataFrame]:
    tables = {}
    for name in TABLES:
        parts = [pd.read_parquet(p) for i in range(shards)
                 if (p := run_dir / "shards" / f"{i:05d}.{name}.parquet").exists()]
        parts = [p for p in parts if len(p)]
        tables[name] = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    return tables


def finalize(run_dir: Path, dump: Path, loaded, options, renderer_identities: list[dict], shards: int) -> dict[str, Any]:
    """Merge shards into the DESIGN §6 files, then write summary.json, run.json, report.md and plots."""
    from trace_tools.io.write import write_json_atomic, write_parquet_atomic
    from trace_tools.report.metrics import summarize
    from trace_tools.report.render import write_report

    tables = read_tables(run_dir, shards)
    tables["quarantine"] = _all_quarantine(loaded.quarantine, tables["quarantine"])
    for name in ("turns", "sessions", "samples", "quarantine"):
        if name == "samples" and not options.write_samples:
            continue
        write_parquet_atomic(_typed(name, tables[name]), run_dir / f"{name}.parquet")
    summary = summarize(tables, loaded, options.strategies)
    write_json_atomic(summary, run_dir / "summary.json")
    write_json_atomic(_run_info(dump, loaded, options, renderer_identities), run_dir / "run.json")
    write_report(run_dir, summary, tables)
    return summary


def _all_quarantine(load_entries: list[QuarantineEntry], replay_entries: pd.DataFrame) -> pd.DataFrame:
    rows = [asdict(e) for e in load_entries]
    if len(replay_entries):
        rows += replay_entries.to_dict("records")
    return pd.DataFrame(rows, columns=["session_id", "turn_index", "reason", "detail"])


def _typed(name: str, frame: pd.DataFrame) -> pd.DataFrame:
    """Empty tables still carry the contract's columns so downstream readers never guess."""
    if len(frame) or name != "quarantine":
        if name == "quarantine":
            frame["turn_index"] = frame["turn_index"].astype("Int32")
        return frame
    return pd.DataFrame({"session_id": pd.Series(dtype="string"), "turn_index": pd.Series(dtype="Int32"),
                         "reason": pd.Series(dtype="string"), "detail": pd.Series(dtype="string")})


def _run_info(dump: Path, loaded, options, renderer_identities: list[dict]) -> dict[str, Any]:
    from trace_tools import __version__

    return {
        "trace_tools_version": __version__,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "inputs": {"dump": str(Path(dump).resolve()), "files": [str(f) for f in loaded.files], "rows": loaded.rows,
                   "vocab_checked": loaded.vocab_checked, "dump_meta": _meta_dict(loaded.meta)},
        "options": asdict(options),
        "renderers": renderer_identities,
        "versions": _versions(),
    }


def _meta_dict(meta) -> dict[str, Any]:
    data = asdict(meta)
    if data.get("chat_template"):
        data["chat_template"] = f"<{len(data['chat_template'])} chars>"
    return data


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for package in ("pandas", "pyarrow", "tokenizers", "transformers", "jinja2"):
        try:
            out[package] = md.version(package)
        except md.PackageNotFoundError:
            pass
    return out


def require_run(run_dir: Path) -> Path:
    """A finished run directory, or a clear error naming the fix."""
    path = Path(run_dir)
    if not (path / "summary.json").is_file():
        raise TraceToolsError(f"{path} is not a finished run directory (no summary.json); run `trace-tools replay DUMP --out {path}` first")
    return path


def load_summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((require_run(run_dir) / "summary.json").read_text())
