"""The harness sandbox: a fresh network namespace with loopback alone, checked, then the harness.

`probe` runs this file as a script in a new interpreter (`python -I sandbox.py PLAN.json`), so
the process is single-threaded when it calls `unshare(2)` and imports nothing but the standard
library. In order:

1. **Namespace.** As root: `unshare(CLONE_NEWNET)`, a new network namespace. Otherwise
   `unshare(CLONE_NEWUSER | CLONE_NEWNET)` with the caller's own uid and gid mapped, where the
   kernel allows unprivileged user namespaces. Mode `none` (the explicit `--no-isolation`)
   skips this step.
2. **Loopback up** (`SIOCSIFFLAGS` on `lo`), nothing else configured.
3. **Checks** (all must pass, else the harness is not started unless the plan allows it):
   the namespace's interfaces are exactly `lo`; a TCP connection to 192.0.2.1:80 (IPv4
   TEST-NET-1) and to [2001:db8::1]:80 (the IPv6 documentation prefix) fails at once with
   "network unreachable" (no route exists, so no packet can leave); resolving a registry host
   name fails; and the recorder answers `GET /health` through the bridge on 127.0.0.1.
4. **Bridge.** A thread listens on 127.0.0.1:PORT inside the namespace and pipes each
   connection to the recorder's Unix socket (a filesystem socket, reachable from any network
   namespace): the recorder is the only thing the harness can reach.
5. **Harness.** Each session's command runs with exactly the plan's environment (nothing
   inherited), in its scratch repository, as the plan's unprivileged uid/gid when root (Claude
   Code refuses to skip permission prompts as root), in its own process group, with a timeout.

The report (`isolation.json` and per-session exit codes) is written to the plan's `report` path.
"""

import asyncio
import ctypes
import errno
import fcntl
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time

CLONE_NEWNET, CLONE_NEWUSER = 0x40000000, 0x10000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
UNREACHABLE = (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)
OUTSIDE = (
    ("IPv4 TEST-NET-1", socket.AF_INET, ("192.0.2.1", 80)),
    ("IPv6 documentation", socket.AF_INET6, ("2001:db8::1", 80)),
)
REGISTRY_HOST = "registry.npmjs.org"


def enter_namespace(mode):
    """Move this (single-threaded) process into a new network namespace; returns a description."""
    if mode == "none":
        return "none: the harness shares the host's network (--no-isolation)"
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNET if uid == 0 else CLONE_NEWUSER | CLONE_NEWNET
    if libc.unshare(flags) != 0:
        code = ctypes.get_errno()
        raise OSError(
            code, f"unshare({'CLONE_NEWNET' if uid == 0 else 'CLONE_NEWUSER|CLONE_NEWNET'}) failed: {os.strerror(code)}"
        )
    if uid != 0:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
        return f"user+network namespace (uid {uid} mapped to itself)"
    return "network namespace (root: unshare CLONE_NEWNET)"


def _write(path, text):
    with open(path, "w") as handle:
        handle.write(text)


def loopback_up():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14s", b"lo", 0, b"\0" * 14)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, SIOCGIFFLAGS, request)[:18])[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | IFF_UP, b"\0" * 14))


def check_isolation(port):
    """Every check as {name, ok, detail}."""
    checks = []
    names = sorted(name for _, name in socket.if_nameindex())
    checks.append({"name": "interfaces", "ok": names == ["lo"], "detail": f"interfaces: {', '.join(names)}"})
    for label, family, address in OUTSIDE:
        checks.append(_outbound(label, family, address))
    checks.append(_resolve(REGISTRY_HOST))
    checks.append(_health(port))
    return checks


def _outbound(label, family, address):
    name = f"connect {label} {address[0]}"
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        return {"name": name, "ok": True, "detail": f"no {label} sockets at all ({exc.strerror})"}
    sock.settimeout(3)
    try:
        sock.connect(address)
    except OSError as exc:
        unreachable = exc.errno in UNREACHABLE
        detail = f"failed at once: {exc.strerror or exc}" if unreachable else f"unexpected: {exc!r}"
        return {"name": name, "ok": unreachable, "detail": detail}
    finally:
        sock.close()
    return {"name": name, "ok": False, "detail": "connected: the namespace reaches the outside"}


def _resolve(host):
    try:
        found = socket.getaddrinfo(host, 443)
    except OSError as exc:
        return {"name": f"resolve {host}", "ok": True, "detail": f"failed: {exc}"}
    return {"name": f"resolve {host}", "ok": False, "detail": f"resolved to {found[0][4][0]}"}


def _health(port):
    name = f"recorder via 127.0.0.1:{port}"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            reply = b""
            while chunk := sock.recv(4096):
                reply += chunk
    except OSError as exc:
        return {"name": name, "ok": False, "detail": f"unreachable: {exc}"}
    ok = reply.startswith(b"HTTP/1.1 200")
    return {"name": name, "ok": ok, "detail": reply.split(b"\r\n", 1)[0].decode(errors="replace")}


class Bridge:
    """127.0.0.1:port inside the namespace → the recorder's Unix socket."""

    def __init__(self, port, unix_path):
        self.port, self.unix_path = port, unix_path
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.error = None
        threading.Thread(target=self._run, daemon=True).start()
        self.ready.wait(30)
        if self.error is not None:
            raise self.error

    def _run(self):
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", self.port))
        except OSError as exc:
            self.error = exc
        self.ready.set()
        self.loop.run_forever()

    async def _serve(self, reader, writer):
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self.unix_path)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def _pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except OSError:
            pass


def run_command(spec, uid, gid):
    """Run one command; returns {rc, seconds, timed_out}."""
    started = time.monotonic()
    drop = {"user": uid, "group": gid, "extra_groups": []} if uid is not None and os.getuid() == 0 else {}
    with open(spec["log"], "ab") as log:
        try:
            process = subprocess.Popen(
                spec["argv"],
                cwd=spec["cwd"],
                env=spec["env"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **drop,
            )
        except OSError as exc:  # e.g. the unprivileged user may not read the harness
            log.write(f"cannot start {spec['argv'][0]}: {exc}\n".encode())
            return {"rc": 126, "seconds": 0.0, "timed_out": False, "error": str(exc)}
        try:
            rc = process.wait(timeout=spec["timeout"])
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            rc, timed_out = process.wait(), True
    return {"rc": rc, "seconds": round(time.monotonic() - started, 2), "timed_out": timed_out}


def main(plan_path):
    with open(plan_path) as handle:
        plan = json.load(handle)
    report = {"mode": plan["mode"], "checks": [], "isolated": False, "sessions": []}
    try:
        report["namespace"] = enter_namespace(plan["mode"])
        if plan["mode"] != "none":
            loopback_up()
        Bridge(plan["port"], plan["unix_socket"])
        report["checks"] = check_isolation(plan["port"])
    except OSError as exc:
        report["error"] = str(exc)
    report["isolated"] = plan["mode"] != "none" and bool(report["checks"]) and all(c["ok"] for c in report["checks"])
    recorder_ok = any(c["name"].startswith("recorder") and c["ok"] for c in report["checks"])
    allowed = report["isolated"] or (plan["mode"] == "none" and recorder_ok)
    if allowed:
        for spec in plan["commands"]:
            outcome = run_command(spec, plan.get("uid"), plan.get("gid"))
            report["sessions"].append({"key": spec["key"], **outcome})
            print(f"{spec['key']}: exit {outcome['rc']} in {outcome['seconds']}s", flush=True)
    with open(plan["report"], "w") as handle:
        json.dump(report, handle, indent=2)
    return 0 if allowed else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
