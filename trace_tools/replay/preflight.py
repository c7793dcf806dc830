"""What a replay checks before its first session (DESIGN §10): a setting that would make every
session fail the same way is a usage error (exit 2) with the fix, never a quarantine of everything.

`check_replay` validates the strategy options against their declarations, the prompt source and
canonicalization policy, the dump (readable, some usable session, a tokenizer and template that
resolve for every recording in it) and the output directory (a directory, not another run made
with other options). It returns how many finished shards a resumed run will reuse.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from trace_tools.errors import UnusableInput, UsageError
from trace_tools.options import parse_choice

PROMPT_SOURCES = ("auto", "recorded", "rendered")


def check_replay(dump: Path, options: Any, run_dir: Path, *, overwrite: bool = False) -> int:
    """Raise a usage error for options, dump or run directory that cannot work; else the number of
    finished shards (same options) the run will reuse. `options.params` become typed values."""
    from trace_tools.render.canonical import POLICIES
    from trace_tools.strategies.base import check_params

    options.params = check_params(options.strategies, options.params)
    parse_choice(options.prompt_source, PROMPT_SOURCES, "--prompt-source")
    parse_choice(options.canonicalization, POLICIES, "--canonicalization")
    check_dump(dump, options.strategies, tokenizer=options.tokenizer, chat_template=options.chat_template,
               prompt_source=options.prompt_source)
    return check_run_dir(run_dir, options.fingerprint(str(dump.resolve())), overwrite, asdict(options))


def check_dump(dump: Path, strategies: list[str], *, tokenizer: str | None, chat_template: str | None,
               prompt_source: str = "auto") -> None:
    """The dump has a usable session, and every recording in it has a tokenizer and template that resolve."""
    from trace_tools.io.load import iter_sessions

    stream = iter_sessions(dump, tokenizer=tokenizer)
    reason = stream.unusable_reason()
    if reason:
        raise UnusableInput(f"{dump}: {reason}")
    for (name, embedded), label in stream.recordings().items():
        if name is None:
            _require_no_rendering(label, strategies, prompt_source)
        else:
            resolve_recording(name, chat_template, embedded)


def resolve_recording(tokenizer: str, chat_template: str | None, embedded_template: str | None) -> None:
    """Load the tokenizer and resolve the template as the renderer will; unknown names raise (exit 2)."""
    from trace_tools.render.templates import resolve_template
    from trace_tools.render.tokenizer import load_tokenizer

    load_tokenizer(tokenizer)
    resolve_template(chat_template, tokenizer_name=tokenizer, dump_template=embedded_template)


def _require_no_rendering(label: str, strategies: list[str], prompt_source: str) -> None:
    from trace_tools.strategies.base import get_strategy

    renders = [name for name in strategies if get_strategy(name).renders_prompts]
    if renders or prompt_source == "rendered":
        needs = f"strategies {', '.join(renders)} render" if renders else "--prompt-source rendered renders"
        raise UsageError(f"{label} names no tokenizer (trace_tools.tokenizer) and {needs} prompts; "
                         "pass --tokenizer qwen3|qwen3.5|PATH")


def check_run_dir(run_dir: Path, fingerprint: str, overwrite: bool, options: dict[str, Any] | None = None) -> int:
    """The run directory is new, empty, or this same run (then: its finished shards); never a file,
    someone else's directory, or a run made with other options unless `overwrite`."""
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"--out {run_dir} is a file; pass a directory path for the run")
    marker = run_dir / "shards" / "FINGERPRINT"
    if marker.is_file():
        if marker.read_text().strip() == fingerprint:
            return len(list((run_dir / "shards").glob("*.done")))
        if not overwrite:
            raise UsageError(f"{run_dir} holds a run made with other options ({_changed(run_dir, options or {})}); "
                             "pass --overwrite to replace it, or choose another --out")
        return 0
    if run_dir.is_dir() and any(run_dir.iterdir()) and not overwrite:
        raise UsageError(f"--out {run_dir} is a directory that holds other files, not a trace-tools run; "
                         "pass a new or empty directory (or --overwrite)")
    return 0


def _changed(run_dir: Path, options: dict[str, Any]) -> str:
    """The options whose recorded value (run.json) differs from this run's, e.g. `strategies: [...] → [...]`."""
    try:
        previous = json.loads((run_dir / "run.json").read_text())["options"]
    except (OSError, ValueError, KeyError):
        return "an unfinished earlier run, or another dump"
    plain = json.loads(json.dumps(options, default=str))
    changed = [f"{key}: {previous.get(key)} → {value}" for key, value in plain.items() if previous.get(key) != value]
    return "; ".join(changed) or "another dump"
