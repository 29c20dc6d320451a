"""Child for tests/test_durable_agent.py: one of several workers committing into ONE CheckpointLog.

usage: agent_log_worker.py STORE RUN_ID START_AT PROMPTS_JSON

STORE is ``objects:<dir>`` (a LocalDirectoryStore) or ``store:<dir>`` (a full store opened with
``caravanserai.open_store``, so commits also go to the run's journal). The worker builds its
agent, sleeps until START_AT (epoch seconds, the barrier shared by all workers), then commits
every step with its parent, loading checkpoints other workers committed in between. It prints
one JSON line: the ids it committed and the times of its first and last commit.
"""

from __future__ import annotations

import json
import sys
import time

import caravanserai
from caravanserai import DurableAgent
from caravanserai.checkpoints import CheckpointLog, LocalDirectoryStore


def main(argv: list[str]) -> None:
    target, run_id, start_at, prompts = argv[0], argv[1], float(argv[2]), json.loads(argv[3])
    kind, path = target.split(":", 1)
    store = LocalDirectoryStore(path) if kind == "objects" else caravanserai.open_store(path)
    agent = DurableAgent().begin(prompts)
    log = CheckpointLog(store, run_id)
    time.sleep(max(0.0, start_at - time.time()))
    ids: list[str] = []
    loaded = 0
    first = last = None
    prev = None
    for step in range(len(prompts)):
        ckpt = agent.run_until_step(step)
        prev = log.commit(ckpt, parent=prev, step=step)
        last = time.time()
        first = first or last
        ids.append(prev)
        assert log.load(prev) == ckpt
        # read what the others committed so far (records are written last, so each one loads)
        reader = CheckpointLog(store, run_id)
        for record in reader.manifest()[-3:]:
            reader.load(record.id)
            loaded += 1
    print(json.dumps({"ids": ids, "first": first, "last": last, "loaded": loaded}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
