"""One DurableAgent action on the local (transformers) backend, in a fresh process; prints one JSON line.

Run by tests/test_local_model.py with the model venv's python (torch lives there) and the repo on
PYTHONPATH. Every forward pass of the model is counted by a hook on the model itself, with the
number of tokens it processed, so a test can see which tokens were prefilled.

    run MODEL --steps N --ckpt-after K --ckpt FILE [--final FILE]   an uninterrupted run, checkpoint after step K (from 1)
    resume FILE [--final FILE] [--reprefill]                         a fresh resume of a checkpoint
    fork FILE NODE VALUE [--final FILE]                              DurableAgent.fork, then resume the fork
    cold FILE                                                        the same steps, no cache reused (re-prefill every step)
    log MODEL --steps N --dir DIR                                    a CheckpointLog, one commit per step
    save-tiny DIR SEED                                               a tiny random model saved as a model folder
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from caravanserai.checkpoints import local_model
from caravanserai.checkpoints.agent import DurableAgent
from caravanserai.errors import CaravanseraiError

PROMPTS = ["List the files in the repository.", "Which test fails, and why?", "Propose a one-line fix.",
           "Write the commit message.", "Summarise what was done."]
PASSES: list[int] = []  # tokens processed by each forward pass, in order


def count_passes(model_id: str) -> None:
    loaded = local_model.load_model(model_id)
    if not getattr(loaded.model, "_counted", False):
        loaded.model.register_forward_pre_hook(
            lambda _m, args, kwargs: PASSES.append(int(kwargs["input_ids"].shape[1])), with_kwargs=True)
        loaded.model._counted = True


def report(agent: DurableAgent, final: str | None, **extra) -> None:
    ckpt = agent.checkpoint()
    if final:
        Path(final).write_bytes(ckpt)
    backend = agent._backend
    entries = {key: local_model.entry_meta(blob) for key, blob in agent._kv.items()}
    print(json.dumps({
        "outputs": agent.step_outputs(), "computed": agent.computed_steps,
        "tokens": {key: meta["output_ids"] for key, meta in sorted(entries.items())},
        "checkpoint_sha": hashlib.sha256(ckpt).hexdigest(), "passes": PASSES,
        "stats": backend.step_stats, "fingerprint": backend.loaded.fingerprint, "cache_size": agent.cache_size(),
        "inspect": DurableAgent.inspect(ckpt), **extra}))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd")
    ap.add_argument("args", nargs="*")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--ckpt-after", type=int, default=2)
    ap.add_argument("--ckpt")
    ap.add_argument("--final")
    ap.add_argument("--dir")
    ap.add_argument("--reprefill", action="store_true")
    a = ap.parse_args(argv)
    try:
        return run(a)
    except CaravanseraiError as err:
        print(json.dumps({"error": err.to_dict()}))
        return 3


def run(a: argparse.Namespace) -> int:
    if a.cmd == "save-tiny":
        folder, seed = a.args
        model = local_model.tiny_model(int(seed))
        model.save_pretrained(folder)
        print(json.dumps({"saved": folder}))
        return 0
    if a.cmd in ("run", "log"):
        model_id = a.args[0]
        count_passes(model_id)
        agent = DurableAgent().begin(PROMPTS[:a.steps], model_id=model_id)
        if a.cmd == "log":
            return run_log(agent, a)
        for step in range(a.steps):
            ckpt = agent.run_until_step(step)
            if step + 1 == a.ckpt_after and a.ckpt:
                Path(a.ckpt).write_bytes(ckpt)
        report(agent, a.final)
        return 0
    ckpt = Path(a.args[0]).read_bytes()
    model_id = DurableAgent.inspect(ckpt)["model_id"]
    count_passes(model_id)
    if a.cmd == "fork":
        node, value = a.args[1:3]
        ckpt = DurableAgent.fork(ckpt, node, value)
    if a.cmd == "cold":  # the reference: every step prefills its whole transcript (token ids from the entries)
        agent = DurableAgent().load(ckpt, reprefill=True)  # the token ids of the entries, computed by this model
        agent._backend.reuse_cache = False
        for step in agent.pending_steps():
            agent.run_step(step)
    else:
        agent = DurableAgent()
        agent.resume_from(ckpt, reprefill=a.reprefill)
    report(agent, a.final)
    return 0


def run_log(agent: DurableAgent, a: argparse.Namespace) -> int:
    from caravanserai.checkpoints import CheckpointLog, LocalDirectoryStore

    log = CheckpointLog(LocalDirectoryStore(a.dir), run_id="local-log")
    parent, rows = None, []
    for step in range(a.steps):
        ckpt = agent.run_until_step(step)
        parent = log.commit(ckpt, parent=parent, step=step)
        record = log.record(parent)
        rows.append({"stored_bytes": record.stored_bytes, "checkpoint_bytes": record.checkpoint_bytes,
                     "kind": record.kind, "entry_bytes": len(agent._kv[f"step-{step}"])})
    reloaded = log.load(parent)
    print(json.dumps({"rows": rows, "same": reloaded == agent.checkpoint(), "head": parent}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
