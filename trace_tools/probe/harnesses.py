"""The real harnesses `probe` can drive: where each is installed, how it is launched, what it must not do.

Harnesses live outside the repository, in `$TRACE_TOOLS_HARNESS_DIR` (default
`/opt/trace-tools/harnesses` as root, where the unprivileged user the harness runs as can read
it, else `~/.cache/trace-tools/harnesses`), one folder per harness and pinned version; the
install commands are in `INSTALL` (and docs/probe.md). Every launch gets exactly the
environment built here (nothing inherited from the caller): a dummy API key, the recorder's
session URL on 127.0.0.1, a scratch HOME, and every variable the client reads to turn off
telemetry, error reporting, auto-update, feature-flag fetches and other non-essential traffic.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from trace_tools.errors import UnknownName, UsageError

DUMMY_ANTHROPIC_KEY = "sk-ant-trace-tools-dummy-key-not-valid"
DUMMY_OPENAI_KEY = "sk-trace-tools-dummy-key-not-valid"
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"

# Claude Code 2.1.x: each of these is read by the client (checked in its bundle); together they
# switch off telemetry (Statsig/OTel), error reporting (Sentry), the auto-updater, GrowthBook
# feature flags, feedback surveys and the other non-essential requests.
CLAUDE_QUIET = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_UPDATES": "1",
    "DISABLE_GROWTHBOOK": "1",
    "CLAUDE_CODE_DISABLE_FEATURE_FLAGS": "1",
    "CLAUDE_CODE_ENABLE_TELEMETRY": "0",
    "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
    "DISABLE_BUG_COMMAND": "1",
    "DISABLE_FEEDBACK_COMMAND": "1",
    "DISABLE_COST_WARNINGS": "1",
    "DO_NOT_TRACK": "1",
}
# mini-swe-agent 2.x and litellm: no first-run wizard or banner, litellm's bundled cost map
# instead of fetching it, no cost lookups that would fail, no telemetry.
MINI_QUIET = {
    "MSWEA_CONFIGURED": "true",
    "MSWEA_SILENT_STARTUP": "1",
    "MSWEA_COST_TRACKING": "ignore_errors",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_TELEMETRY": "False",
    "HF_HUB_OFFLINE": "1",
    "DO_NOT_TRACK": "1",
}

PINNED = {"claude-code": "2.1.332", "mini-swe-agent": "2.4.6"}
INSTALL = {
    "claude-code": "npm install --prefix {dir}/claude-code-{version} @anthropic-ai/claude-code@{version}",
    "mini-swe-agent": "python3 -m venv {dir}/mini-swe-agent-{version} && "
    "{dir}/mini-swe-agent-{version}/bin/pip install mini-swe-agent=={version}",
}


@dataclass(frozen=True)
class Launch:
    """What one session needs to start the harness."""

    task: str
    base_url: str  # the recorder's session URL inside the sandbox
    home: Path
    cwd: Path


@dataclass(frozen=True)
class Harness:
    name: str
    protocol: str  # the API it speaks to the recorder
    executable: str  # path under the harness folder
    environment_variable: str  # overrides where the executable is
    command: Callable[[Path, Launch], list[str]]
    environment: Callable[[Launch], dict[str, str]]
    finish_command: str | None = None  # a shell command that ends the harness's loop, if text does not
    version_argv: Callable[[Path], list[str]] = lambda executable: [str(executable), "--version"]

    @property
    def pinned(self) -> str:
        return PINNED[self.name]

    def install_hint(self) -> str:
        return INSTALL[self.name].format(dir=harness_dir(), version=self.pinned)

    def locate(self) -> Path:
        """The executable, or a usage error (exit 2) that says how to install it."""
        override = os.environ.get(self.environment_variable)
        candidates = [Path(override)] if override else []
        candidates.append(harness_dir() / f"{self.name}-{self.pinned}" / self.executable)
        candidates += sorted(harness_dir().glob(f"{self.name}-*/{self.executable}"), reverse=True)
        found = next((path for path in candidates if path.is_file() and os.access(path, os.X_OK)), None)
        if found is None:
            raise HarnessNotInstalled(
                f"{self.name} is not installed; install it with: {self.install_hint()} "
                f"(or point {self.environment_variable} at its executable)"
            )
        return found

    def version_command(self, executable: Path) -> list[str]:
        return self.version_argv(executable)


class HarnessNotInstalled(UsageError):
    pass


def harness_dir() -> Path:
    if os.environ.get("TRACE_TOOLS_HARNESS_DIR"):
        return Path(os.environ["TRACE_TOOLS_HARNESS_DIR"])
    if os.getuid() == 0:
        return Path("/opt/trace-tools/harnesses")
    return Path.home() / ".cache" / "trace-tools" / "harnesses"


def _base(launch: Launch) -> dict[str, str]:
    return {
        "PATH": BASE_PATH,
        "HOME": str(launch.home),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "NO_PROXY": "*",
        "no_proxy": "*",
    }


def _claude_env(launch: Launch) -> dict[str, str]:
    return {
        **_base(launch),
        **CLAUDE_QUIET,
        "ANTHROPIC_BASE_URL": launch.base_url,
        "ANTHROPIC_API_KEY": DUMMY_ANTHROPIC_KEY,
        "CLAUDE_CONFIG_DIR": str(launch.home / ".claude"),
    }


def _claude_command(executable: Path, launch: Launch) -> list[str]:
    return [
        str(executable),
        "-p",
        launch.task,
        "--dangerously-skip-permissions",
        "--output-format",
        "json",
        "--no-session-persistence",
    ]


def _mini_env(launch: Launch) -> dict[str, str]:
    return {
        **_base(launch),
        **MINI_QUIET,
        "OPENAI_API_KEY": DUMMY_OPENAI_KEY,
        "MSWEA_GLOBAL_CONFIG_DIR": str(launch.home / ".config" / "mini-swe-agent"),
    }


def _mini_command(executable: Path, launch: Launch) -> list[str]:
    options = {
        "model.model_kwargs.api_base": launch.base_url + "/v1",
        "model.model_kwargs.api_key": DUMMY_OPENAI_KEY,
        "model.cost_tracking": "ignore_errors",
        "agent.step_limit": "30",
    }
    configs = [arg for key, value in options.items() for arg in ("-c", f"{key}={value}")]
    return [
        str(executable),
        "-y",
        "--exit-immediately",
        "-m",
        "openai/trace-tools-scripted",
        "-t",
        launch.task,
        "-c",
        "mini.yaml",
        *configs,
        "-o",
        str(launch.home / "trajectory.json"),
    ]


HARNESSES = {
    harness.name: harness
    for harness in (
        Harness(
            "claude-code", "anthropic", "node_modules/.bin/claude", "TRACE_TOOLS_CLAUDE", _claude_command, _claude_env
        ),
        Harness(
            "mini-swe-agent",
            "openai",
            "bin/mini",
            "TRACE_TOOLS_MINI_SWE_AGENT",
            _mini_command,
            _mini_env,
            finish_command="echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",
            version_argv=lambda executable: [
                str(executable.with_name("python")),
                "-c",
                "import importlib.metadata as m; print(m.version('mini-swe-agent'))",
            ],
        ),
    )
}


def get_harness(name: str) -> Harness:
    if name not in HARNESSES:
        raise UnknownName("harness", name, list(HARNESSES))
    return HARNESSES[name]
