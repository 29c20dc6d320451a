"""litellm, smolagents and dspy inside durable(): six chained calls, SIGKILLed between calls and
mid-stream (or, for dspy, which does not stream, while a call is in flight), then re-run.

litellm posts with the openai client's low-level ``.post`` (with or without ``client=``), on
classic httpx; smolagents calls ``chat.completions.create``; dspy speaks HTTP over its own sockets,
so it is pointed at the run's loopback journaling proxy (``run.proxy_url``).
"""

from __future__ import annotations

import pytest
from chain_helpers import kill_and_resume
from conftest import need_module

pytestmark = pytest.mark.slow

LITELLM = '''
import litellm, openai
def step(i, prev):
    messages = [{"role": "user", "content": f"step {i}: {prev}"}]
    common = dict(model="openai/gpt-4o-mini", messages=messages)
    if i in (2, 5):
        out = []
        for piece in litellm.completion(**common, api_base=BASE + "/v1", api_key="x", stream=True,
                                        stream_options={"include_usage": True}):
            chunk(i)
            if piece.choices:
                out.append(piece.choices[0].delta.content or "")
        return "".join(out)
    if i == 3:  # a client of your own
        client = openai.OpenAI(base_url=BASE + "/v1", api_key="x", max_retries=0)
        return litellm.completion(**common, client=client).choices[0].message.content
    return litellm.completion(**common, api_base=BASE + "/v1", api_key="x").choices[0].message.content
'''

SMOLAGENTS = '''
from smolagents import OpenAIServerModel
model = OpenAIServerModel(model_id="gpt-4o-mini", api_base=BASE + "/v1", api_key="x")
def step(i, prev):
    messages = [{"role": "user", "content": [{"type": "text", "text": f"step {i}: {prev}"}]}]
    if i == 5:
        out = []
        for delta in model.generate_stream(messages):
            chunk(i)
            out.append(delta.content or "")
        return "".join(out)
    return model.generate(messages).content
'''

DSPY = '''
import dspy
def step(i, prev):
    lm = dspy.LM("openai/gpt-4o-mini", api_base=caravanserai.current_run().proxy_url(BASE + "/v1"), api_key="x",
                 cache=False)
    if i == 5:
        chunk(i)  # dspy does not stream: the kill lands while this call is at the server
    return lm(f"step {i}: {prev}")[0]
'''




def test_litellm_never_pays_twice(tmp_path, api):
    need_module("litellm")
    kill_and_resume(tmp_path, api, LITELLM, env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"})


def test_smolagents_never_pays_twice(tmp_path, api):
    need_module("smolagents")
    kill_and_resume(tmp_path, api, SMOLAGENTS, usage=False)


def test_dspy_through_the_loopback_proxy_never_pays_twice(tmp_path, api):
    need_module("dspy")
    kill_and_resume(tmp_path, api, DSPY, streams=False, env={"DSPY_CACHEDIR": str(tmp_path / "dspy-cache")})
