# Child for tests/test_durable_agent.py: the seed's "Across processes" work.py, VERBATIM
# (only `continuum` -> `caravanserai`); the test checks this text against the seed.
# --- verbatim ---
# work.py : a different process, a GPU box, an hour later
from pathlib import Path
from caravanserai import DurableAgent

outputs = DurableAgent().resume_from(Path("job.ckpt").read_bytes())
Path("job.result").write_text(repr(outputs))
