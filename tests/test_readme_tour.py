"""The README's commands and its Python block run verbatim, as a new user would after `pip install .`.

Three parts of the README are extracted and run, each in an empty scratch directory, through a
`trace-tools` and a `python` that cannot import torch or trl (a plain install), with
`COLUMNS=80` and output to a pipe:

- the tour (the ```bash block after `<!-- tour -->`), line by line with bash;
- "your own data first" (the blocks after `<!-- own-data -->`), with the two repository files it
  names linked in, as in a checkout;
- the Python block (after `<!-- python -->`), saved as `demo.py` and run with `python demo.py`,
  so it replays with worker processes exactly as a user's script does.

Each command must exit 0 (or N where its comment starts `# exit N:`), print no traceback and no
transformers advice, and keep every line of output within 80 columns. So the README and the
program cannot drift apart.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.cells import cell_len

EXPECTED_EXIT = re.compile(r"#\s*exit (\d):")  # a line's comment may announce another exit code

REPO = Path(__file__).parents[1]
README = (REPO / "README.md").read_text()
# Imported first by every Python process started with this directory on its path (`python
# demo.py`, the trace-tools shim and the workers they spawn): a plain install has neither.
SITECUSTOMIZE = 'import sys\nsys.modules.update({"torch": None, "trl": None})\n'
SHIM = """#!{python}
from trace_tools.cli.main import main
main()
"""


def blocks(marker: str, language: str = "bash", page: str = "README.md") -> list[str]:
    found = re.findall(rf"<!-- {marker} -->\n```{language}\n(.*?)```", (REPO / page).read_text(), re.S)
    assert found, f"{page} has no ```{language} block after <!-- {marker} -->"
    return found


def lines(marker: str) -> list[str]:
    return [line for block in blocks(marker) for line in block.splitlines() if line.strip()]


def plain_install(tmp_path: Path) -> dict[str, str]:
    """The environment of a plain install: `trace-tools` and `python` without torch or trl."""
    bin_dir, site = tmp_path / "bin", tmp_path / "site"
    bin_dir.mkdir()
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    shim = bin_dir / "trace-tools"
    shim.write_text(SHIM.format(python=sys.executable))
    shim.chmod(0o755)
    python = bin_dir / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    path = os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "80", "PYTHONPATH": path}
    env.pop("TRACE_TOOLS_DEBUG", None)
    return env


def run_verbatim(command: str, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True)
    output = done.stdout + done.stderr
    announced = EXPECTED_EXIT.search(command)
    assert done.returncode == (int(announced.group(1)) if announced else 0), f"{command}\n{output}"
    assert "Traceback" not in output and "PyTorch was not found" not in output, f"{command}\n{output}"
    wide = [text for text in output.splitlines() if cell_len(text.rstrip()) > 80]
    assert not wide, f"{command}: lines wider than 80 columns:\n" + "\n".join(wide)
    return output


def test_the_tour_creates_what_it_uses():
    tour = lines("tour")
    made = [n for n, line in enumerate(tour) if "--out dump.parquet" in line]
    used = [n for n, line in enumerate(tour) if "dump.parquet" in line and "--out dump.parquet" not in line]
    assert made and used and made[0] < min(used)
    rules = [n for n, line in enumerate(tour) if "> rules.toml" in line]
    gated = [n for n, line in enumerate(tour) if "--rules rules.toml" in line]
    assert rules and gated and rules[0] < gated[0], "the tour writes its rules file before gating"
    assert all(line.startswith("trace-tools ") for n, line in enumerate(tour) if n not in rules)


@pytest.mark.slow
def test_readme_tour_runs_verbatim_in_an_empty_directory(tmp_path):
    env, scratch = plain_install(tmp_path), tmp_path / "scratch"
    scratch.mkdir()
    for line in lines("tour"):
        run_verbatim(line, scratch, env)
    assert (scratch / "runs" / "r1" / "summary.json").is_file() and (scratch / "runs" / "r2" / "report.md").is_file()
    assert (scratch / "runs" / "r1" / "export" / "checkpoint-tree.jsonl").is_file()


@pytest.mark.slow
def test_readme_own_data_commands_run_verbatim(tmp_path):
    env, checkout = plain_install(tmp_path), tmp_path / "checkout"
    commands = lines("own-data")
    # the repository files they read; not what they write (`--out X`), which a checkout may hold
    # from an earlier run of these commands
    words = [word for line in commands for word in line.split()]
    written = {word for before, word in zip(words, words[1:]) if before == "--out"}
    named = sorted({word for word in words if (REPO / word).is_file() and word not in written})
    assert named, "the own-data commands name the repository files they read"
    for name in named:  # a checkout holds these; everything else the commands write themselves
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).symlink_to(REPO / name)
    for line in commands:
        run_verbatim(line, checkout, env)
    assert (checkout / "runs" / "imported" / "report.html").is_file() and (checkout / "ckpt.parquet").is_file()


@pytest.mark.slow
def test_readme_python_block_runs_as_a_script(tmp_path):
    """Saved as a file and run with `python demo.py`: no `__main__` guard, default workers."""
    (code,) = blocks("python", "python")
    output = run_script(code, tmp_path)
    # the script ran once: spawned workers did not start it again (each run would print this)
    assert output.count("first drift: turn") == 1, output


@pytest.mark.slow
def test_api_page_block_runs_as_a_script(tmp_path):
    (code,) = blocks("python", "python", page="docs/api.md")
    run_script(code, tmp_path)


def run_script(code: str, tmp_path: Path) -> str:
    env, scratch = plain_install(tmp_path), tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "demo.py").write_text(code)
    env.pop("TRACE_TOOLS_WORKERS", None)  # every core: the workers are spawned
    output = run_verbatim("python demo.py", scratch, env)
    assert (scratch / "runs" / "api" / "summary.json").is_file()
    return output


def test_api_functions_stay_callable_after_their_submodules_load(tmp_path):
    """`tt.replay` imports `trace_tools.replay` (and so on): a second call still finds the function."""
    import trace_tools as tt

    dump = tmp_path / "dump.parquet"
    for _ in range(2):
        tt.simulate(sessions=1, seed=3, out=str(dump), max_turns=3)
        tt.reconstruct(dump)
    for n in range(2):
        assert tt.replay(dump, out=tmp_path / f"run{n}", strategies=["tree"], workers=1).run_dir.is_dir()
