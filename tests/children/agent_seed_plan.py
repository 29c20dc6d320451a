# Child for tests/test_durable_agent.py: the seed's "Across processes" plan.py, VERBATIM
# (only `continuum` -> `caravanserai`); the test checks this text against the seed.
# --- verbatim ---
# plan.py : a small box runs the cheap steps, then parks the job
from pathlib import Path
from caravanserai import DurableAgent

agent = DurableAgent()
agent.begin(["pull the ticket", "reproduce the bug", "draft a fix", "open the PR"])
Path("job.ckpt").write_bytes(agent.run_until_step(1))
