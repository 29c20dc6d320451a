"""The DurableAgent / CheckpointLog commands of the ``caravanserai`` CLI: inspect, lineage, fork, diff.

Numbering rule (see docs/checkpoint-format.md): what these commands print for people counts
steps from 1 (``step 1`` is the first step); node ids (``prompt-0``, ``step-0``) and Python
indexes count from 0. JSON output that carries both names them ``step`` (from 1) and ``index``
(from 0). Checkpoint ids may be given in full or as a unique prefix (the 12 characters
``lineage`` prints).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from .errors import RunNotFound, UsageError
from .runs.api import readable_run_id
from .stores import open_store

__all__ = ["add_checkpoint_commands"]


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def cmd_inspect(args: argparse.Namespace) -> int:
    from .checkpoints.agent import DurableAgent
    from .checkpoints.log import checkpoint_from_file_or_log

    store = open_store(args.store) if not os.path.isfile(args.target) else None
    run_id = readable_run_id(args.run, store) if args.run and store is not None else args.run
    report = _for_people(DurableAgent.inspect(checkpoint_from_file_or_log(args.target, store, run_id)))
    if args.json:
        _print_json(report)
    else:
        for key, value in report.items():
            print(f"{key}: {', '.join(map(str, value)) if isinstance(value, list) else value}")
    return 0


def _for_people(report: dict[str, Any]) -> dict[str, Any]:
    """``inspect``'s report plus step numbers counted from 1 (node ``step-0`` is step 1)."""
    executed = [int(n.rsplit("-", 1)[1]) + 1 for n in report["executed_nodes"]]
    pending = [int(n.rsplit("-", 1)[1]) + 1 for n in report["pending_nodes"]]
    return {**report, "steps_done": len(executed), "executed_steps": executed, "pending_steps": pending}


def _record_for_people(rec: Any) -> dict[str, Any]:
    """A CheckpointRecord as lineage prints it: ``step`` counted from 1, ``index`` the committed 0-based step."""
    out = dict(rec.__dict__)
    index = out.pop("step")
    return {**out, "step": None if index is None else index + 1, "index": index}


def cmd_lineage(args: argparse.Namespace) -> int:
    from .checkpoints.log import CheckpointLog

    store = open_store(args.store)
    log = CheckpointLog(store, readable_run_id(args.run_id, store))
    tips = [log.resolve(args.checkpoint)] if args.checkpoint else log.heads()
    if not tips:
        raise RunNotFound(f"run {args.run_id!r} has no checkpoint log in {store.url}", run_id=args.run_id)
    chains = {tip: [_record_for_people(r) for r in log.lineage(tip)] for tip in tips}
    if args.json:
        _print_json(chains)
        return 0
    for tip, chain in chains.items():
        print(f"lineage of {tip[:12]}:")
        for rec in chain:
            fork = (f"  fork {rec['fork']['node_id']} = {json.dumps(rec['fork']['value'], ensure_ascii=False)}"
                    if rec["fork"] else "")
            where = f" (run {rec['run_id']})" if rec["run_id"] != log.run_id else ""
            step = "step   -" if rec["step"] is None else f"step {rec['step']:>3}"
            print(f"  {rec['id'][:12]}  {step}  {rec['kind']:<5} depth {rec['depth']:>2}  "
                  f"{rec['stored_bytes']} B{where}{fork}")
    return 0


def cmd_fork(args: argparse.Namespace) -> int:
    from .checkpoints.log import CheckpointLog

    store = open_store(args.store)
    value: Any = args.value
    if args.json_value:
        try:
            value = json.loads(args.value)
        except ValueError:
            raise UsageError(f"--json-value given but {args.value[:60]!r} is not JSON; "
                             "quote it, e.g. '[1, 2]' or '\"text\"'") from None
    log = CheckpointLog(store, readable_run_id(args.run_id, store))
    new_id = log.fork(args.checkpoint, args.node, value, new_run_id=args.new_run)
    print(new_id)
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    from .checkpoints.timelines import compare, timeline

    store = open_store(args.store)
    runs = [readable_run_id(r, store) for r in (args.run_a, args.run_b)]
    result = compare(*((r, timeline(r, store)) for r in runs))
    if args.json:
        _print_json(result.to_dict())
        return 0
    print(f"{runs[0]} vs {runs[1]}: shared prefix {result.shared_prefix} step(s), "
          f"first divergence {'none' if result.first_divergence is None else 'at step ' + str(result.first_divergence)}")
    for step in result.steps:
        mark = "=" if step["same"] else "≠"
        shown = [_short(v) for v in step["values"]]
        print(f"  {mark} step {step['step']:>3}  " + (shown[0] if step["same"] else "  |  ".join(shown)))
    return 0


def _short(value: Any, width: int = 60) -> str:
    text = "-" if value is None else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 3] + "..."


def add_checkpoint_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register inspect, lineage, fork and diff on the CLI's subparsers."""
    p = sub.add_parser("inspect", parents=[common], help="what a DurableAgent checkpoint holds (a file or an id)")
    p.add_argument("target", metavar="FILE|ID", help="a checkpoint file, or a checkpoint id or unique prefix")
    p.add_argument("--run", help="the run whose checkpoint log holds ID (default: search the store)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_inspect)
    p = sub.add_parser("lineage", parents=[common], help="a run's checkpoints from the root to each branch tip")
    p.add_argument("run_id")
    p.add_argument("checkpoint", nargs="?", help="only this checkpoint's lineage (id or unique prefix)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_lineage)
    p = sub.add_parser("fork", parents=[common], help="fork a checkpoint: set one node's value, commit the new timeline")
    p.add_argument("run_id")
    p.add_argument("checkpoint", help="checkpoint id or unique prefix (caravanserai lineage RUN lists them)")
    p.add_argument("node", help="node id, counted from 0: prompt-2 is step 3's prompt")
    p.add_argument("value")
    p.add_argument("--json-value", action="store_true", help="VALUE is JSON (default: a string)")
    p.add_argument("--new-run", metavar="RUN_ID", help="start the fork as a new run")
    p.set_defaults(func=cmd_fork)
    p = sub.add_parser("diff", parents=[common], help="compare two timelines step by step")
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_diff)
