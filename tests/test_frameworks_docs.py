"""Every recipe of docs/frameworks.md runs as printed, twice, against the counting server: the
first run pays, the second is answered from the journal (same output, nothing sent).

A block starting ``# venv: NAME`` runs in that framework's own venv (tests/servers/framework_venvs.py).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO, need
from servers.framework_venvs import framework_env, venv_python
from test_docs import blocks

PAGE = REPO / "docs" / "frameworks.md"
RECIPES = blocks(PAGE)


def test_the_page_has_a_recipe_per_framework():
    text = PAGE.read_text(encoding="utf-8")
    for framework in ("openai", "anthropic", "LangChain", "LangGraph", "pydantic-ai", "OpenAI Agents SDK", "litellm",
                      "smolagents", "CrewAI", "dspy", "Claude Agent SDK"):
        assert f"\n## {framework}\n" in text, framework
    assert len(RECIPES) == 11


@pytest.mark.slow
@pytest.mark.parametrize("line,source", RECIPES, ids=[f"frameworks.md:{line}" for line, _ in RECIPES])
def test_recipe_runs_and_a_rerun_sends_nothing(tmp_path, api, line, source):
    python = sys.executable
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARAVANSERAI_")}
    first_line = source.splitlines()[0]
    if first_line.startswith("# venv: "):
        name = first_line.removeprefix("# venv: ").strip()
        try:
            python = str(venv_python(name))
        except Exception as exc:
            need(False, f"the {name} venv could not be built: {exc}")
        env.update(framework_env(name), HOME=str(tmp_path), CLAUDE_CONFIG_DIR=str(tmp_path / ".claude"))
        (tmp_path / ".claude").mkdir()
    env.update(OPENAI_BASE_URL=api.url + "/v1", OPENAI_API_KEY="local", ANTHROPIC_BASE_URL=api.url,
               ANTHROPIC_API_KEY="local", LITELLM_LOCAL_MODEL_COST_MAP="True", PYTHONPATH=str(REPO))

    def run() -> str:
        proc = subprocess.run([python, "-c", source], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return proc.stdout

    first = run()
    paid = api.count()
    assert paid >= 1 and first.strip()
    assert run() == first and api.count() == paid  # the journal answered: nothing sent again
