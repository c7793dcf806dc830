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

One writer per remote run: `io.remote_lock.RemoteLock` holds the lock object RUN/.lock, created only if absent
(S3's `If-None-Match: *`, through boto3) or, where no conditional create is available, as a lease
read back after a pause (docs/run_directory.md#one-writer says what each guarantees). An upload
that fails stops the run at its next result, the shards uploaded before it kept for a resume; a
staging directory is removed on every exit, and one a killed driver left is removed by the next
command that stages.
"""

from __future__ import annotations

import json
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
from trace_tools.io.remote_lock import LOCK_NAME, RemoteLock, alive, first_line

Location = str | Path  # a local path (Path) or an object-storage URI (str); every helper takes either, or a str path
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_FILESYSTEMS: dict[str, Any] = {}
MARKER_SUFFIX = ".done"  # a shard's completion marker: uploaded after the shard's other files
STAGING_PREFIX = "trace-tools-run-"  # + pid + "-": whose staging directory it is


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
            raise UnusableInput(f"cannot open {uri}: {first_line(error)}; check the URI and its credentials") from None
    fs, root_path = _FILESYSTEMS[root]
    return fs, f"{root_path.rstrip('/')}/{key}" if key else root_path


def _info(uri: str) -> Any:
    fs, path = _filesystem(uri)
    try:
        return fs.get_file_info(path)
    except OSError as error:
        raise UnusableInput(f"cannot reach {uri}: {first_line(error)}; check the URI and its credentials") from None


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
        raise UnusableInput(f"cannot list {root}: {first_line(error)}; check the URI and its credentials") from None
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
    others become empty placeholders, so the local directory lists what the remote one holds (the
    remote lock is left out: it is no file of the run). Returns each file's (size, mtime) as
    written, to tell later which files changed."""
    for relative in _remote_files(uri):
        if relative == LOCK_NAME:
            continue
        target = local / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if wanted(relative):
            _fetch(uri, relative, target)
        else:
            target.touch()
    return snapshot(local)


def _fetch(uri: str, relative: str, target: Path) -> None:
    fs, path = _filesystem(uri)
    with fs.open_input_stream(f"{path}/{relative}") as source, open(target, "wb") as out:
        shutil.copyfileobj(source, out, 1 << 20)


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
    """Upload the files of `local` that are new or changed since `before` (a `snapshot`); the local
    lock file is this machine's, not the run's."""
    now = snapshot(local)
    changed = [relative for relative, signature in now.items() if before.get(relative) != signature]
    upload(local, uri, [relative for relative in changed if relative != LOCK_NAME])


# ---------------------------------------------------------------------------------------------
# Staging directories: named by their process, so the next one cleans a killed driver's


def staging_dir() -> Path:
    remove_stale_staging()
    return Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-"))


def remove_stale_staging(root: Path | None = None) -> list[Path]:
    """Remove the staging directories whose process is gone (a killed driver's); returns them."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{STAGING_PREFIX}*-*"):
        pid = folder.name[len(STAGING_PREFIX) :].split("-", 1)[0]
        if folder.is_dir() and pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def remote_lock(run: str) -> RemoteLock:
    """The lock of the run directory at URI `run` (not taken yet)."""
    return RemoteLock(run, *_filesystem(f"{run}/{LOCK_NAME}"))


@dataclass
class StagedRun:
    """A run directory in object storage, written through a local staging directory.

    On entry the remote lock is taken (`RemoteLock`), then the remote run's shard markers,
    `shards/FINGERPRINT` and `run.json` are copied in and every other remote file becomes an empty
    placeholder (so the usual checks see a non-empty directory); `fetch_reused(stamp)` then copies
    the files of the shards a resume under that fingerprint may reuse, and nothing else.
    `reset()` deletes every remote file the run removed locally (a previous run's outputs and
    shards, on an overwrite; its summary.json in any case), then uploads the fingerprint;
    `shard_written(name)` uploads that shard; both in a background thread, in order, so once the
    new fingerprint is there nothing of the previous run is. `check()` raises as soon as an
    upload failed. On a clean exit every other file written or changed locally is uploaded; the
    staging directory is removed and the lock released on every exit.
    """

    uri: str
    local: Path = field(init=False)
    _before: dict[str, tuple] = field(init=False, default_factory=dict)
    _uploads: Any = field(init=False, default=None)
    _pending: list[Any] = field(init=False, default_factory=list)
    _lock: RemoteLock | None = field(init=False, default=None)
    _failure: BaseException | None = field(init=False, default=None)

    def __enter__(self) -> "StagedRun":
        if is_file(self.uri):
            raise UsageError(f"--out {self.uri} is a file; pass a directory path for the run")
        self._lock = remote_lock(self.uri)
        self._lock.acquire()
        self.local = staging_dir()
        try:
            self._before = download(self.uri, self.local, _first_fetched)
        except BaseException:
            shutil.rmtree(self.local, ignore_errors=True)
            self._lock.release()
            raise
        self._uploads = ThreadPoolExecutor(1, thread_name_prefix="trace-tools-upload")
        return self

    def fetch_reused(self, stamp: str) -> None:
        """Copy in the files of each shard whose marker belongs to fingerprint `stamp` (the only
        ones `io.shards.prepare` may reuse); the placeholders of the others are removed by it."""
        for done in sorted((self.local / "shards").glob(f"*{MARKER_SUFFIX}")):
            try:
                marker = json.loads(done.read_text())
                files = list(marker["files"]) if marker.get("fingerprint") == stamp else []
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue  # unreadable: prepare replays the shard and says why
            for relative in (f"shards/{name}" for name in files):
                if relative in self._before:
                    _fetch(self.uri, relative, self.local / relative)
                    self._before[relative] = _signature(self.local / relative)

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
        self.check()
        self._upload([p.relative_to(self.local).as_posix() for p in (self.local / "shards").glob(f"{name}.*")])

    def check(self) -> None:
        """Raise if an upload failed or the lock was lost: the run stops at once, what was
        uploaded before stays for a resume."""
        if self._lock is not None and self._lock.lost:
            raise TraceToolsError(f"{self._lock.lost}; stopped, the shards uploaded so far are kept")
        if self._failure is not None:
            raise self._failed(self._failure)

    def _failed(self, failure: BaseException) -> TraceToolsError:
        if isinstance(failure, TraceToolsError):
            return failure
        return TraceToolsError(
            f"uploading to {self.uri} failed ({first_line(failure)}); the run stopped, the shards uploaded "
            "before are kept: fix the cause (credentials? permissions?) and rerun the same command to resume"
        )

    def _upload(self, relatives: list[str]) -> None:
        """Upload files that will not change again, and remember them as uploaded."""
        self._before.update({relative: _signature(self.local / relative) for relative in relatives})
        self._submit(lambda: upload(self.local, self.uri, relatives))

    def _submit(self, job: Callable[[], Any]) -> None:
        self._pending.append(self._uploads.submit(self._unless_failed, job))

    def _unless_failed(self, job: Callable[[], Any]) -> None:
        """Run an upload job unless an earlier one failed: the remote run then keeps exactly the
        shards finished before the failure, in order."""
        if self._failure is not None:
            return
        try:
            job()
        except BaseException as failure:
            self._failure = failure
            raise

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        if isinstance(error, TraceToolsError) and error.args:
            # The run's checks saw the staging directory; the user named the URI.
            error.args = (str(error).replace(str(self.local), self.uri), *error.args[1:])
        try:
            # A failed run uploads nothing more: what is there (finished shards) is what a resume reuses.
            self._uploads.shutdown(wait=True, cancel_futures=kind is not None)
            if kind is None:
                self.check()
                self._delete_removed()()
                upload_changes(self.local, self.uri, self._before)
        except OSError as failure:
            raise self._failed(failure) from None
        finally:
            shutil.rmtree(self.local, ignore_errors=True)
            if self._lock is not None:
                self._lock.release()


def _first_fetched(relative: str) -> bool:
    """What a staged run copies in before it knows its fingerprint: run.json, the shards'
    fingerprint and their markers (the shards' files follow in `fetch_reused`)."""
    return relative in ("run.json", "shards/FINGERPRINT") or (
        relative.startswith("shards/") and relative.endswith(MARKER_SUFFIX)
    )


@contextmanager
def local_output(target: Location) -> Iterator[Path]:
    """Where to write `target`: itself, or for a URI a local file uploaded when the block succeeds."""
    if isinstance(target, Path):
        yield target
        return
    folder = staging_dir()
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
    local = staging_dir()
    try:
        before = download(run, local, lambda relative: not relative.startswith("shards/"))
        yield local
        if write_back:
            upload_changes(local, run, before)
    finally:
        shutil.rmtree(local, ignore_errors=True)
