"""One writer per run directory in object storage: the lock object RUN/.lock (docs/run_directory.md#one-writer).

The lock names its holder and when its lease ends, and is renewed while held. Where the store
takes a conditional write through a maintained client (S3's `If-None-Match: *` and `If-Match`,
through boto3) the lock is created only if absent and a stale one replaced only if unchanged;
elsewhere (`gs://` through pyarrow, which exposes no generation preconditions) it is a lease read
back after a pause, with a race window the docs state.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from trace_tools.errors import UsageError

LOCK_NAME = ".lock"  # the writer's lock: a local file (`io.shards.RunLock`) or a remote object (`RemoteLock`)

LEASE_SECONDS = 60.0  # a remote lock not renewed for this long is stale (its holder died); renewed every third
SETTLE_SECONDS = 2.0  # a lease (no conditional create) is read back after this pause to see who won


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def alive(pid: int) -> bool:
    """Whether process `pid` runs on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def this_process() -> dict[str, Any]:
    """Who holds a lock: pid, host, start time and command line."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv and sys.argv[0] else "python",
    }


def holder_text(text: str) -> str:
    """A lock's holder in words, from the JSON it wrote."""
    try:
        info = json.loads(text)
        return f"pid {info['pid']} on {info['host']}, since {info['started']}: {info['command']}"
    except (ValueError, KeyError, TypeError):
        return "a process that has not written its name yet"


def busy(where: str, holder: str) -> UsageError:
    return UsageError(
        f"{where} is being written by another trace-tools process ({holder_text(holder)}); "
        "wait for it to finish, or choose another --out"
    )


class RemoteLock:
    """RUN/.lock in object storage, held for as long as this process writes the run.

    The object names its holder and when its lease ends; a thread renews it every third of
    `LEASE_SECONDS`. On `s3://` with boto3 installed it is created only if absent (PutObject with
    `If-None-Match: *`) and a stale one (lease ended, or its holder's pid is gone on this host) is
    replaced only if unchanged (`If-Match` on its ETag), so of two drivers exactly one holds it.
    Elsewhere (`gs://` through pyarrow, which has no preconditions) it is a lease: written when
    absent or stale, then read back after `SETTLE_SECONDS`; a second driver whose check and write
    are further apart than that can still overwrite it unnoticed (the race window)."""

    def __init__(self, run_uri: str, filesystem: Any, path: str):
        """`filesystem` and `path`: the lock object's, as pyarrow reaches it (`storage.remote_lock`)."""
        self.run_uri, self.uri = run_uri, f"{run_uri}/{LOCK_NAME}"
        self.token = uuid.uuid4().hex
        self.lost = ""  # why the lease was lost while held (another driver took it over)
        self._lease = _LeaseStore(filesystem, path)  # where no conditional write is taken
        self._store: _LeaseStore | _ConditionalStore = _ConditionalStore.for_uri(self.uri) or self._lease
        self._etag: str | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _body(self) -> bytes:
        return json.dumps({**this_process(), "token": self.token, "expires": time.time() + LEASE_SECONDS}).encode()

    def acquire(self) -> None:
        try:
            self._etag = self._store.create(self._body())
        except _Unsupported:
            self._store = self._lease
            self._etag = self._store.create(self._body())
        if self._etag is None:
            found = self._store.read()
            if found is not None and not _stale(found[0]):
                raise busy(self.run_uri, found[0].decode("utf-8", "replace"))
            self._etag = self._store.replace(self._body(), found[1] if found else None)
            if self._etag is None:  # another driver took it over first
                found = self._store.read()
                raise busy(self.run_uri, found[0].decode("utf-8", "replace") if found else "")
        self._renewer = threading.Thread(target=self._renew, name="trace-tools-lease", daemon=True)
        self._renewer.start()

    def _renew(self) -> None:
        while not self._stop.wait(LEASE_SECONDS / 3):
            try:
                self._etag = self._store.replace(self._body(), self._etag)
            except OSError:
                continue  # a passing error: the lease outlives a few missed renewals
            if self._etag is None:
                self.lost = f"another process took over the lock {self.uri} (this one's lease was not renewed in time)"
                return

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if not self.lost and self._etag is not None:
            self._store.remove(self._etag)


def _stale(body: bytes) -> bool:
    try:
        info = json.loads(body)
        expired = float(info["expires"]) < time.time()
        dead_here = info["host"] == socket.gethostname() and not alive(int(info["pid"]))
    except (ValueError, KeyError, TypeError):
        return True  # not a lock this version writes (an older run's uploaded lock file)
    return expired or dead_here


class _Unsupported(Exception):
    """The store refuses conditional writes (an S3-compatible server without them)."""


class _LeaseStore:
    """A lock object without preconditions (pyarrow's filesystem): check, write, pause, read back.
    Its tags are the holders' tokens."""

    def __init__(self, filesystem: Any, path: str):
        self.fs, self.path = filesystem, path

    def read(self) -> tuple[bytes, str] | None:
        try:
            with self.fs.open_input_stream(self.path) as source:
                body = source.read()
        except FileNotFoundError:
            return None
        return body, _token_of(body)

    def create(self, body: bytes) -> str | None:
        return None if self.read() is not None else self._write(body)

    def replace(self, body: bytes, tag: str | None) -> str | None:
        """Write `body` if the lock is still the one tagged `tag` (None: absent)."""
        found = self.read()
        return self._write(body) if (found[1] if found is not None else None) == tag else None

    def _write(self, body: bytes) -> str | None:
        with self.fs.open_output_stream(self.path) as out:
            out.write(body)
        time.sleep(SETTLE_SECONDS)
        found = self.read()
        return found[1] if found is not None and found[0] == body else None

    def remove(self, tag: str) -> None:
        found = self.read()
        if found is not None and found[1] == tag:
            self.fs.delete_file(self.path)


def _token_of(body: bytes) -> str:
    try:
        return str(json.loads(body)["token"])
    except (ValueError, KeyError, TypeError):
        return ""


class _ConditionalStore:
    """A lock object on S3 through boto3's conditional writes (ETags as tags)."""

    def __init__(self, client: Any, bucket: str, key: str):
        self.client, self.bucket, self.key = client, bucket, key

    @classmethod
    def for_uri(cls, uri: str) -> "_ConditionalStore | None":
        if not uri.startswith("s3://"):
            return None
        try:
            import boto3
        except ImportError:
            return None
        bucket, _, key = uri[len("s3://") :].partition("/")
        return cls(boto3.client("s3"), bucket.rpartition("@")[2], key.split("?", 1)[0])

    def _put(self, body: bytes, **condition: str) -> str | None:
        from botocore.exceptions import BotoCoreError, ClientError, ParamValidationError

        try:
            return str(self.client.put_object(Bucket=self.bucket, Key=self.key, Body=body, **condition)["ETag"])
        except ClientError as error:
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status in (409, 412) or error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None  # the condition failed: someone else's object is there (or is gone)
            if status == 501:
                raise _Unsupported() from None
            raise OSError(f"cannot write the lock {self.key}: {first_line(error)}") from None
        except ParamValidationError:
            raise _Unsupported() from None  # a boto3 from before conditional writes
        except BotoCoreError as error:
            raise OSError(f"cannot write the lock {self.key}: {first_line(error)}") from None

    def create(self, body: bytes) -> str | None:
        return self._put(body, IfNoneMatch="*")

    def read(self) -> tuple[bytes, str] | None:
        from botocore.exceptions import ClientError

        try:
            found = self.client.get_object(Bucket=self.bucket, Key=self.key)
        except ClientError:
            return None
        return found["Body"].read(), str(found["ETag"])

    def replace(self, body: bytes, tag: str | None) -> str | None:
        """Write `body` if the lock is still the object with ETag `tag` (None: absent)."""
        return self._put(body, IfMatch=tag) if tag else self.create(body)

    def remove(self, tag: str) -> None:
        found = self.read()
        if found is not None and found[1] == tag:
            self.client.delete_object(Bucket=self.bucket, Key=self.key)
