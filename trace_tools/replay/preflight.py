"""What a replay checks before its first session (docs/commands.md#exit-codes-and-errors): a setting
that would make every session fail the same way is a usage error (exit 2) with the fix, never a
quarantine of everything.

`check_options` validates the strategy names and options against their declarations (and makes
them typed), the prompt source and the canonicalization policy; `check_dump` the dump (some usable
session, a loadable tokenizer for every recording the pipeline resolved, or no strategy that
needs one); `check_run_dir` the output directory (a directory, not another run made with other
options unless `overwrite`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trace_tools.errors import UnusableInput, UsageError
from trace_tools.io.shards import LOCK_NAME, RunLock, fingerprint_change, recorded_fingerprint
from trace_tools.options import parse_choice
from trace_tools.pipeline.prepared import PROMPT_SOURCES
from trace_tools.render.canonical import POLICIES
from trace_tools.render.tokenizer import RECIPES, load_tokenizer
from trace_tools.strategies.registry import check_params, get_strategy


def check_options(options: Any) -> None:
    """Strategy parameters, prompt source and canonicalization; `options.params` become typed values."""

    options.params = check_params(options.strategies, options.params)
    parse_choice(options.prompt_source, PROMPT_SOURCES, "--prompt-source")
    parse_choice(options.canonicalization, POLICIES, "--canonicalization")


def check_dump(dump: Any, stream: Any, options: Any, specs: list[Any]) -> None:
    """The dump (an opened `io.load.SessionStream`) has a usable session, a recording that names no
    tokenizer is replayed by no strategy that renders, and every tokenizer directory of `specs`
    loads. `specs`: the render specs the pipeline resolved for every recording as it opened the
    dump (`pipeline.RendererPool.check`), so unknown names have failed there, once (exit 2)."""
    reason = stream.unusable_reason()
    if reason:
        raise UnusableInput(f"{dump}: {reason}")
    for (name, _embedded), label in stream.recordings().items():
        if name is None:
            _require_no_rendering(label, options.strategies, options.prompt_source)
    for tokenizer in dict.fromkeys(spec.tokenizer for spec in specs):
        _load_directory(tokenizer)


def _load_directory(tokenizer: str) -> None:
    """A tokenizer directory is loaded here, so a broken file fails with its own message before the
    template check (which builds a renderer); built-in names load when first used."""

    if tokenizer not in RECIPES:
        load_tokenizer(tokenizer)


def _require_no_rendering(label: str, strategies: list[str], prompt_source: str) -> None:
    renders = [name for name in strategies if get_strategy(name).renders_prompts]
    if renders or prompt_source == "rendered":
        needs = f"strategies {', '.join(renders)} render" if renders else "--prompt-source rendered renders"
        from trace_tools.render.tokenizer import known_names

        raise UsageError(
            f"{label} names no tokenizer (trace_tools.tokenizer) and {needs} prompts; "
            f"pass --tokenizer {'|'.join(known_names())}|PATH"
        )


def check_run_dir(run_dir: Path, current: dict[str, Any], overwrite: bool) -> None:
    """The run directory is new, empty, or this same run (to resume); never a file, someone else's
    directory, or a run made with other options, inputs or code unless `overwrite`. `current` is
    this run's fingerprint (`io.shards.fingerprint`)."""

    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"--out {run_dir} is a file; pass a directory path for the run")
    RunLock.check_free(run_dir)
    recorded = recorded_fingerprint(run_dir)
    if recorded is not None:
        if recorded.get("stamp") != current["stamp"] and not overwrite:
            raise UsageError(
                f"{run_dir} holds a run made with {_changed(recorded, current)}; "
                "pass --overwrite to replace it, or choose another --out"
            )
        return
    if run_dir.is_dir() and any(path.name != LOCK_NAME for path in run_dir.iterdir()) and not overwrite:
        raise UsageError(
            f"--out {run_dir} is a directory that holds other files, not a trace-tools run; "
            "pass a new or empty directory (or --overwrite)"
        )


def _changed(previous: dict[str, Any], current: dict[str, Any]) -> str:
    """What differs, e.g. `other options (strategies: [...] → [...])` or `trace-tools 0.1.0, this is 0.2.0`."""

    change = fingerprint_change(previous, current)
    if change:
        return change
    before, now = previous.get("options") or {}, current["options"]
    changed = [f"{key}: {before.get(key)} → {value}" for key, value in now.items() if before.get(key) != value]
    return f"other options ({'; '.join(changed)})" if changed else "other options"
