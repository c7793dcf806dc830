"""The import formats: one record each (`FORMATS`); everything that lists formats derives from them.

A record names the format, the reader module that converts one parsed JSON value
(`trace_tools.importers.<reader>.outcomes(value, where, options)`), what a source holds and who
writes it, whether its records name their session, and which files a source directory
contributes. `import_traces`, `trace-tools import --help` and docs/importers.md's table
(`scripts/gen_docs.py`) read the records; tests/test_records.py checks the help and the docs
against them. Adding a format is one record here plus its reader module and fixtures
(docs/development.md, "Add an import format").

The module imports only the standard library and `trace_tools.errors`, so `trace-tools --help`
lists the formats without loading pyarrow.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from trace_tools.errors import UnknownName

# A `.json` file is one document (or an array of them), every other file JSON lines (base.json_values).
JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")


@dataclass(frozen=True)
class ImportFormat:
    name: str
    reader: str  # the module under trace_tools.importers that converts one record
    reads: str  # what a source holds (CLI help, docs/importers.md)
    written_by: str  # the servers and gateways that write it
    needs_session_key: bool = False  # its records name no session of their own: --session-key is required
    suffixes: tuple[str, ...] = JSON_SUFFIXES  # the files a source directory contributes (name endings)
    ordered_by_start: bool = False  # records arrive out of order: turn_index is the rank by start time
    # docs/importers.md's mapping table (scripts/gen_docs.py): the upstream version the reader follows,
    # what one session and one turn are in the source, and what the dump does not carry
    follows: str = ""
    session: str = ""
    turn: str = ""
    lost: str = ""

    def load(self) -> ModuleType:
        return importlib.import_module(f"trace_tools.importers.{self.reader}")


FORMATS = {
    fmt.name: fmt
    for fmt in (
        ImportFormat(
            "miles",
            reader="miles",
            reads="session documents or one record a line",
            written_by="miles' session server",
            follows="miles `31f1ca96` (`SessionRecord`)",
            session="a session document, or the records naming one `session_id`",
            turn="a record (`request` + `response`)",
            lost="reward; `step` only through `--step-key` (e.g. `metadata.rollout_id`)",
        ),
        ImportFormat(
            "openai",
            reader="openai",
            reads="chat-completion exchanges with token ids, one a line",
            written_by="SGLang or vLLM",
            needs_session_key=True,
            follows="OpenAI chat completions with SGLang `return_meta_info` or vLLM `return_token_ids`",
            session="the exchanges whose `--session-key` header or field agrees",
            turn="an exchange",
            lost="reward; `step` unless the request's `metadata.step` or `--step-key` holds it",
        ),
        ImportFormat(
            "gateway-traces",
            reader="gateway",
            reads="per-call traces with prompt and output ids, one a line",
            written_by="slime, agentcore-rl-toolkit or rllm gateways",
            follows="slime `624b824`, agentcore-rl-toolkit `1e75c535` (`TurnRecord`)",
            session="the traces naming one `session_id` (or `gateway_session_id`)",
            turn="a trace",
            lost="nothing the schema has a column for (other plain fields go to `metadata`)",
        ),
        ImportFormat(
            "harbor-atif",
            reader="atif",
            reads="ATIF trajectory.json files (v1.4+, token ids per agent step), one trial each",
            written_by="Harbor and other ATIF writers",
            follows="ATIF RFC, schema v1.4 and later",
            session="a trial: one `trajectory.json` (`session_id`)",
            turn="an `agent` step; system/user steps, replies and observations become its `messages`",
            lost="`finish_reason`, `request_id`, reward (in the trial's `result.json`, not read)",
            suffixes=("trajectory.json",),
        ),
        ImportFormat(
            "nemo-gym",
            reader="nemo_gym",
            reads="rollouts whose output items carry token ids, one a line",
            written_by="NeMo Gym",
            follows="NVIDIA-NeMo/Gym `07d6b0d` (Responses items, `return_token_id_information`)",
            session="a rollout line (`_ng_task_index:_ng_rollout_index`)",
            turn="a model call: the output items up to the one carrying `generation_token_ids`",
            lost="`finish_reason`, `request_id` (items have ids, calls do not), reasoning `encrypted_content`",
        ),
        ImportFormat(
            "otel",
            reader="otel",
            reads="OpenTelemetry GenAI spans with token ids (OTLP/JSON or one span a line)",
            written_by="Agent Lightning or LiteLLM",
            follows="OTLP/JSON; GenAI semconv `1cf2476`; agent-lightning v0.3.1 `f0a77cf` spans",
            session="the spans whose `--session-key` attribute (span, then resource) or field agrees",
            turn="a model-call span, ranked by start time; other spans are skipped",
            lost="reward (a separate `agentlightning.reward` span, not joined)",
            needs_session_key=True,
            ordered_by_start=True,
        ),
    )
}


def get_format(name: str) -> ImportFormat:
    if name not in FORMATS:
        raise UnknownName("import format", name, list(FORMATS))
    return FORMATS[name]
