"""`trace-tools probe HARNESS`: drive a real harness through the recorder and measure its echoes.

    from trace_tools.probe import probe     # this module's `probe`, re-exported by the package
    result = probe("claude-code", sessions=12, out="runs/probe-cc")
    result.profile            # what the harness did to the history it echoed (profile.py)
    result.run_dir            # a run directory: the dump, the request log, profile.json, replay

One probe: scratch repositories (`scenarios.py`), the recorder serving a Unix socket, the
sandbox (`sandbox.py`: a fresh network namespace with loopback only, checked, the harness run as
an unprivileged user with telemetry off and a dummy key) running one harness session per
scenario, then the harness profile (`profile.py`) from the dump, and a replay of the dump through
every strategy into the same run directory, whose report.html shows the profile.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from trace_tools.errors import TraceToolsError, UnknownName, UsageError
from trace_tools.io.write import write_json_atomic
from trace_tools.probe.harnesses import Harness, Launch, get_harness
from trace_tools.probe.history import history_events
from trace_tools.probe.profile import detect_from_dump, write_profile
from trace_tools.probe.scenarios import TASK, Workspace, build_scenario, make_workspace
from trace_tools.record import make_renderer
from trace_tools.record.model import ScriptedModel
from trace_tools.record.server import REASONING_MODES, Recorder, RecorderThread
from trace_tools.record.side_requests import side_request_counts

UNPRIVILEGED = (65534, 65534)  # nobody:nogroup, for the harness when the probe runs as root
BRIDGE_PORT = 8642


class IsolationFailed(TraceToolsError):
    """The sandbox could not establish network isolation, so the harness was not started."""


@dataclass
class ProbeResult:
    run_dir: Path
    harness: str
    version: str
    isolation: dict[str, Any]
    sessions: list[dict[str, Any]]
    profile: dict[str, Any]
    summary: dict[str, Any] = field(default_factory=dict)


def probe(
    harness: str,
    *,
    sessions: int = 12,
    out: str | Path,
    template: str = "qwen3",
    seed: int = 0,
    timeout_s: int = 300,
    reasoning: str = "separate",
    isolation: bool = True,
    replay: bool = True,
    workers: int | None = 1,
    progress: Callable[[str], None] | None = None,
) -> ProbeResult:
    """Probe `harness` for `sessions` sessions into the run directory `out` (see the module docstring).

    `reasoning="text"` makes the recorder send the reasoning as plain text, as a gateway that cannot
    return thinking blocks does (`record.server.REASONING_MODES`). `isolation=False` runs the
    harness in the host's network namespace (the CLI's explicit `--no-isolation`); otherwise a
    sandbox whose isolation checks fail stops the probe before any harness starts (`IsolationFailed`, exit 2).
    """
    if reasoning not in REASONING_MODES:
        raise UnknownName("reasoning mode", reasoning, list(REASONING_MODES))
    spec = get_harness(harness)
    executable = spec.locate()
    if sessions < 1:
        raise UsageError(f"--sessions must be at least 1 (got {sessions})")
    run_dir = _fresh_dir(Path(out).resolve())
    say = progress or (lambda message: None)
    work = run_dir / "work"
    workspaces = [make_workspace(work / f"s{i:02d}" / "repo", i, seed) for i in range(sessions)]
    renderer = make_renderer(template)
    scripts = _ScenarioBook(workspaces, spec, run_dir / "scenarios")
    # Side requests are declined (record/side_requests.py): no scripted text reaches a client's title or memory.
    model = ScriptedModel(renderer, scripts)
    recorder = Recorder(run_dir, renderer, model, harness=harness, reasoning=reasoning, side_requests="decline")
    socket_dir = Path(tempfile.mkdtemp(prefix="tt-probe-"))
    try:
        with RecorderThread(recorder, unix=socket_dir / "recorder.sock"):
            report = _run_sandbox(spec, executable, workspaces, run_dir, socket_dir, isolation, timeout_s, say)
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)
    version = _version(run_dir)
    _check_sessions(report, run_dir)
    profile = detect_from_dump(run_dir / "dump", harness=harness, version=version, protocol=spec.protocol)
    profile["measured"].update(
        sessions_requested=sessions,
        template=template,
        seed=seed,
        isolation=report["mode"],
        reasoning=reasoning,
        side_requests=side_request_counts(run_dir / "requests.jsonl"),
        variants={f"s{i:02d}": dict(spec.variant(i)) for i in range(sessions) if spec.variant(i)},
    )
    profile["history"] = history_events(run_dir / "dump")
    write_profile(profile, run_dir / "profile.json")
    say(f"profile: {len(profile['transformations'])} transformations over {profile['measured']['echoes']} echoed turns")
    result = ProbeResult(run_dir, harness, version, report, report["sessions"], profile)
    if replay:
        from trace_tools.api import replay as replay_dump

        say("replaying the dump through every strategy")
        # checkpoint-tree's echo rules follow the profile just measured (docs/checkpoint_tree.md)
        params = {"harness_profile": str(run_dir / "profile.json")}
        result.summary = replay_dump(
            run_dir / "dump", out=run_dir, workers=workers, overwrite=True, params=params
        ).summary
    return result


class _ScenarioBook:
    """Builds each session's scenario on its first request (from the tools it offers) and keeps a copy."""

    def __init__(self, workspaces: list[Workspace], spec: Harness, folder: Path):
        self.by_key = {f"s{ws.index:02d}": ws for ws in workspaces}
        self.spec, self.folder = spec, folder

    def __call__(self, session: str, tools: list[dict] | None) -> Any:
        ws = self.by_key.get(session)
        if ws is None:
            from trace_tools.record.script import Script, ScriptTurn

            return Script("unknown-session", [], ScriptTurn(content="Done."))
        script = build_scenario(ws, tools, self.spec.finish_command)

        self.folder.mkdir(parents=True, exist_ok=True)
        write_json_atomic(script.to_json(), self.folder / f"{session}.json")
        return script


def _fresh_dir(path: Path) -> Path:
    if path.exists() and any(path.iterdir()):
        raise UsageError(f"{path} is not empty; give --out a new directory (a probe never mixes recordings)")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _run_sandbox(
    spec: Harness,
    executable: Path,
    workspaces: list[Workspace],
    run_dir: Path,
    socket_dir: Path,
    isolation: bool,
    timeout_s: int,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Write the sandbox plan, run it, return its report (isolation checks and session outcomes)."""
    logs = run_dir / "harness-logs"
    logs.mkdir(exist_ok=True)
    uid, gid = UNPRIVILEGED if os.getuid() == 0 else (None, None)
    commands = [_version_command(spec, executable, run_dir, logs)]
    for ws in workspaces:
        key = f"s{ws.index:02d}"
        home = ws.root.parent / "home"
        home.mkdir(parents=True, exist_ok=True)
        launch = Launch(TASK, f"http://127.0.0.1:{BRIDGE_PORT}/s/{key}", home, ws.root)
        _write_config_files(spec, launch)
        commands.append(
            {
                "key": key,
                "argv": spec.command(executable, launch),
                "env": {**spec.environment(launch), **spec.variant(ws.index)},
                "cwd": str(ws.root),
                "log": str(logs / f"{key}.log"),
                "timeout": timeout_s,
            }
        )
    if uid is not None and gid is not None:
        _hand_over(run_dir / "work", uid, gid)
    plan = {
        "mode": "none" if not isolation else "netns",
        "port": BRIDGE_PORT,
        "unix_socket": str(socket_dir / "recorder.sock"),
        "uid": uid,
        "gid": gid,
        "report": str(run_dir / "isolation.json"),
        "commands": commands,
    }
    plan_path = socket_dir / "plan.json"
    plan_path.write_text(json.dumps(plan))
    say(f"sandbox: {'network namespace, loopback only' if isolation else 'NO isolation'}; {len(workspaces)} sessions")
    sandbox = Path(__file__).with_name("sandbox.py")
    process = subprocess.Popen([sys.executable, "-I", str(sandbox), str(plan_path)], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        say(line.rstrip())
    rc = process.wait()
    if not (run_dir / "isolation.json").exists():
        raise TraceToolsError(f"the sandbox failed (exit {rc}) before writing its report; its output is above")
    report = json.loads((run_dir / "isolation.json").read_text())
    if rc == 3 or (isolation and not report.get("isolated")):
        failed = [f"{c['name']}: {c['detail']}" for c in report.get("checks", []) if not c["ok"]]
        reason = report.get("error") or "; ".join(failed) or "unknown"
        raise IsolationFailed(
            f"network isolation could not be established ({reason}); the harness was not started. "
            "Run as root or where unprivileged user namespaces are allowed, or pass --no-isolation "
            "to let the harness reach the network (not recommended)"
        )
    return report


def _version_command(spec: Harness, executable: Path, run_dir: Path, logs: Path) -> dict[str, Any]:
    home = run_dir / "work" / "version-home"
    home.mkdir(parents=True, exist_ok=True)
    launch = Launch("", f"http://127.0.0.1:{BRIDGE_PORT}/s/version", home, home)
    _write_config_files(spec, launch)
    return {
        "key": "version",
        "argv": spec.version_command(executable),
        "env": spec.environment(launch),
        "cwd": str(home),
        "log": str(logs / "version.log"),
        "timeout": 60,
    }


def _write_config_files(spec: Harness, launch: Launch) -> None:
    """The record's settings files (quiet switches that exist only on disk) into the scratch home."""
    for relative, text in spec.config_files(launch).items():
        path = launch.home / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def _hand_over(folder: Path, uid: int, gid: int) -> None:
    """The harness runs as `uid`: it must own its scratch repositories and homes."""
    for root, dirs, files in os.walk(folder):
        for name in [root, *(os.path.join(root, d) for d in dirs), *(os.path.join(root, f) for f in files)]:
            os.chown(name, uid, gid)
    for parent in (folder, *folder.parents):
        if parent == Path("/"):
            break
        mode = parent.stat().st_mode
        if not mode & 0o001:
            raise UsageError(
                f"{parent} is not searchable by other users, so the unprivileged harness cannot reach its "
                "scratch repository; give --out a directory under a world-searchable path (e.g. /tmp)"
            )


def _version(run_dir: Path) -> str:
    """The first version-looking word of the client's own answer (`2.1.332 (Claude Code)`, `codex-cli 0.171.0`)."""
    words = (run_dir / "harness-logs" / "version.log").read_text(errors="replace").split()
    return next((word for word in words if re.fullmatch(r"v?\d+\.\d+[\w.+-]*", word)), words[0] if words else "unknown")


def _check_sessions(report: dict[str, Any], run_dir: Path) -> None:
    errors = [s["error"] for s in report["sessions"] if s.get("error")]
    if not any((run_dir / "dump").rglob("*.parquet")):
        logs = run_dir / "harness-logs"
        reason = f" ({errors[0]}; install harnesses where other users can read and run them)" if errors else ""
        raise TraceToolsError(f"the harness recorded no turn{reason}; see its logs in {logs}")
