"""Re-score recorded traces on a causal LM and compare with the recorded sampling logprobs.

This subpackage is the only place that imports torch and transformers model classes. Importing
`trace_tools.rescore` itself is cheap: the names below load their modules (and torch) on first
access, so the CLI and other layers can reference them without paying for torch up front.

Public API:
* `rescore(dump, model="tiny-qwen3", ...) -> RescoreResult` -- the `trace-tools rescore` command.
* `rescore_samples(run, model="tiny-qwen3", ...) -> SampleMismatch` -- `trace-tools rescore RUN
  --samples`: each strategy's trained tokens scored in their own context, the mismatch metrics,
  attribution and correction preview (`CorrectionOptions`), written into the run.
* `fill_logprobs(table_or_sessions, model_spec, device="auto") -> same type` -- teacher-forced
  logprobs as `output_logprobs` (the simulator's `--logprobs-model`).
* `sample_continuation(model, prompt_ids, max_new_tokens, seed) -> Continuation` -- sampling
  with recorded logprobs, for positive controls.
* `load_model(spec, device, dtype) -> ScoringModel`; `score_requests`, `naive_logprobs`,
  `chunked_logprobs` -- the scoring primitives (also used by `benchmarks/bench_rescore.py`).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

_EXPORTS = {
    "rescore": "api",
    "RescoreResult": "output",
    "load_sessions": "api",
    "rescore_samples": "samples",
    "SampleMismatch": "samples",
    "CorrectionOptions": "corrections",
    "mismatch_metrics": "mismatch",
    "fill_logprobs": "fill",
    "teacher_forced": "fill",
    "sample_continuation": "sampling",
    "Continuation": "sampling",
    "load_model": "models",
    "ScoringModel": "models",
    "MissingDependency": "models",
    "TINY_QWEN3": "models",
    "build_tiny_qwen3": "models",
    "ensure_tiny_qwen3": "models",
    "score_requests": "scoring",
    "ScoreRequest": "scoring",
    "naive_logprobs": "scoring",
    "chunked_logprobs": "scoring",
    "check_head": "scoring",
    "token_stats": "metrics",
    "DEFAULT_THRESHOLD": "metrics",
    "DEFAULT_MAX_THRESHOLD": "metrics",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trace_tools.rescore' has no attribute {name!r}")
    if module in ("models", "scoring", "sampling"):
        require_torch()
    return getattr(importlib.import_module(f"trace_tools.rescore.{module}"), name)


def require_torch() -> None:
    """Raise a TraceToolsError naming the install command when torch is missing."""
    if importlib.util.find_spec("torch") is None:
        from trace_tools.errors import TraceToolsError, install_hint

        raise TraceToolsError(f"rescoring needs torch and safetensors: {install_hint('rescore')}")
