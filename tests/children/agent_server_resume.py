"""Child for tests/test_durable_agent_server.py: resume a DurableAgent checkpoint in a fresh process.

    VLLM_BASE_URL=... python agent_server_resume.py CHECKPOINT_FILE
Prints JSON: backend, step outputs, the steps this process computed, tokens_saved.
"""

import json
import sys
from pathlib import Path

from caravanserai.durable_agent import DurableAgent

ckpt = Path(sys.argv[1]).read_bytes()
agent = DurableAgent()
outputs = agent.resume_from(ckpt)
print(json.dumps({"backend": agent.backend, "outputs": outputs, "computed_steps": agent.computed_steps,
                  "tokens_saved": agent.tokens_saved}))
