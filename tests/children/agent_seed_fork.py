# Child for tests/test_durable_agent.py: the seed's "Fork a timeline" sample, VERBATIM
# (only `continuum` -> `caravanserai`); the test checks this text against the seed and appends its checks.
# --- verbatim ---
from caravanserai import DurableAgent

rec = DurableAgent()
rec.begin(["summarize the bug", "find the module", "draft a fix", "write the changelog"])
ckpt = rec.run_until_step(1)               # steps 1 and 2 executed
step_3 = rec.prompt_node_ids[2]            # the step-3 prompt, still pending

real, what_if = DurableAgent(), DurableAgent()
real.resume_from(ckpt)
what_if.resume_from(DurableAgent.fork(ckpt, step_3, "write a haiku instead"))
real.step_outputs()      # one generated output per step, in step order
what_if.step_outputs()   # steps 1-2 identical; steps 3 and 4 differ
