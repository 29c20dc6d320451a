"""The timeline commands of the ``caravanserai`` CLI: inspect, lineage, fork, diff, export.

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

from .calls.pricing import usd_text
from .errors import UsageError
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
            if isinstance(value, dict):  # the cache section: model, fingerprint, dtype, tokens covered, bytes
                print(f"{key}:")
                for name, item in value.items():
                    print(f"  {name}: {item}{_per_token(name, item, value)}")
                continue
            print(f"{key}: {', '.join(map(str, value)) if isinstance(value, list) else value}")
    return 0


def _per_token(name: str, value: Any, section: dict[str, Any]) -> str:
    """`` (N B/token)`` after the cache's byte count, where it covers tokens."""
    tokens = section.get("tokens")
    if name != "bytes" or not isinstance(value, int) or not isinstance(tokens, int) or tokens <= 0:
        return ""
    return f" ({value / tokens:,.0f} B/token)"


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
        return _print_fork_tree(log.run_id, store, args.json)
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


def _print_fork_tree(run_id: str, store: Any, as_json: bool) -> int:
    """``lineage RUN`` of a run without a checkpoint log: its fork tree (forks of waypoints, notebook forks)."""
    from .checkpoints.lineage import lineage

    nodes = lineage(run_id, store)
    if as_json:
        _print_json([n.to_dict() for n in nodes])
        return 0
    if len(nodes) < 2:
        print(f"run {run_id!r} has no forks and no checkpoint log: fork it with `caravanserai fork {run_id} --at N`")
        return 0
    print(f"fork tree of {nodes[0].id}:")
    for node in nodes:
        where = f"from waypoint {node.point}" if node.point is not None else "root"
        done = f"{node.steps_done} waypoint(s)" if node.steps_done is not None else ""
        edit = f"; {node.edit}" if node.edit else ""
        mark = "" if node.depth == 0 else "└ "
        print(f"  {'  ' * node.depth}{mark}{node.id}  {where}{edit}  ({node.status}, {done})")
        for line in (node.code_changed or "").splitlines()[2:]:  # the diff without its ---/+++ header
            print(f"  {'  ' * node.depth}    {line}")
    return 0


def cmd_fork(args: argparse.Namespace) -> int:
    """``fork RUN --at N [--as NEW] [--state JSON]`` (any run), or ``fork RUN CHECKPOINT NODE VALUE`` (a log)."""
    from .checkpoints.log import CheckpointLog
    from .runs.fork import fork

    store = open_store(args.store)
    if args.at is not None or args.new_id is not None or args.state is not None:
        if args.checkpoint is not None:
            raise UsageError("give either --at N (fork a run at a waypoint) or CHECKPOINT NODE VALUE (fork a checkpoint)")
        state: Any = {}
        if args.state is not None:
            try:
                state = {"state": json.loads(args.state)}
            except ValueError:
                raise UsageError(f"--state must be JSON, got {args.state[:60]!r}") from None
        child = fork(args.run_id, at=args.at, new_run_id=args.new_id, store=store, **state)
        print(child)  # the first line alone: the new run's id, for scripts
        print(next_step(child, store, args.store))
        return 0
    if args.checkpoint is None or args.node is None or args.value is None:
        raise UsageError("fork needs --at N (a run's waypoint) or CHECKPOINT NODE VALUE (a DurableAgent checkpoint)")
    value: Any = args.value
    if args.json_value:
        try:
            value = json.loads(args.value)
        except ValueError:
            raise UsageError(f"--json-value given but {args.value[:60]!r} is not JSON; "
                             "quote it, e.g. '[1, 2]' or '\"text\"'") from None
    log = CheckpointLog(store, readable_run_id(args.run_id, store))
    new_id = log.fork(args.checkpoint, args.node, value, new_run_id=args.new_run)
    print(new_id)  # the first line alone: the new checkpoint's id, for scripts
    if args.new_run:
        import shlex

        store_arg = f" --store {shlex.quote(args.store)}" if args.store else ""
        print(f"new run {args.new_run} (forked from {log.run_id}); run its remaining steps with:\n"
              f"  caravanserai resume {shlex.quote(args.new_run)}{store_arg}")
    return 0


def next_step(run_id: str, store: Any, store_arg: str | None = None) -> str:
    """What to run to continue a fork made from a waypoint: the notebook cell's magic line, or the command."""
    import shlex

    from .runs.view import inspect_run

    view = inspect_run(run_id, store)
    copied = view.copied
    where = f"forked from {copied.parent} at waypoint {copied.last}" if copied else "forked"
    flag = f" --store {shlex.quote(store_arg)}" if store_arg else ""
    if any(w.values_seq is not None for w in view.waypoints):
        return f"new run {run_id} ({where}); continue it in the notebook with the cell line:\n  %%resumable {run_id}{flag}"
    return f"new run {run_id} ({where}); continue it with:\n  caravanserai resume {shlex.quote(run_id)}{flag}"


DIFF_ROWS = 40  # steps ``diff`` prints after the shared prefix (``--all``: every one)


def cmd_diff(args: argparse.Namespace) -> int:
    """Two or more timelines step by step: the shared prefix folded, the first divergence word-diffed."""
    from .checkpoints.timelines import compare, resolve_ref, timeline

    store = open_store(args.store)
    refs = [resolve_ref(r, store) for r in args.runs]
    if len(refs) < 2:
        raise UsageError("diff needs two timelines or more, e.g. caravanserai diff RUN RUN-fork-3")
    lines = [(r, timeline(r, store)) for r in refs]
    result = compare(*lines)
    if args.json:
        _print_json({**result.to_dict(), "totals": result.totals(),
                     "checkpoints": {r: getattr(t, "checkpoint", None) for r, t in lines}})
        return 0
    first = result.first_divergence
    print(f"{' vs '.join(refs)}: shared prefix {result.shared_prefix} step(s), "
          f"first divergence {'none' if first is None else 'at step ' + str(first)}")
    for ref, steps in lines:  # which checkpoint a plain DurableAgent RUN stands for
        if getattr(steps, "checkpoint", None) and "@" not in ref:
            print(f"  {ref} = {getattr(steps, 'label', ref)}")
    shown_rows = 0
    for index, step in enumerate(result.steps):
        folded = not args.all and step["same"] and (first is None or step["step"] < first)
        if folded and step["step"] == result.steps[0]["step"]:
            print(f"  = steps {step['step']}-{step['step'] + result.shared_prefix - 1} identical "
                  "(folded; --all shows them)" if result.shared_prefix > 1 else f"  = step {step['step']:>3}  (folded)")
        if folded or (args.only_diff and step["same"]):
            continue
        if shown_rows == DIFF_ROWS and not args.all:
            rest = len(result.steps) - index
            print(f"  … {rest:,} more step(s), {sum(1 for s in result.steps[index:] if not s['same']):,} of them different "
                  "(--all shows them)")
            break
        shown_rows += 1
        mark = "=" if step["same"] else "≠"
        changes = result.changes(index) if not step["same"] else []
        if any(changes[1:]):  # a notebook step: what changed, not the whole state
            shown = [_changed(changed) for changed in changes[1:]]
        else:
            shown = [_short(v) for v in result.texts(index)]
        line = f"  {mark} step {step['step']:>3}  " + (shown[0] if step["same"] else "  |  ".join(shown))
        print(line + _deltas(step) + ("   <- first divergence" if step["step"] == first else ""))
    if first is not None:
        index = next(i for i, s in enumerate(result.steps) if s["step"] == first)
        _print_divergence(refs, result.steps[index], result.changes(index))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """``export RUN [RUN2...] --html FILE``: Timelines, Lineage and Compare in one self-contained HTML file."""
    from .panels.export import export_runs

    print(export_runs(args.runs, args.html, open_store(args.store), lineage=not args.no_lineage))
    return 0


def _deltas(step: dict) -> str:
    """Each later timeline's tokens/seconds/USD against the first, where both are known."""
    parts = []
    for cell in step["cells"][1:]:
        if cell is None:
            continue
        if cell.get("d_tokens"):
            parts.append(f"{cell['d_tokens']:+,} tok")
        seconds = cell.get("d_latency_s")
        if seconds is not None and abs(seconds) >= 0.0005:  # under half a millisecond is noise
            parts.append(f"{seconds * 1000:+,.0f} ms" if abs(seconds) < 1 else f"{seconds:+,.2f} s")
        if cell.get("d_usd"):
            parts.append(("+" if cell["d_usd"] > 0 else "") + usd_text(cell["d_usd"]))  # +$0.00042, -$0.0012
    return f"   ({', '.join(parts)})" if parts else ""


def _print_divergence(refs: list[str], step: dict, changes: list[list[dict]]) -> None:
    """The first divergent step against the first timeline: a notebook step's changed variables
    (``results[5]: 125 → 2.5``) and cell code, else word by word: [-removed-] {+added+}."""
    from .checkpoints.timelines import step_text, word_diff

    base = step["cells"][0] or {}
    print(f"\nstep {step['step']} against {refs[0]}:")
    for i, ref in enumerate(refs[1:], start=1):
        cell = step["cells"][i] or {}
        if changes[i]:
            for change in changes[i]:
                if "diff" in change:
                    print(f"  {ref} cell code changed:")
                    print("\n".join("    " + line for line in change["diff"].splitlines()))
                else:
                    print(f"  {ref} {change['path']}: {change['old']} → {change['new']}")
            continue
        for name, old, new in (("prompt", base.get("prompt"), cell.get("prompt")),
                               ("note", base.get("note"), cell.get("note")),
                               ("value", step_text(step["values"][0]), step_text(step["values"][i]))):
            if old is None and new is None or old == new:
                continue
            marked = "".join(text if op == "=" else f"[-{text}-]" if op == "-" else f"{{+{text}+}}"
                             for op, text in word_diff(old or "", new or ""))
            print(f"  {ref} {name}: {marked}")


def _changed(changes: list[dict], width: int = 90) -> str:
    """A notebook step's changes against the baseline in one line: ``results[5]: 125 → 2.5; cell code``."""
    parts = ["cell code" if "diff" in c else f"{c['path']}: {c['old']} → {c['new']}" for c in changes]
    return _short("; ".join(parts) or "same variables", width)


def _short(value: str | None, width: int = 60) -> str:
    text = "-" if value is None else " ".join(value.split())  # one line per step, whatever the output holds
    return text if len(text) <= width else text[: width - 3] + "..."


def resume_log_run(run_id: str, store: Any, *, out: Any = print) -> int:
    """``caravanserai resume RUN`` for a DurableAgent run: run the pending steps of its main line's head
    (a fork made with ``fork ... --new-run NEW`` is NEW's main line), committing as it goes, and say what
    was reused and computed; with the main line done, the heads of branches forked inside the log that
    still have steps to run. Nothing runs but the checkpoint's own backend (named in the checkpoint and
    checked against ``agent.BACKENDS``; a local model folder must be chosen by code, never by data)."""
    from .checkpoints.log import CheckpointLog, log_status
    from .errors import RunNotFound

    log = CheckpointLog(store, run_id)
    status = log_status(store.events(run_id))
    if status is None or status["latest"] is None:
        raise RunNotFound(f"run {run_id!r} has no checkpoint log to resume", run_id=run_id)
    main = status["latest"]
    heads = [main] if status["status"] != "completed" else [h for h in log.heads() if _pending(log, h)]
    if not heads:
        out(f"{run_id}: every step of its main line and of its branches is done; nothing to resume")
        return 0
    for head in heads:
        _resume_head(log, head, "main line" if head == main else "branch", out)
    return 0


def _pending(log: Any, head: str) -> int:
    """Steps of ``head`` not run yet."""
    from .checkpoints.agent import step_id

    header = log.load_data(head).header
    return sum(step_id(i) not in header["values"] for i in range(header["steps"]))


def _resume_head(log: Any, head: str, where: str, out: Any) -> Any:
    """Resume one head, printing a line per computed step and a summary."""
    shown = [0]

    def report(progress: Any) -> None:  # also called again after the final commit: print each step once
        while shown[0] < progress.steps_done - progress.reused:
            shown[0] += 1
            out(f"  step {progress.reused + shown[0]}/{progress.steps} computed")

    header = log.load_data(head).header
    done = header["steps"] - _pending(log, head)
    reused = "no step done yet" if not done else (
        f"{'step 1' if done == 1 else f'steps 1-{done}'} of {header['steps']} done, reused (not recomputed)")
    out(f"resuming {log.run_id} ({where}) at {head[:12]}: {reused}")
    progress = log.resume(head, on_progress=report)
    out(f"{log.run_id}: {progress.reused} step(s) reused, {progress.computed} computed ({progress.tokens} tokens); "
        f"{progress.steps_done}/{progress.steps} steps done, head {progress.head[:12]}")
    return progress



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
    p = sub.add_parser("fork", parents=[common],
                       help="a new run from a run's waypoint (--at N), or a checkpoint with one node's value changed")
    p.add_argument("run_id")
    p.add_argument("checkpoint", nargs="?", help="checkpoint id or unique prefix (caravanserai lineage RUN lists them)")
    p.add_argument("node", nargs="?", help="node id, counted from 0: prompt-2 is step 3's prompt")
    p.add_argument("value", nargs="?")
    p.add_argument("--at", type=int, metavar="N", help="fork the run at its waypoint N (default: its last)")
    p.add_argument("--as", dest="new_id", metavar="NEW", help="the new run's id (default RUN-fork-N)")
    p.add_argument("--state", metavar="JSON", help="replace waypoint N's state in the fork")
    p.add_argument("--json-value", action="store_true", help="VALUE is JSON (default: a string)")
    p.add_argument("--new-run", metavar="RUN_ID", help="start the fork as a new run")
    p.set_defaults(func=cmd_fork)
    p = sub.add_parser("diff", parents=[common], help="compare timelines step by step; the first divergence word by word")
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="runs (or RUN@CHECKPOINT for a branch of a log), the first is the baseline")
    p.add_argument("--all", action="store_true",
                   help="show every step: the shared prefix (folded by default) and all steps after the first 40")
    p.add_argument("--only-diff", action="store_true", help="show only the steps that differ")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_diff)
    p = sub.add_parser("export", parents=[common],
                       help="runs' Timelines, their Lineage and a Compare in one HTML file that works offline")
    p.add_argument("runs", nargs="+", metavar="RUN", help="runs to show (two or more are also compared, the first as baseline)")
    p.add_argument("--html", required=True, metavar="FILE", help="the file to write (self-contained, read-only)")
    p.add_argument("--no-lineage", action="store_true", help="leave out the fork tree")
    p.set_defaults(func=cmd_export)
