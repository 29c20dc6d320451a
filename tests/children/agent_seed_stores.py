# Child for tests/test_durable_agent.py: the seed's "Checkpoint stores" sample followed by its
# "Incremental checkpoints, forks, and many workers" sample (which uses `store` and `agent` from
# the first), VERBATIM (only `continuum` -> `caravanserai`). The test checks this text against the
# seed, points "/mnt/shared/ckpt" at a temporary directory when it copies the script, and appends
# its checks.
# --- verbatim ---
from caravanserai import DurableAgent
from caravanserai.checkpoints import LocalDirectoryStore, S3Store, GCSStore

store = LocalDirectoryStore("/mnt/shared/ckpt")
# store = S3Store("my-bucket", prefix="caravanserai")     # pip install boto3
# store = GCSStore("my-bucket", prefix="caravanserai")    # pip install google-cloud-storage

agent = DurableAgent()
agent.begin(["pull the ticket", "reproduce the bug", "draft a fix", "open the PR"])
agent.run_until_step(1, store=store, key="ticket-42/step-2")

# any machine that can reach the store:
DurableAgent().resume_from(store=store, key="ticket-42/step-2")

from caravanserai.checkpoints import CheckpointLog

log = CheckpointLog(store, run_id="ticket-42")
prev = None
for step in range(4):
    prev = log.commit(agent.run_until_step(step), parent=prev, step=step)

alt = log.fork(prev, agent.prompt_node_ids[3], "open a draft PR instead")
DurableAgent().resume_from(log.load(alt))
