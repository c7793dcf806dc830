"""The on-disk cache: where built artefacts live, how each is keyed, and what is there.

Everything trace-tools keeps between processes lives under one folder, `cache_dir()`:
`$TRACE_TOOLS_CACHE` when set, else `$XDG_CACHE_HOME/trace-tools`, else `~/.cache/trace-tools`.
Each kind of artefact has its own subfolder (`KINDS`), and each artefact's file name ends with
the digest of a `CacheKey`: everything the artefact is computed from, named explicitly.

    key = CacheKey("tokenizers", "qwen3", inputs=(ranks_sha, recipe), code=code_digest("render/tokenizer_files.py"),
                   libraries=("tokenizers", "transformers"))
    key.path("/tokenizer.json")   # ~/.cache/trace-tools/tokenizers/qwen3-<digest>/tokenizer.json

A change to any input, to the digested source, or to a named library's version gives another
digest, so a stale artefact is never read (it stays on disk until `clear`). The run
fingerprint of a run directory (`io.shards.fingerprint`) digests the code that computes results
with the same `code_digest`. `info()` and `clear()` back `trace-tools cache info|clear`.

The cache owns only what it wrote: an entry is recognised by that naming scheme (`is_artefact`),
so `clear` never deletes anything else a shared folder holds. A cache that cannot be written (a
read-only folder, a file where a folder should be) costs only recomputation: `store` warns once
naming the folder and reports failure, and an artefact that must be a file goes to a private
temporary folder instead (`scratch_for`).
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import os
import platform
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from trace_tools.errors import OutputFailed, UnknownName

# Subfolder -> what it holds (shown by `trace-tools cache info`).
KINDS = {
    "render-checks": "per-template verdicts: which render shortcuts reproduce transformers",
    "tokenizers": "tokenizer.json files converted from BPE ranks, and the ranks as marshal data",
    "templates": "chat templates and report.html's templates compiled to Python code, as marshal data",
    "models": "the tiny randomly initialised model rescore tests and benchmarks use",
    "bench": "benchmark dumps (benchmarks/)",
}
ENV_VAR = "TRACE_TOOLS_CACHE"
# Set once the unusable cache was reported: worker processes inherit it (a forked one from the
# first task it is sent, `replay.local_pool`) and stay quiet.
WARNED_VAR = "TRACE_TOOLS_CACHE_WARNED"
# `CacheKey.path`'s names (`NAME-DIGEST` plus a suffix), and the writers' dot-prefixed temporaries of them.
_ARTEFACT = re.compile(r"\.?[\w.+-]+-[0-9a-f]{16}(?:[.-].*)?")
_PACKAGE = Path(__file__).resolve().parents[1]


def cache_dir() -> Path:
    """Where built artefacts live: `$TRACE_TOOLS_CACHE`, else `$XDG_CACHE_HOME/trace-tools` or
    `~/.cache/trace-tools`."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "trace-tools"


@functools.cache
def code_digest(*parts: str) -> str:
    """sha256 (16 hex digits) of the source of `parts`: modules or packages of trace_tools, named
    relative to it (`"render"`, `"io/load.py"`), each package with every module below it."""
    digest = hashlib.sha256()
    for part in parts:
        root = _PACKAGE / part
        paths = sorted(root.rglob("*.py")) if root.is_dir() else [root]
        for path in paths:
            digest.update(path.relative_to(_PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@functools.cache
def library_version(name: str) -> str:
    """An installed distribution's version, read without importing it (importing transformers
    takes a second, and a replay that finds its render verdicts on disk never needs it).

    Read off the `NAME-VERSION.dist-info` folder names that installers write (`_dist_infos`),
    which takes a millisecond; `importlib.metadata`, which every command's cache keys asked
    before, took 15-40 ms to import and search, before a command's workers could start. A
    distribution installed another way (an egg, a zip on sys.path) is looked up there."""
    if name == "python":
        return platform.python_version()
    found = _dist_infos().get(_normalised(name))
    if found is not None:
        return found
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def _dist_infos() -> dict[str, str]:
    """Distribution (normalised name) → version, from the dist-info folders on sys.path, the first
    one found winning, as `importlib.metadata` searches sys.path. A folder name escapes any `-`
    inside the name and the version, so the first `-` separates them."""
    found: dict[str, str] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:  # a zip, a missing folder
            continue
        for folder in names:
            if folder.endswith(".dist-info") and "-" in folder:
                distribution, _, version = folder[: -len(".dist-info")].partition("-")
                found.setdefault(_normalised(distribution), version)
    return found


@dataclass(frozen=True)
class CacheKey:
    """What one cached artefact is computed from.

    `kind`: its subfolder (one of `KINDS`); `name`: a readable prefix of its file name;
    `inputs`: the values it is computed from (their `repr`s are digested, so pass strings,
    numbers and tuples of them); `code`: a `code_digest` of the source that computes it;
    `libraries`: distributions (or `"python"`) whose versions change what it holds.
    """

    kind: str
    name: str
    inputs: tuple[Any, ...] = ()
    code: str = ""
    libraries: tuple[str, ...] = ()

    def digest(self) -> str:
        versions = {library: library_version(library) for library in self.libraries}
        parts = [[repr(value) for value in self.inputs], self.code, versions]
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]

    def path(self, suffix: str = "") -> Path:
        """`cache_dir()/kind/name-digest` plus `suffix` (`".json"`, or `"/tokenizer.json"` for a
        folder per artefact)."""
        if self.kind not in KINDS:
            raise ValueError(f"unknown cache kind {self.kind!r}; add it to io.cache.KINDS")
        return cache_dir() / self.kind / f"{self.name}-{self.digest()}{suffix}"


def is_artefact(name: str) -> bool:
    """True for a name `CacheKey.path` makes (or a temporary file of one being written)."""
    return _ARTEFACT.fullmatch(name) is not None


def store(target: Path, write: Callable[[Path], None]) -> bool:
    """Put an artefact at `target` with `write(target)` (an atomic writer). False when the cache
    cannot hold it (read-only, full, a file where a folder should be), after one warning naming
    the folder: the caller uses what it computed, and computes it again next time."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        write(target)
        return True
    except (OSError, OutputFailed) as error:
        _warn_unusable(error)
        return False


def _warn_unusable(error: Exception) -> None:
    root = str(cache_dir())
    if os.environ.get(WARNED_VAR) == root:
        return
    os.environ[WARNED_VAR] = root
    reason = getattr(error, "strerror", None) or (str(error).strip().splitlines() or [type(error).__name__])[0]
    sys.stderr.write(
        f"warning: the trace-tools cache {root} cannot be written ({reason}); what it would keep is "
        f"computed again in every process. Set {ENV_VAR} to a writable folder to keep it\n"
    )


def scratch_for(target: Path) -> Path:
    """Where an artefact that must be a file goes when the cache cannot hold it: the same
    relative path in a folder private to this process, removed when it exits."""
    return _scratch_dir() / target.relative_to(cache_dir())


@functools.cache
def _scratch_dir() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="trace-tools-cache-"))
    atexit.register(_remove_scratch, folder, os.getpid())
    return folder


def _remove_scratch(folder: Path, owner: int) -> None:
    if os.getpid() == owner:  # never from a forked child that inherited the handler
        shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class KindInfo:
    kind: str
    description: str
    entries: int
    bytes: int


@dataclass(frozen=True)
class CacheInfo:
    location: Path
    from_env: bool  # True when `$TRACE_TOOLS_CACHE` chose the location
    kinds: tuple[KindInfo, ...]

    @property
    def bytes(self) -> int:
        return sum(kind.bytes for kind in self.kinds)

    def as_json(self) -> dict[str, Any]:
        return {
            "location": str(self.location),
            "env_var": ENV_VAR,
            "from_env": self.from_env,
            "bytes": self.bytes,
            "kinds": {
                k.kind: {"entries": k.entries, "bytes": k.bytes, "description": k.description} for k in self.kinds
            },
        }


def info() -> CacheInfo:
    """The cache's location and, per kind, how many artefacts it holds and their size on disk."""
    root = cache_dir()
    kinds = tuple(KindInfo(kind, text, *_entries_and_bytes(root / kind)) for kind, text in KINDS.items())
    return CacheInfo(root, bool(os.environ.get(ENV_VAR)), kinds)


def clear(kinds: Iterable[str] | None = None) -> CacheInfo:
    """Delete the artefacts of `kinds` (default: every kind); returns what was there before.
    Only artefacts trace-tools wrote go (`is_artefact`), and a kind's subfolder once it is empty;
    anything else in it or in the cache folder stays (`$TRACE_TOOLS_CACHE` may point at a folder
    that holds other things, even subfolders named like a kind)."""
    chosen = list(kinds or KINDS)
    for kind in chosen:
        if kind not in KINDS:
            raise UnknownName("cache kind", kind, list(KINDS))
    before = info()
    for kind in chosen:
        folder = before.location / kind
        for entry in _artefacts(folder):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        try:
            folder.rmdir()  # only when nothing else is left in it
        except OSError:
            pass
    return CacheInfo(before.location, before.from_env, tuple(k for k in before.kinds if k.kind in chosen))


def _artefacts(folder: Path) -> list[Path]:
    """The entries of `folder` that trace-tools wrote (none when it is not a readable folder)."""
    try:
        return [child for child in folder.iterdir() if is_artefact(child.name)]
    except OSError:
        return []


def _entries_and_bytes(folder: Path) -> tuple[int, int]:
    """Artefacts directly in `folder` (a file or a folder each; temporary files left out) and the
    bytes of every file below them."""
    artefacts = _artefacts(folder)
    entries = sum(1 for child in artefacts if not child.name.startswith("."))
    size = sum(_bytes(child) for child in artefacts)
    return entries, size


def _bytes(entry: Path) -> int:
    paths = entry.rglob("*") if entry.is_dir() else [entry]
    return sum(path.stat().st_size for path in paths if path.is_file())
