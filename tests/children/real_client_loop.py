"""Child for tests/test_real_model.py: a plain loop using the real `openai` client, made durable.

    python real_client_loop.py BASE_URL MODEL STORE RUN_ID
Each step asks chat.completions and completions once, then checkpoints; prints the outputs.
"""

import json
import sys

import openai

import caravanserai

base_url, model_name, store, run_id = sys.argv[1:5]
client = caravanserai.durable_client(openai.OpenAI(base_url=base_url, api_key="local", max_retries=0))
TOPICS = ["rivers", "mountains", "deserts", "forests"]

with caravanserai.durable(run_id, store=store) as run:
    state = run.state or {"done": 0, "outputs": []}
    for i in range(state["done"], len(TOPICS)):
        chat = client.chat.completions.create(
            model=model_name, temperature=0, max_tokens=24,
            messages=[{"role": "user", "content": f"Name one fact about {TOPICS[i]}."}])
        text = client.completions.create(model=model_name, prompt=f"A short poem about {TOPICS[i]}:",
                                         temperature=0, max_tokens=12)
        state["outputs"].append([chat.choices[0].message.content, text.choices[0].text])
        state["done"] = i + 1
        run.checkpoint(state, f"step {i + 1}: {TOPICS[i]}")
        print(f"step {i + 1}", flush=True)
print(json.dumps(state["outputs"]))
