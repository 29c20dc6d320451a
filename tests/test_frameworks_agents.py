"""pydantic-ai and the OpenAI Agents SDK inside durable(): six chained agent runs, SIGKILLed between
runs and in the middle of a streamed one, then re-run.

Both pass openai's ``omit`` sentinel for every unset setting (it has no stable repr: a digest over
``repr`` never matched on resume); the transport journal keys the JSON body actually sent.
"""

from __future__ import annotations

import pytest
from chain_helpers import kill_and_resume
from conftest import need_module

pytestmark = pytest.mark.slow

PYDANTIC_AI = '''
import asyncio
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider
provider = OpenAIProvider(base_url=BASE + "/v1", api_key="x")
chat = Agent(OpenAIChatModel("gpt-4o-mini", provider=provider), instructions="Answer briefly.")
responses = Agent(OpenAIResponsesModel("gpt-4o-mini", provider=provider), instructions="Answer briefly.")
def step(i, prev):
    question = f"step {i}: {prev}"
    if i == 5:
        async def streamed():
            out = []
            async with chat.run_stream(question) as result:
                async for text in result.stream_text(delta=True):
                    chunk(i)
                    out.append(text)
            return "".join(out)
        return asyncio.run(streamed())
    return (responses if i % 2 == 0 else chat).run_sync(question).output
'''

AGENTS_SDK = '''
import asyncio
from openai import AsyncOpenAI
from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, set_tracing_disabled
set_tracing_disabled(True)
def agents():
    client = AsyncOpenAI(base_url=BASE + "/v1", api_key="x", max_retries=0)
    return (Agent(name="chat", instructions="Answer briefly.",
                  model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client)),
            Agent(name="responses", instructions="Answer briefly.",
                  model=OpenAIResponsesModel(model="gpt-4o-mini", openai_client=client)))
def step(i, prev):
    question = f"step {i}: {prev}"
    chat, responses = agents()
    if i == 5:
        async def streamed():
            result = Runner.run_streamed(responses, question)
            async for event in result.stream_events():
                if event.type == "raw_response_event":
                    chunk(i)
            return result.final_output
        return asyncio.run(streamed())
    return Runner.run_sync(chat if i % 2 else responses, question).final_output
'''




def test_pydantic_ai_agents_never_pay_twice(tmp_path, api):
    need_module("pydantic_ai")
    facts = kill_and_resume(tmp_path, api, PYDANTIC_AI)
    paths = {e["path"] for e in facts["events"] if e["type"] == "call_settled"}
    assert paths == {"POST /v1/chat/completions", "POST /v1/responses"}


def test_openai_agents_sdk_never_pays_twice(tmp_path, api):
    need_module("agents")
    facts = kill_and_resume(tmp_path, api, AGENTS_SDK)
    paths = {e["path"] for e in facts["events"] if e["type"] == "call_settled"}
    assert paths == {"POST /v1/chat/completions", "POST /v1/responses"}
