"""Loading a `.pt` sample dump safely, within a memory bound.

Only `torch.load(weights_only=True)` is used: tensors, lists, dicts, strings and numbers load;
a file that pickles anything else (a class, a function, a numpy array) is refused with one line
naming what it holds, and nothing in it runs. torch is imported here, lazily, and only when a
`.pt` file is read; without it the read stops with one line naming the install.

A `.pt` file is one pickle, so it is loaded whole. Tensor storages are memory-mapped
(`mmap=True`, zip-format files), so tensors cost address space, not resident memory; Python lists
in the pickle (slime's `Sample.to_dict()` keeps token ids as lists) become Python objects, about
`OBJECTS_PER_PICKLE_BYTE` bytes per pickled byte. A file whose pickle is over `max_pickle_bytes`
is refused before loading, naming the bound and how to pass it.
"""

from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

from trace_tools.errors import TraceToolsError, UnusableInput, install_hint

OBJECTS_PER_PICKLE_BYTE = 7  # a token id: 5 pickled bytes, a 28-byte int plus an 8-byte list slot
REFUSED_HINT = (
    "trace-tools loads .pt dumps with torch.load(weights_only=True) only and never runs pickled code: "
    "re-save the file with plain values (Sample.to_dict(), lists, dicts, tensors)"
)


class TorchMissing(TraceToolsError):
    """A `.pt` dump was given but torch is not installed."""


def load_pt(path: Path, max_pickle_bytes: int) -> Any:
    """The plain data of a `.pt` file (tensors memory-mapped), or UnusableInput saying why not."""
    torch = _torch()
    zipped = zipfile.is_zipfile(path)
    _check_size(path, zipped, max_pickle_bytes)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=zipped)
    except pickle.UnpicklingError as error:
        raise UnusableInput(f"{path} holds {_what_it_needs(torch, path, error)}; {REFUSED_HINT}") from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise UnusableInput(f"{path} is not a readable torch file ({reason}); re-save it or leave it out") from None


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise TorchMissing(
            "reading .pt sample dumps needs torch: pip install torch (CPU build is enough), "
            f"or {install_hint('rescore')}"
        ) from None
    return torch


def _check_size(path: Path, zipped: bool, max_pickle_bytes: int) -> None:
    if zipped:
        with zipfile.ZipFile(path) as archive:
            size = sum(info.file_size for info in archive.infolist() if info.filename.endswith("data.pkl"))
    else:
        size = path.stat().st_size  # the legacy format interleaves pickle and tensor bytes
    if size > max_pickle_bytes:
        raise UnusableInput(
            f"{path} holds a {size / 2**20:.0f} MiB pickle, over the {max_pickle_bytes / 2**20:.0f} MiB one file may "
            f"hold (loading it takes about {OBJECTS_PER_PICKLE_BYTE}x that in memory); split the dump into smaller "
            "files, store token lists as tensors, or pass a larger max_pickle_bytes"
        )


def _what_it_needs(torch: Any, path: Path, error: Exception) -> str:
    """'pickled Python objects (mymod.MyClass)': the globals the file would import, when torch can list them."""
    try:
        names = list(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except Exception:  # a legacy (non-zip) file cannot be inspected; the error text still names one
        names = re.findall(r"GLOBAL ([\w.]+)", str(error))[:1]
    listed = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"pickled Python objects ({listed or 'a global weights_only does not allow'})"
