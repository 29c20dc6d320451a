"""LangChain and LangGraph inside durable(): six chained calls, SIGKILLed between calls and mid-stream.

``ChatOpenAI.invoke`` goes through ``with_raw_response.create``, ``.stream`` through
``create(stream=True)``, ``use_responses_api=True`` through ``responses.create``; a LangGraph graph
whose nodes call the model, streamed with ``stream_mode="messages"``. Nothing wraps the model:
the transport journal reaches the client LangChain builds itself.
"""

from __future__ import annotations

import pytest
from chain_helpers import kill_and_resume
from conftest import need_module

need_module("langchain_openai", whole_module=True)
need_module("langgraph", whole_module=True)

pytestmark = pytest.mark.slow

LANGCHAIN = '''
from langchain_openai import ChatOpenAI
llm = ChatOpenAI(model="gpt-4o-mini", base_url=BASE + "/v1", api_key="x", max_retries=0,
                 stream_usage=True)
responses = ChatOpenAI(model="gpt-4o-mini", base_url=BASE + "/v1", api_key="x", max_retries=0, use_responses_api=True)
def step(i, prev):
    question = f"step {i}: {prev}"
    if i in (2, 5):
        out = []
        for piece in llm.stream(question):
            chunk(i)
            out.append(piece.content)
        return "".join(out)
    if i == 3:
        return responses.invoke(question).text
    return llm.invoke(question).content
'''

LANGGRAPH = '''
from typing import TypedDict
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
llm = ChatOpenAI(model="gpt-4o-mini", base_url=BASE + "/v1", api_key="x", max_retries=0, stream_usage=True)
class State(TypedDict):
    question: str
    answer: str
def think(state: State) -> dict:
    return {"answer": llm.invoke(state["question"]).content}
builder = StateGraph(State)
builder.add_node("think", think)
builder.add_edge(START, "think")
builder.add_edge("think", END)
graph = builder.compile()
def step(i, prev):
    question = {"question": f"step {i}: {prev}", "answer": ""}
    if i == 5:
        out = []
        for message, meta in graph.stream(question, stream_mode="messages"):
            chunk(i)
            out.append(message.content)
        return "".join(out)
    return graph.invoke(question)["answer"]
'''




def test_langchain_chat_openai_never_pays_twice(tmp_path, api):
    facts = kill_and_resume(tmp_path, api, LANGCHAIN)
    paths = {e["path"] for e in facts["events"] if e["type"] == "call_settled"}
    assert paths == {"POST /v1/chat/completions", "POST /v1/responses"}


def test_a_langgraph_graph_never_pays_twice(tmp_path, api):
    kill_and_resume(tmp_path, api, LANGGRAPH)
