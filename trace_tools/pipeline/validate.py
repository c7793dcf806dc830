"""`validate`: the dump's rows against trace schema v1 (`io.validate`), and the chat template each
recording names, which must compile and render the simplest conversation within the template
limits (docs/run_directory.md#untrusted-input-bounded): a template that fails there would fail every
session of a replay the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trace_tools.errors import UsageError
from trace_tools.io.validate import ValidationReport
from trace_tools.io.validate import validate as validate_rows
from trace_tools.pipeline import RendererPool


def validate(
    path: str | Path,
    *,
    quarantine_out: str | Path | None = None,
    chat_template: str | None = None,
    **load_options: Any,
) -> ValidationReport:
    """`io.validate.validate`, then the template of each recording whose tokenizer and template
    resolve (one that does not is the rows' concern only: its vocabulary check was skipped, and
    said so); a template that does not compile or render raises `TemplateUnusable` /
    `TemplateLimitExceeded`."""

    report = validate_rows(path, quarantine_out=quarantine_out, **load_options)
    pool = RendererPool(load_options.get("tokenizer"), chat_template)
    for meta in report.file_metas:
        try:
            pool.spec_for(meta)
        except UsageError:
            continue
    pool.check_templates()
    return report
