"""Child for tests/test_real_model.py: one durable agent run against a real OpenAI-compatible server.

    python real_agent.py BASE_URL MODEL STORE RUN_ID
Prints the result text and receipt as JSON.
"""

import json
import sys

from caravanserai import OpenAICompatibleModel, agent, run

base_url, model_name, store, run_id = sys.argv[1:5]
model = OpenAICompatibleModel(base_url, model_name, default_params={"max_tokens": 40, "temperature": 0})
support = agent(id="support", instructions="You answer in one short sentence.", model=model)
result = run(support, "What is the capital of France?", durable={"run_id": run_id, "store": store})
print(json.dumps({"text": result.text, "receipt": result.receipt.to_dict(), "replayed": result.replayed}))
