# Child for tests/test_durable_agent.py: the seed's "Across processes" audit.py, VERBATIM
# (only `continuum` -> `caravanserai`); the test checks this text against the seed.
# --- verbatim ---
# audit.py : a third process, anywhere, replays the same bytes
from pathlib import Path
from caravanserai import DurableAgent

blob = Path("job.ckpt").read_bytes()
assert DurableAgent().resume_from(blob) == DurableAgent().resume_from(blob)
