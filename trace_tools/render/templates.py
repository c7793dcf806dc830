"""Chat-template resolution: which Jinja text renders a dump, and a short identity for reports.

Sources, by spec (docs/rendering.md#chat-templates-and-the-response-parser):
* a model family's name (`qwen3`, `glm4.5`, ...) → the TRL file its record names
  (`trace_tools.families`: `qwen3` → `trl/chat_templates/qwen3.jinja`, `qwen3.5` →
  `qwen3_5_think.jinja`, ...);
* `trl:<stem>` → any template TRL ships (`trl:llama3_1`, `trl:qwen3_5_nothink.jinja`, ...);
* a file path → that file; a `.parquet` dump file → the template text it embeds (so a recording
  can lend its template where `trl` is not installed); a tokenizer directory → its own
  `chat_template.jinja` / `tokenizer_config.json` template;
* `dump` (or no spec) → the template text the dump carries in its metadata.

TRL's files are read from the installed package directory without importing `trl` (its import is
slow and pulls torch). Templates are never copied into this source tree. When `trl` is missing,
a dump's embedded template stands in for `qwen3` / `qwen3.5`, else the one the bundled sample
dump embeds (the same TRL text, recorded with it).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

from trace_tools.errors import TemplateNotFound
from trace_tools.families import FAMILIES, TOKENIZERS

# The template each built-in name means (the family records').
NAMED_TEMPLATES = {name: family.template for name, family in FAMILIES.items()}
# Built-in tokenizer names whose default template has another name (the GLM stand-in).
TOKENIZER_TEMPLATES = {t.name: t.stand_in_for for t in TOKENIZERS.values() if t.stand_in_for}
_INSTALL_HINT = (
    "install the templates with `pip install --no-deps trl==1.16.0` (template files only, no torch) "
    "or pass `--chat-template FILE`"
)


def resolve_template(
    spec: str | None, *, tokenizer_name: str | None = None, dump_template: str | None = None
) -> tuple[str, str]:
    """(template text, identity) for a spec; see the module docstring for the sources.

    With no spec the dump's own template wins (it is what the recording used), then the
    tokenizer's default (`qwen3`/`qwen3.5` names, or a tokenizer directory's own template).
    """
    if spec:
        return _resolve_spec(spec, dump_template)
    if dump_template:
        if looks_like_template(dump_template):
            return dump_template, identity("dump", dump_template)
        return _resolve_spec(dump_template, None)
    if tokenizer_name:
        return _resolve_spec(TOKENIZER_TEMPLATES.get(tokenizer_name, tokenizer_name), None)
    raise TemplateNotFound(
        "no chat template: the dump carries none and no tokenizer was given; "
        "pass `--chat-template FILE` or `--tokenizer NAME|PATH`"
    )


def _resolve_spec(spec: str, dump_template: str | None) -> tuple[str, str]:
    if spec in NAMED_TEMPLATES:
        return _named(spec, dump_template)
    if spec.startswith("trl:"):
        return _trl(spec[4:])
    if spec == "dump":
        if dump_template and looks_like_template(dump_template):
            return dump_template, identity("dump", dump_template)
        raise TemplateNotFound(
            "the dump carries no chat template (`trace_tools.chat_template`); pass `--chat-template FILE`"
        )
    if looks_like_template(spec):
        return spec, identity("inline", spec)
    return _from_path(Path(spec).expanduser(), spec)


def _named(name: str, dump_template: str | None) -> tuple[str, str]:
    directory = trl_template_dir()
    if directory is not None:
        return _trl(NAMED_TEMPLATES[name])
    if dump_template and looks_like_template(dump_template):
        return dump_template, identity("dump", dump_template)
    from trace_tools.io.bundled import sample_template

    bundled = sample_template(name)
    if bundled:
        return bundled, identity(f"sample_traces:{name}", bundled)
    raise TemplateNotFound(f"template {name!r} comes from the trl package, which is not installed; {_INSTALL_HINT}")


def _trl(stem: str) -> tuple[str, str]:
    directory = trl_template_dir()
    if directory is None:
        raise TemplateNotFound(f"template trl:{stem} needs the trl package; {_INSTALL_HINT}")
    file_name = stem if stem.endswith(".jinja") else f"{stem}.jinja"
    path = directory / file_name
    if not path.is_file():
        available = ", ".join(sorted(p.stem for p in directory.glob("*.jinja")))
        raise TemplateNotFound(f"trl ships no template {file_name!r}; available: {available}")
    text = path.read_text(encoding="utf-8")
    return text, identity(f"trl:{file_name}", text)


def _from_path(path: Path, spec: str) -> tuple[str, str]:
    if path.is_file() and path.suffix == ".parquet":
        text = embedded_template(path)
        return text, identity(f"dump:{path.resolve()}", text)
    if path.is_file():
        text = path.read_text(encoding="utf-8")
        return text, identity(f"file:{path.resolve()}", text)
    if path.is_dir():
        found = tokenizer_dir_template(path)
        if found is None:
            raise TemplateNotFound(
                f"tokenizer directory {path} has no chat template "
                "(chat_template.jinja or tokenizer_config.json); pass `--chat-template FILE`"
            )
        return found, identity(f"tokenizer:{path.resolve()}", found)
    names = ", ".join([*NAMED_TEMPLATES, "trl:<name>", "dump"])
    raise TemplateNotFound(
        f"chat template {spec!r} is neither a known name ({names}) nor an existing file; pass `--chat-template FILE`"
    )


def embedded_metadata(dump_file: Path, key: str) -> str | None:
    """A dump file's `trace_tools.<key>` metadata (read from the footer only), or None."""
    import pyarrow.parquet as pq

    try:
        metadata = pq.ParquetFile(dump_file).schema_arrow.metadata or {}
    except Exception as error:  # pyarrow raises several types for a file that is not Parquet
        raise TemplateNotFound(f"{dump_file} is not a readable Parquet dump ({error}); pass a .jinja file") from None
    value = metadata.get(f"trace_tools.{key}".encode())
    return None if value is None else value.decode("utf-8", "replace")


def embedded_template(dump_file: Path) -> str:
    """The template text a dump file carries in its `trace_tools.chat_template` metadata."""
    text = embedded_metadata(dump_file, "chat_template") or ""
    if not looks_like_template(text):
        raise TemplateNotFound(f"{dump_file} carries no chat template (trace_tools.chat_template); pass a .jinja file")
    return text


def tokenizer_dir_template(directory: Path) -> str | None:
    """A Hugging Face tokenizer directory's own default template, if it has one."""
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config = directory / "tokenizer_config.json"
    if not config.is_file():
        return None
    template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
    if isinstance(template, list):  # the named-templates form: [{"name": "default", "template": ...}]
        by_name = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = by_name.get("default")
    return template if isinstance(template, str) else None


def trl_template_dir() -> Path | None:
    """`trl/chat_templates/` of the installed trl, located without importing it."""
    try:
        spec = importlib.util.find_spec("trl")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    directory = Path(list(spec.submodule_search_locations)[0]) / "chat_templates"
    return directory if directory.is_dir() else None


def looks_like_template(text: str) -> bool:
    """Jinja text rather than a name or a path."""
    return "{%" in text or "{{" in text


def identity(source: str, text: str) -> str:
    return f"{source} sha256={hashlib.sha256(text.encode('utf-8')).hexdigest()[:8]}"
