# Child for tests/test_durable_agent.py: the seed's "Checkpoint and resume" sample, VERBATIM
# (only `continuum` -> `caravanserai`); the test checks this text against the seed and appends its checks.
# --- verbatim ---
from caravanserai import DurableAgent

agent = DurableAgent()
agent.begin(["pull the ticket", "reproduce the bug", "draft a fix", "open the PR"])

ckpt = agent.run_until_step(1)              # steps 1 and 2 run now
del agent                                   # the process can die here

revived = DurableAgent()                    # a fresh runtime
outputs = revived.resume_from(ckpt)         # finishes steps 3 and 4, nothing re-run
revived.cache_size()                        # the KV cache came back with the checkpoint
