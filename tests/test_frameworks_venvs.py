"""CrewAI and the Claude Agent SDK, each in a venv of its own (their pins conflict with the main
venv's, or their wheel carries a 400 MB CLI: tests/servers/framework_venvs.py builds them, once).

CrewAI builds its OpenAI client privately (no client argument) on classic httpx and openai 2.x:
the transport journal reaches it. The Claude Agent SDK runs the Claude Code CLI, a native
subprocess: it goes through the run's loopback journaling proxy (``ANTHROPIC_BASE_URL``).
"""

from __future__ import annotations

import pytest
from chain_helpers import kill_and_resume
from conftest import need
from servers.framework_venvs import framework_env, venv_python

pytestmark = pytest.mark.slow

CREWAI = '''
from crewai import LLM, Agent, Crew, Task
def step(i, prev):
    llm = LLM(model="openai/gpt-4o-mini", base_url=BASE + "/v1", api_key="x", stream=(i == 5))
    writer = Agent(role="Writer", goal="Answer in one line", backstory="A terse writer.", llm=llm, verbose=False)
    task = Task(description=f"step {i}: {prev}", expected_output="one line", agent=writer)
    if i == 5:
        chunk(i)  # the kill lands once the server is streaming this call's answer
    return str(Crew(agents=[writer], tasks=[task], verbose=False).kickoff())
'''

CLAUDE = '''
import asyncio
from claude_agent_sdk import AssistantMessage, ClaudeAgentOptions, TextBlock, query
from claude_agent_sdk.types import StreamEvent
CWD = os.environ["CLAUDE_CWD"]
def step(i, prev):
    base = caravanserai.current_run().proxy_url(BASE)
    options = ClaudeAgentOptions(tools=[], max_turns=1, cwd=CWD, include_partial_messages=True,
                                 env={"ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": "x"})
    async def ask():
        texts = []
        async for message in query(prompt=f"step {i}: {prev}", options=options):
            if isinstance(message, StreamEvent):
                chunk(i)
            elif isinstance(message, AssistantMessage):
                texts.extend(block.text for block in message.content if isinstance(block, TextBlock))
        return "".join(texts)
    return asyncio.run(ask())
'''




def _python(name: str) -> str:
    try:
        return str(venv_python(name))
    except Exception as exc:  # a venv that cannot be built here (no registry): the CI rule decides
        need(False, f"the {name} venv could not be built: {exc}")
        raise


def test_crewai_never_pays_twice(tmp_path, api):
    python = _python("crewai")
    facts = kill_and_resume(tmp_path, api, CREWAI, python=python, usage=False,
                            env={**framework_env("crewai"), "HOME": str(tmp_path)})
    assert {e["path"] for e in facts["events"] if e["type"] == "call_settled"} == {"POST /v1/chat/completions"}


def test_the_claude_agent_sdk_through_the_loopback_proxy_never_pays_twice(tmp_path, api):
    python = _python("claude")
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    work = tmp_path / "work"
    work.mkdir()
    env = {**framework_env("claude"), "HOME": str(home), "CLAUDE_CONFIG_DIR": str(home / ".claude"),
           "CLAUDE_CWD": str(work)}
    facts = kill_and_resume(tmp_path, api, CLAUDE, python=python, env=env)
    assert {e["path"] for e in facts["events"] if e["type"] == "call_settled"} == {"POST /v1/messages"}
