"""Where dumps and run directories live: a local path, or an object-storage URI (`s3://`, `gs://`, …).

The loader and the run directory reach files only through this module. A local path stays a
`Path` and is read with the plain file API, exactly as before; a URI stays a string and goes
through `pyarrow.fs` (`FileSystem.from_uri`), so every scheme pyarrow knows works, with
credentials and endpoints from the usual environment: `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL` (an S3-compatible server) for
`s3://`; `GOOGLE_APPLICATION_CREDENTIALS` for `gs://`.

Dumps are read in place (the loader opens files through `open_input`; workers read their own
row groups). A run directory in object storage is *staged* (`StagedRun`): the run is written to a
local directory as usual, each finished shard is uploaded as soon as it is written (its marker
last), and everything else when the command ends, so a killed driver resumes from the shards in
object storage, from any machine. Commands that read a finished run (`report`, `export`) work on a
local copy (`local_run`) and upload what they wrote.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Iterator

from trace_tools.errors import TraceToolsError, UnusableInput, UsageError

Location = str | Path  # a local path (Path) or an object-storage URI (str); every helper takes either, or a str path
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_FILESYSTEMS: dict[str, Any] = {}
MARKER_SUFFIX = ".done"  # a shard's completion marker: uploaded after the shard's other files


def is_uri(value: Location) -> bool:
    """True for `scheme://…` other than `file://` (a plain local path)."""
    match = _SCHEME.match(value) if isinstance(value, str) else None
    return match is not None and match.group(1).lower() != "file"


def location(value: Location) -> Location:
    """A URI as a string (`Path` would fold its `//`), anything else as a `Path` (`file://` stripped)."""
    if is_uri(value):
        return str(value).rstrip("/")
    text = str(value)
    return Path(text[len("file://") :] if text.startswith("file://") else text).expanduser()


def join(base: Location, *parts: str) -> Location:
    base = location(base)
    if isinstance(base, Path):
        return base.joinpath(*parts)
    return "/".join([base.rstrip("/"), *parts])


def name(value: Location) -> str:
    """The last component (a dump's file or directory name)."""
    value = location(value)
    return Path(value).name if isinstance(value, Path) else value.rstrip("/").rsplit("/", 1)[-1]


def stem(value: Location) -> str:
    """`name` without its suffix when it names a file (as `Path.stem`)."""
    return Path(name(value)).stem if is_file(value) else name(value)


def _filesystem(uri: str) -> tuple[Any, str]:
    """The pyarrow filesystem of a URI (one per scheme and bucket, reused) and the path inside it."""
    import pyarrow.fs as pafs

    scheme, rest = uri.split("://", 1)
    bucket, _, key = rest.partition("/")
    root = f"{scheme}://{bucket}"
    if root not in _FILESYSTEMS:
        try:
            _FILESYSTEMS[root] = pafs.FileSystem.from_uri(root)
        except (OSError, ValueError, TypeError) as error:
            raise UnusableInput(f"cannot open {uri}: {_first_line(error)}; check the URI and its credentials") from None
    fs, root_path = _FILESYSTEMS[root]
    return fs, f"{root_path.rstrip('/')}/{key}" if key else root_path


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _info(uri: str) -> Any:
    fs, path = _filesystem(uri)
    try:
        return fs.get_file_info(path)
    except OSError as error:
        raise UnusableInput(f"cannot reach {uri}: {_first_line(error)}; check the URI and its credentials") from None


def exists(value: Location) -> bool:
    value = location(value)
    if isinstance(value, Path):
        return value.exists()
    import pyarrow.fs as pafs

    return _info(value).type != pafs.FileType.NotFound


def is_file(value: Location) -> bool:
    value = location(value)
    if isinstance(value, Path):
        return value.is_file()
    import pyarrow.fs as pafs

    return _info(value).type == pafs.FileType.File


def is_dir(value: Location) -> bool:
    value = location(value)
    if isinstance(value, Path):
        return value.is_dir()
    import pyarrow.fs as pafs

    return _info(value).type == pafs.FileType.Directory


def list_files(root: Location, suffix: str = "") -> list[Location]:
    """Every file under a directory (recursively) whose name ends with `suffix`, sorted."""
    root = location(root)
    if isinstance(root, Path):
        return sorted(p for p in root.rglob(f"*{suffix}") if p.is_file())
    return sorted(f"{root}/{relative}" for relative in _remote_files(root) if relative.endswith(suffix))


def _remote_files(root: str) -> list[str]:
    """Paths of the files under a URI, relative to it."""
    import pyarrow.fs as pafs

    fs, path = _filesystem(root)
    selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
    try:
        infos = fs.get_file_info(selector)
    except OSError as error:
        raise UnusableInput(f"cannot list {root}: {_first_line(error)}; check the URI and its credentials") from None
    prefix = path.rstrip("/") + "/"
    return sorted(info.path[len(prefix) :] for info in infos if info.type == pafs.FileType.File)


@contextmanager
def open_input(value: Location) -> Iterator[IO[bytes]]:
    """A file opened for random-access reading (what `pyarrow.parquet.ParquetFile` takes)."""
    value = location(value)
    if isinstance(value, Path):
        with open(value, "rb") as handle:
            yield handle
        return
    fs, path = _filesystem(value)
    with fs.open_input_file(path) as handle:
        yield handle


def stamp(value: Location) -> tuple[str, int, int]:
    """(canonical name, size, modification time in ns): what says a file has not changed."""
    value = location(value)
    if isinstance(value, Path):
        status = os.stat(value)
        return str(value.resolve()), status.st_size, status.st_mtime_ns
    info = _info(value)
    mtime = info.mtime_ns if info.mtime_ns is not None else 0
    return value, int(info.size or 0), int(mtime)


def absolute(value: Location) -> Location:
    """A location any process (a worker on another node, a resumed run) names the same way."""
    value = location(value)
    return value.resolve() if isinstance(value, Path) else value


# ---------------------------------------------------------------------------------------------
# Copies between a local directory and a URI


def download(uri: str, local: Path, wanted: Callable[[str], bool] = lambda relative: True) -> dict[str, tuple]:
    """Copy the files under `uri` that `wanted` (called with each relative path) into `local`; the
    others become empty placeholders, so the local directory lists what the remote one holds.
    Returns each file's (size, mtime) as written, to tell later which files changed."""
    fs, path = _filesystem(uri)
    for relative in _remote_files(uri):
        target = local / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if not wanted(relative):
            target.touch()
            continue
        with fs.open_input_stream(f"{path}/{relative}") as source, open(target, "wb") as out:
            shutil.copyfileobj(source, out, 1 << 20)
    return snapshot(local)


def snapshot(local: Path) -> dict[str, tuple]:
    return {p.relative_to(local).as_posix(): _signature(p) for p in local.rglob("*") if p.is_file()}


def _signature(path: Path) -> tuple:
    status = path.stat()
    return status.st_size, status.st_mtime_ns


def upload(local: Path, uri: str, relatives: list[str]) -> None:
    """Copy files from `local` to `uri`; shard markers go last, so a marker never names missing files."""
    fs, path = _filesystem(uri)
    for relative in sorted(relatives, key=lambda r: (r.endswith(MARKER_SUFFIX), r)):
        with open(local / relative, "rb") as source, fs.open_output_stream(f"{path}/{relative}") as out:
            shutil.copyfileobj(source, out, 1 << 20)


def delete(uri: str, relatives: list[str]) -> None:
    fs, path = _filesystem(uri)
    for relative in relatives:
        fs.delete_file(f"{path}/{relative}")


def upload_changes(local: Path, uri: str, before: dict[str, tuple]) -> None:
    """Upload the files of `local` that are new or changed since `before` (a `snapshot`)."""
    now = snapshot(local)
    upload(local, uri, [relative for relative, signature in now.items() if before.get(relative) != signature])


@dataclass
class StagedRun:
    """A run directory in object storage, written through a local staging directory.

    On entry the remote run's `shards/` (what a resume needs) and `run.json` are copied in and
    every other remote file becomes an empty placeholder (so the usual checks see a non-empty
    directory). `reset()` deletes every remote file the run removed locally (a previous run's
    outputs and shards, on an overwrite; its summary.json in any case), then uploads the
    fingerprint; `shard_written(name)` uploads that shard; both in a background thread, in order,
    so once the new fingerprint is there nothing of the previous run is. On a clean exit every
    other file written or changed locally is uploaded; the staging directory is removed in any case.
    """

    uri: str
    local: Path = field(init=False)
    _before: dict[str, tuple] = field(init=False, default_factory=dict)
    _uploads: Any = field(init=False, default=None)
    _pending: list[Any] = field(init=False, default_factory=list)

    def __enter__(self) -> "StagedRun":
        if is_file(self.uri):
            raise UsageError(f"--out {self.uri} is a file; pass a directory path for the run")
        self.local = Path(tempfile.mkdtemp(prefix="trace-tools-run-"))
        self._before = download(self.uri, self.local, lambda r: r.startswith("shards/") or r == "run.json")
        self._uploads = ThreadPoolExecutor(1, thread_name_prefix="trace-tools-upload")
        return self

    def reset(self) -> None:
        """The local directory now holds only what this run keeps of the remote one (after
        `rundir.remove_outputs` and `shards.prepare`): delete the rest remotely, then upload the
        fingerprint."""
        self._submit(self._delete_removed())
        self._upload(["shards/FINGERPRINT"])

    def _delete_removed(self) -> Callable[[], None]:
        """A job deleting the remote files that were downloaded (or are placeholders) and are gone
        locally now; they are forgotten at once, so a later file of that name is uploaded."""
        removed = [relative for relative in self._before if not (self.local / relative).exists()]
        for relative in removed:
            del self._before[relative]
        return lambda: delete(self.uri, removed)

    def shard_written(self, name: str) -> None:
        self._upload([p.relative_to(self.local).as_posix() for p in (self.local / "shards").glob(f"{name}.*")])

    def _upload(self, relatives: list[str]) -> None:
        """Upload files that will not change again, and remember them as uploaded."""
        self._before.update({relative: _signature(self.local / relative) for relative in relatives})
        self._submit(lambda: upload(self.local, self.uri, relatives))

    def _submit(self, job: Callable[[], Any]) -> None:
        self._pending.append(self._uploads.submit(job))

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        if isinstance(error, TraceToolsError) and error.args:
            # The run's checks saw the staging directory; the user named the URI.
            error.args = (str(error).replace(str(self.local), self.uri), *error.args[1:])
        try:
            self._uploads.shutdown(wait=True)
            for job in self._pending:
                job.result()  # an upload that failed fails the command
            if kind is None:
                self._delete_removed()()
                upload_changes(self.local, self.uri, self._before)
        finally:
            shutil.rmtree(self.local, ignore_errors=True)


@contextmanager
def local_output(target: Location) -> Iterator[Path]:
    """Where to write `target`: itself, or for a URI a local file uploaded when the block succeeds."""
    if isinstance(target, Path):
        yield target
        return
    folder = Path(tempfile.mkdtemp(prefix="trace-tools-out-"))
    try:
        yield folder / name(target)
        upload(folder, target.rsplit("/", 1)[0], [name(target)])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def local_run(run: Location, write_back: bool = False) -> Iterator[Path]:
    """A finished run as a local directory: the path itself, or a copy of a remote run (its
    `shards/` left out). With `write_back`, files the block wrote or changed are uploaded."""
    if isinstance(run, Path):
        yield run
        return
    if not is_dir(run):
        raise TraceToolsError(f"{run} holds no run directory; run `trace-tools replay DUMP --out {run}` first")
    local = Path(tempfile.mkdtemp(prefix="trace-tools-run-"))
    try:
        before = download(run, local, lambda relative: not relative.startswith("shards/"))
        yield local
        if write_back:
            upload_changes(local, run, before)
    finally:
        shutil.rmtree(local, ignore_errors=True)
