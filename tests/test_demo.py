"""`make demo`, the README's first command: the transcript it promises and nothing else.

The Makefile's demo target runs ``tools/demo_transcript.py``, which interrupts ``demo.py`` (SIGINT, as
Ctrl-C) when it prints its step-3 line, runs it again (it resumes at step 4) and shows the waypoint.
Here it runs through ``make`` itself, with the test venv standing in for ``.venv`` (``-o`` keeps make
from reinstalling it), and once more with every Python process made slow to start, which is what
put the old timer (``timeout 3.6``) in the wrong step on a loaded machine. The setup's ``pip`` prints
no build banners: the widgets' static files are declared as package data, and pip runs with -qq.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, need

TRANSCRIPT = """\
$ python demo.py
[1/5] doing work...
[2/5] doing work...
[3/5] doing work...
^C
crashed/killed mid-task. run me again - I'll resume, not restart.

$ python demo.py
[4/5] doing work...
[5/5] doing work...
done.

$ caravanserai show demo
waypoint 5

finished step 5/5

state: {"step": 5}
"""


def make_demo(project: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    venv = Path(PYTHON).parent.parent
    return subprocess.run(["make", "--no-print-directory", "-o", f"{venv}/bin/.installed", "demo", f"VENV={venv}"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    need(shutil.which("make") is not None, "make is not installed")
    for name in ("Makefile", "demo.py", "tools/demo_transcript.py"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    return tmp_path


def demo_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CARAVANSERAI_", "MAKE"))}
    env.update({"PYTHONPATH": str(REPO), "PYTHONUTF8": "1", **extra})
    return env


def test_make_demo_prints_the_transcript_and_nothing_else(project):
    done = make_demo(project, demo_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == TRANSCRIPT and done.stderr == ""  # no "Error 1 (ignored)", no "Error 124 (ignored)"
    again = make_demo(project, demo_env())  # a second `make demo` starts over (the old run is deleted)
    assert again.returncode == 0 and again.stdout == TRANSCRIPT and again.stderr == ""


def test_make_demo_interrupts_after_step_3_however_slowly_python_starts(project):
    slow = project / "slow-start"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text("import time\ntime.sleep(2.5)  # every Python process starts 2.5 s late\n")
    done = make_demo(project, demo_env(PYTHONPATH=f"{slow}{os.pathsep}{REPO}"))
    assert done.returncode == 0 and done.stdout == TRANSCRIPT and done.stderr == "", done.stdout + done.stderr


def test_the_setup_installs_quietly_and_declares_the_static_files(tmp_path):
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    installs = re.findall(r"^\t\$\(BIN\)/pip install .*$", makefile, re.M)
    assert installs and all(" -qq " in line for line in installs), installs
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path), str(REPO)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    assert "absent from the `packages` configuration" not in build.stdout + build.stderr
    quiet = subprocess.run([sys.executable, "-m", "pip", "wheel", "-qq", "--no-deps", "-w", str(tmp_path / "q"), str(REPO)],
                           capture_output=True, text=True, timeout=600)
    assert quiet.returncode == 0 and quiet.stdout + quiet.stderr == "", quiet.stdout + quiet.stderr
