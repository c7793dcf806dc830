"""The README tour runs verbatim, as a new user would after a plain `pip install .`.

The block after `<!-- tour -->` is run line by line with bash in a scratch directory (the
repository's `docs/` linked in, as in a checkout), through a `trace-tools` on PATH that cannot
import torch or trl, with `COLUMNS=80` and output to a pipe. Each line must exit 0 (or N where
its comment starts `# exit N:`), print no traceback and no transformers advice, and keep every line
of output within 80 columns. So the README and the program cannot drift apart.
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
TOUR = re.search(r"<!-- tour -->\n```bash\n(.*?)```", README, re.S)
TOUR_PYTHON = re.search(r"<!-- tour-python -->\n```python\n(.*?)```", README, re.S)
SHIM = """#!{python}
import sys
sys.modules.update({{"torch": None, "trl": None}})  # a plain install: neither is there
from trace_tools.cli.main import main
main()
"""


def tour_lines() -> list[str]:
    assert TOUR, "README.md has no ```bash block after <!-- tour -->"
    return [line for line in TOUR.group(1).splitlines() if line.strip()]


def test_the_tour_creates_what_it_uses():
    lines = tour_lines()
    made = [n for n, line in enumerate(lines) if "--out dump.parquet" in line]
    used = [n for n, line in enumerate(lines) if "dump.parquet" in line and "--out dump.parquet" not in line]
    assert made and used and made[0] < min(used)
    assert all(line.startswith("trace-tools ") for line in lines)


@pytest.mark.slow
def test_readme_tour_runs_verbatim_without_torch_or_trl(tmp_path):
    bin_dir, scratch = tmp_path / "bin", tmp_path / "scratch"
    bin_dir.mkdir()
    scratch.mkdir()
    (scratch / "docs").symlink_to(REPO / "docs")
    shim = bin_dir / "trace-tools"
    shim.write_text(SHIM.format(python=sys.executable))
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "80",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("TRACE_TOOLS_DEBUG", None)
    for line in tour_lines():
        done = subprocess.run(["bash", "-c", line], cwd=scratch, env=env, capture_output=True, text=True)
        output = done.stdout + done.stderr
        announced = EXPECTED_EXIT.search(line)
        assert done.returncode == (int(announced.group(1)) if announced else 0), f"{line}\n{output}"
        assert "Traceback" not in output and "PyTorch was not found" not in output, f"{line}\n{output}"
        wide = [text for text in output.splitlines() if cell_len(text.rstrip()) > 80]
        assert not wide, f"{line}: lines wider than 80 columns:\n" + "\n".join(wide)
    assert (scratch / "runs" / "r1" / "summary.json").is_file() and (scratch / "runs" / "r2" / "report.md").is_file()
    code = 'import sys; sys.modules.update({"torch": None, "trl": None})\n' + TOUR_PYTHON.group(1)
    done = subprocess.run([sys.executable, "-c", code], cwd=scratch, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (scratch / "runs" / "api" / "summary.json").is_file()
