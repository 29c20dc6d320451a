"""Child for tests/test_durable_agent.py: one DurableAgent job in a fresh process.

usage:
  agent_run.py run PROMPTS_JSON STEP OUT     run steps 0..STEP, write the checkpoint bytes to OUT
  agent_run.py resume CKPT OUT               resume CKPT to completion; write OUT (final checkpoint)
                                             and OUT.json (outputs, computed steps, cache size)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from caravanserai import DurableAgent


def main(argv: list[str]) -> None:
    mode = argv[0]
    if mode == "run":
        prompts, step, out = json.loads(argv[1]), int(argv[2]), Path(argv[3])
        out.write_bytes(DurableAgent().begin(prompts).run_until_step(step))
    elif mode == "resume":
        ckpt, out = Path(argv[1]).read_bytes(), Path(argv[2])
        agent = DurableAgent()
        outputs = agent.resume_from(ckpt)
        out.write_bytes(agent.checkpoint())
        Path(f"{out}.json").write_text(json.dumps({"outputs": outputs, "computed": agent.computed_steps,
                                                   "cache": agent.cache_size()}))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
