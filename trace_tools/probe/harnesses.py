"""The real harnesses `probe` can drive: one record each (`HARNESSES`), everything else derives from it.

A record says which version is pinned and how to install it, the API it speaks to the recorder,
where its executable is, how it is launched and the environment it runs with. `probe`, its
`--help`, docs/probe.md's install table (`scripts/gen_docs.py`) and `.ci/run` read the records;
tests/test_records.py checks the help and the docs against them. Adding a harness is one record
here (docs/development.md, "Add a harness").

Harnesses live outside the repository, in `$TRACE_TOOLS_HARNESS_DIR` (default
`/opt/trace-tools/harnesses` as root, where the unprivileged user the harness runs as can read
it, else `~/.cache/trace-tools/harnesses`), one folder per harness and pinned version. Every
launch gets exactly the environment built here (nothing inherited from the caller): a dummy API
key, the recorder's session URL on 127.0.0.1, a scratch HOME, and every variable the client
reads to turn off telemetry, error reporting, auto-update, feature-flag fetches and other
non-essential traffic.

The module imports nothing outside the standard library and `trace_tools.errors`, so `.ci/run`
reads a record with the system `python3` before any virtual environment exists:
`PYTHONPATH=. python3 -P -S trace_tools/probe/harnesses.py claude-code version` (also `install`,
`executable`, `dir`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trace_tools.errors import UnknownName, UsageError

DUMMY_ANTHROPIC_KEY = "sk-ant-trace-tools-dummy-key-not-valid"
DUMMY_OPENAI_KEY = "sk-trace-tools-dummy-key-not-valid"
DUMMY_GEMINI_KEY = "trace-tools-dummy-key-not-valid"
SCRIPTED_MODEL = "trace-tools-scripted"
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"
ROOT_HARNESS_DIR = Path("/opt/trace-tools/harnesses")


@dataclass(frozen=True)
class Launch:
    """What one session needs to start the harness."""

    task: str
    base_url: str  # the recorder's session URL inside the sandbox
    home: Path
    cwd: Path


def _version_flag(executable: Path) -> list[str]:
    return [str(executable), "--version"]


def _no_files(launch: Launch) -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class Harness:
    """One harness: its pin, installation, protocol, launch and environment."""

    name: str
    version: str  # the pinned version: what `install` installs, `locate` prefers and the docs name
    install: str  # shell command; `{dir}` is the harness folder, `{version}` the pin
    protocol: str  # the API it speaks to the recorder: anthropic | openai | openai-responses | gemini
    speaks: str  # the same, for people (docs/probe.md)
    executable: str  # path under its install folder
    executable_variable: str  # an environment variable naming the executable, for an install elsewhere
    quiet: Mapping[str, str]  # the client's own switches for telemetry, updates and other traffic
    credentials: Callable[[Launch], dict[str, str]]  # dummy key, recorder URL, config folder
    command: Callable[[Path, Launch], list[str]]  # argv of one non-interactive session
    finish_command: str | None = None  # a shell command that ends the harness's loop, if text does not
    version_command: Callable[[Path], list[str]] = field(default=_version_flag)
    # settings files the client reads only from disk (path under the scratch HOME → text): the
    # quiet switches that have no environment variable, written before each launch
    config_files: Callable[[Launch], dict[str, str]] = field(default=_no_files)
    # environment overlays the sessions cycle through (session i gets variants[i % n]): client
    # settings that change what it sends, each measured (Claude Code's attribution header on/off)
    variants: tuple[Mapping[str, str], ...] = ({},)

    def install_command(self, folder: Path | None = None) -> str:
        return self.install.format(dir=folder or harness_dir(), version=self.version)

    def pinned_executable(self) -> Path:
        return harness_dir() / f"{self.name}-{self.version}" / self.executable

    def variant(self, session: int) -> Mapping[str, str]:
        return self.variants[session % len(self.variants)]

    def environment(self, launch: Launch) -> dict[str, str]:
        """Exactly what the harness process gets: nothing is inherited from the caller."""
        return {**_base(launch), **self.quiet, **self.credentials(launch)}

    def locate(self) -> Path:
        """The executable, or a usage error (exit 2) that says how to install it."""
        override = os.environ.get(self.executable_variable)
        candidates = [Path(override)] if override else []
        candidates.append(self.pinned_executable())
        candidates += sorted(harness_dir().glob(f"{self.name}-*/{self.executable}"), reverse=True)
        found = next((path for path in candidates if path.is_file() and os.access(path, os.X_OK)), None)
        if found is None:
            raise HarnessNotInstalled(
                f"{self.name} is not installed; install it with: {self.install_command()} "
                f"(or point {self.executable_variable} at its executable)"
            )
        return found


class HarnessNotInstalled(UsageError):
    pass


def harness_dir() -> Path:
    if os.environ.get("TRACE_TOOLS_HARNESS_DIR"):
        return Path(os.environ["TRACE_TOOLS_HARNESS_DIR"])
    if os.getuid() == 0:
        return ROOT_HARNESS_DIR
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


# -- Claude Code ------------------------------------------------------------------------------------


def _claude_credentials(launch: Launch) -> dict[str, str]:
    return {
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


CLAUDE_CODE = Harness(
    name="claude-code",
    version="2.1.332",
    install="npm install --prefix {dir}/claude-code-{version} @anthropic-ai/claude-code@{version}",
    protocol="anthropic",
    speaks="Anthropic Messages",
    executable="node_modules/.bin/claude",
    executable_variable="TRACE_TOOLS_CLAUDE",
    # Claude Code 2.1.x: each of these is read by the client (checked in its bundle); together they
    # switch off telemetry (Statsig/OTel), error reporting (Sentry), the auto-updater, GrowthBook
    # feature flags, feedback surveys and the other non-essential requests.
    quiet={
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
    },
    credentials=_claude_credentials,
    command=_claude_command,
    # 2.1.36 and later write a per-request `x-anthropic-billing-header: ...; cch=...` line first in
    # the system prompt unless CLAUDE_CODE_ATTRIBUTION_HEADER=0: sessions alternate both settings
    variants=({}, {"CLAUDE_CODE_ATTRIBUTION_HEADER": "0"}),
)


# -- mini-swe-agent ---------------------------------------------------------------------------------


def _mini_credentials(launch: Launch) -> dict[str, str]:
    return {
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


def _mini_version(executable: Path) -> list[str]:
    """The package's version from the venv's own interpreter (`mini` has no `--version`)."""
    return [
        str(executable.with_name("python")),
        "-c",
        "import importlib.metadata as m; print(m.version('mini-swe-agent'))",
    ]


MINI_SWE_AGENT = Harness(
    name="mini-swe-agent",
    version="2.4.6",
    # The system interpreter, not whichever python3 is first on PATH: a venv links back to its base
    # interpreter, and one under a private home (pyenv in /root) cannot run as the unprivileged
    # user the harness runs as.
    install="/usr/bin/python3 -m venv {dir}/mini-swe-agent-{version} && "
    "{dir}/mini-swe-agent-{version}/bin/pip install mini-swe-agent=={version}",
    protocol="openai",
    speaks="OpenAI Chat Completions (litellm)",
    executable="bin/mini",
    executable_variable="TRACE_TOOLS_MINI_SWE_AGENT",
    # mini-swe-agent 2.x and litellm: no first-run wizard or banner, litellm's bundled cost map
    # instead of fetching it, no cost lookups that would fail, no telemetry.
    quiet={
        "MSWEA_CONFIGURED": "true",
        "MSWEA_SILENT_STARTUP": "1",
        "MSWEA_COST_TRACKING": "ignore_errors",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "HF_HUB_OFFLINE": "1",
        "DO_NOT_TRACK": "1",
    },
    credentials=_mini_credentials,
    command=_mini_command,
    finish_command="echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",
    version_command=_mini_version,
)


# -- Qwen Code --------------------------------------------------------------------------------------


def _qwen_credentials(launch: Launch) -> dict[str, str]:
    return {
        "OPENAI_BASE_URL": launch.base_url + "/v1",
        "OPENAI_API_KEY": DUMMY_OPENAI_KEY,
        "OPENAI_MODEL": SCRIPTED_MODEL,
        "QWEN_HOME": str(launch.home / ".qwen"),
    }


def _qwen_command(executable: Path, launch: Launch) -> list[str]:
    return [
        str(executable),
        "--auth-type",
        "openai",
        "--model",
        SCRIPTED_MODEL,
        "--yolo",
        "--output-format",
        "json",
        "--chat-recording",
        "false",
        launch.task,
    ]


QWEN_CODE = Harness(
    name="qwen-code",
    version="0.24.4",
    install="npm install --prefix {dir}/qwen-code-{version} @qwen-code/qwen-code@{version}",
    protocol="openai",
    speaks="OpenAI Chat Completions",
    executable="node_modules/.bin/qwen",
    executable_variable="TRACE_TOOLS_QWEN_CODE",
    # Qwen Code 0.24.x, each read in its bundle (chunks/*.js): usage statistics and OpenTelemetry
    # off (`parseBooleanEnvFlag`: "false" is off), the post-start update check skipped, the API
    # preconnect and the session-title side request off.
    quiet={
        "QWEN_USAGE_STATISTICS_ENABLED": "false",
        "QWEN_TELEMETRY_ENABLED": "false",
        "QWEN_CODE_SKIP_UPDATE_CHECK_ONCE": "true",
        "QWEN_CODE_DISABLE_PRECONNECT": "1",
        "QWEN_DISABLE_AUTO_TITLE": "1",
    },
    credentials=_qwen_credentials,
    command=_qwen_command,
)


# -- Codex CLI ---------------------------------------------------------------------------------------


def _codex_credentials(launch: Launch) -> dict[str, str]:
    return {"OPENAI_API_KEY": DUMMY_OPENAI_KEY, "CODEX_HOME": str(launch.home / ".codex")}


def _codex_command(executable: Path, launch: Launch) -> list[str]:
    # A provider of our own: plain HTTP streaming to `/v1/responses` (Codex opens a WebSocket only
    # for providers that declare `supports_websockets`), the dummy key read from OPENAI_API_KEY.
    provider = (
        f'{{name="trace-tools", base_url="{launch.base_url}/v1", env_key="OPENAI_API_KEY", wire_api="responses"}}'
    )
    return [
        str(executable),
        "exec",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "--json",
        "-c",
        "model_provider=tracetools",
        "-c",
        f"model_providers.tracetools={provider}",
        "-m",
        SCRIPTED_MODEL,
        launch.task,
    ]


def _codex_files(launch: Launch) -> dict[str, str]:
    # Codex 0.171 reads these only from config.toml (each key checked in the binary's strings):
    # no analytics, no OpenTelemetry exporter, no update check, no feedback uploads.
    return {
        ".codex/config.toml": "check_for_update_on_startup = false\n\n"
        '[analytics]\nenabled = false\n\n[feedback]\nenabled = false\n\n[otel]\nexporter = "none"\n'
    }


CODEX = Harness(
    name="codex",
    version="0.171.0",
    install="npm install --prefix {dir}/codex-{version} @openai/codex@{version}",
    protocol="openai-responses",
    speaks="OpenAI Responses (HTTP + SSE)",
    executable="node_modules/.bin/codex",
    executable_variable="TRACE_TOOLS_CODEX",
    quiet={},  # every switch Codex has for its traffic is a config.toml key (`config_files`)
    credentials=_codex_credentials,
    command=_codex_command,
    config_files=_codex_files,
)


# -- Gemini CLI --------------------------------------------------------------------------------------


def _gemini_credentials(launch: Launch) -> dict[str, str]:
    return {"GEMINI_API_KEY": DUMMY_GEMINI_KEY, "GOOGLE_GEMINI_BASE_URL": launch.base_url}


def _gemini_command(executable: Path, launch: Launch) -> list[str]:
    return [
        str(executable),
        "--yolo",
        "--skip-trust",
        "--output-format",
        "json",
        "-m",
        SCRIPTED_MODEL,
        "-p",
        launch.task,
    ]


def _gemini_files(launch: Launch) -> dict[str, str]:
    # Gemini CLI 0.61 reads usage statistics (Clearcut) and the auto-update switches only from
    # settings.json (checked in its bundle); the API-key auth is chosen there too, so no login prompt.
    settings = (
        '{"privacy": {"usageStatisticsEnabled": false}, '
        '"general": {"enableAutoUpdate": false, "enableAutoUpdateNotification": false}, '
        '"telemetry": {"enabled": false}, "security": {"auth": {"selectedType": "gemini-api-key"}}}\n'
    )
    return {".gemini/settings.json": settings}


GEMINI_CLI = Harness(
    name="gemini-cli",
    version="0.61.0",
    install="npm install --prefix {dir}/gemini-cli-{version} @google/gemini-cli@{version}",
    protocol="gemini",
    speaks="Google Gemini API (streamGenerateContent, SSE)",
    executable="node_modules/.bin/gemini",
    executable_variable="TRACE_TOOLS_GEMINI_CLI",
    # telemetry off (the environment overrides settings.json); no relaunch into a second node process
    quiet={"GEMINI_TELEMETRY_ENABLED": "false", "GEMINI_CLI_NO_RELAUNCH": "true"},
    credentials=_gemini_credentials,
    command=_gemini_command,
    config_files=_gemini_files,
)


# -- opencode ----------------------------------------------------------------------------------------


def _opencode_credentials(launch: Launch) -> dict[str, str]:
    # The provider is bundled (`@ai-sdk/openai-compatible`): nothing is fetched to use it.
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "trace-tools",
        "options": {"baseURL": launch.base_url + "/v1", "apiKey": DUMMY_OPENAI_KEY},
        "models": {SCRIPTED_MODEL: {"name": SCRIPTED_MODEL}},
    }
    config = {"autoupdate": False, "share": "disabled", "provider": {"tracetools": provider}}
    return {"OPENCODE_CONFIG_CONTENT": json.dumps({**config, "model": f"tracetools/{SCRIPTED_MODEL}"})}


def _opencode_command(executable: Path, launch: Launch) -> list[str]:
    return [str(executable), "run", "--auto", "--format", "json", launch.task]


OPENCODE = Harness(
    name="opencode",
    version="1.18.33",
    install="npm install --prefix {dir}/opencode-{version} opencode-ai@{version}",
    protocol="openai",
    speaks="OpenAI Chat Completions (AI SDK)",
    executable="node_modules/.bin/opencode",
    executable_variable="TRACE_TOOLS_OPENCODE",
    # opencode 1.18: each read in its binary; no models.dev catalogue fetch, no updates, no
    # sharing, no LSP server downloads, no default plugins (which install from npm).
    quiet={
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    },
    credentials=_opencode_credentials,
    command=_opencode_command,
)


HARNESSES = {harness.name: harness for harness in (CLAUDE_CODE, MINI_SWE_AGENT, QWEN_CODE, CODEX, GEMINI_CLI, OPENCODE)}


def get_harness(name: str) -> Harness:
    if name not in HARNESSES:
        raise UnknownName("harness", name, list(HARNESSES))
    return HARNESSES[name]


def describe(name: str, what: str) -> str:
    """One fact of a record as `.ci/run` reads it: version, install, executable (the pinned one) or dir."""
    harness = get_harness(name)
    facts = {
        "version": harness.version,
        "install": harness.install_command(),
        "executable": str(harness.pinned_executable()),
        "dir": str(harness_dir()),
    }
    if what not in facts:
        raise UnknownName("harness fact", what, list(facts))
    return facts[what]


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python3 trace_tools/probe/harnesses.py HARNESS {version|install|executable|dir}")
    try:
        print(describe(sys.argv[1], sys.argv[2]))
    except UsageError as error:
        sys.exit(str(error))
