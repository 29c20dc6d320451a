"""The ``caravanserai`` command: a thin layer over the library.

``list``, ``show``, ``resume`` and ``clean`` keep 0.2.0's output shapes (``show`` prints state
as JSON, not Python repr). Read commands take ``--json``; every command takes ``--store URL``.
Errors are one line on stderr and a non-zero exit: 1 for a failed command, 2 for bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn, cast

from ._version import __version__
from .cli_checkpoints import add_checkpoint_commands
from .cli_proxy import add_proxy_command
from .cli_trust import add_trust_commands, signature_report
from .errors import CaravanseraiError, ResumeError, ResumeNotConfirmed, RunNotFound, UsageError
from .events import Segments
from .runs.api import clean, readable_run_id
from .runs.index import age_seconds, check_index, list_runs
from .runs.lifecycle import require_events
from .runs.settle import settle
from .runs.signed_items import launch_of
from .runs.trust import judge, launch_payload, resigned
from .runs.view import AttemptView, RunView, gc_paused, inspect_run
from .stores import ENV_VAR, open_store

__all__ = ["main", "summarize"]


def summarize(run_id: str, events: Sequence[dict]) -> dict[str, Any]:
    """What a person wants to know about a run, from its events alone (``RunView.as_summary()``)."""
    return RunView.from_events(run_id, events).as_summary()


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = max(0, int(seconds))
    for limit, div, unit in ((60, 1, "s"), (3600, 60, "m"), (86400, 3600, "h")):
        if seconds < limit:
            return f"{seconds // div}{unit} ago"
    return f"{seconds // 86400}d ago"


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def cmd_list(args: argparse.Namespace) -> int:
    store = open_store(args.store)
    now = time.time()
    with gc_paused():  # thousands of small dicts: cyclic GC passes would cost more than building them
        # the run index: journals are read only for runs that changed since their entry was written
        rows = [{**entry.summary, "age_seconds": age_seconds(entry, now)} for entry in list_runs(store)]
    if args.json:  # one run per line: json's C encoder (indent= would use its pure-Python one, ~10x slower)
        print("[" + ",\n ".join(json.dumps(row, ensure_ascii=False) for row in rows) + "]")
        return 0
    if not rows:
        print("no runs yet")
    for row in rows:
        print(f"{row['run_id']}\t{_progress(row)}\t{_age(row['age_seconds'])}\t{row['status']}")
    return 0


def _progress(row: dict) -> str:
    """The list's second column: waypoints, or steps for a DurableAgent run, or what is damaged."""
    if row["status"] == "damaged":
        return row["error"]["message"]
    checkpoints = row.get("checkpoints")
    if checkpoints and not row["waypoints"]:
        return f"{checkpoints['checkpoints']} checkpoint(s), step {checkpoints['steps_done']}/{checkpoints['steps']}"
    return f"{row['waypoints']} waypoint(s)"


def _format_waypoint(view: RunView, w: Any) -> str:
    """A waypoint for people: its note, and a notebook run's variables (else the state it holds)."""
    text = f"waypoint {w.n}\n\n{w.note}"
    notebook = w.values_seq is not None
    if w.has_state and not (notebook and w.loop is not None):  # a notebook loop's {"_i": N} says nothing its variables do not
        text += f"\n\nstate: {json.dumps(view.state(w), ensure_ascii=False)}"
    if notebook:
        shown = view.variables_shown(w, limit=160)
        text += "\n\nvariables:" + "".join(f"\n  {name} = {value}" for name, value in shown.items())
    return text


def _format_copied(view: RunView) -> str:
    """Where a fork came from: the parent's waypoints it copied, what it edited, its code change."""
    copied = view.copied
    if copied is None:
        return ""
    span = f"waypoints {copied.first}–{copied.last}" if copied.waypoints else "no waypoints"
    line = f"forked from {copied.parent}: {span} copied with the parent's times"
    if copied.edited:
        line += f"; edited in this fork: {', '.join(copied.edited)}"
    if copied.code_changed:
        line += "; cell code changed:\n" + "\n".join("  " + ln for ln in copied.code_changed.splitlines())
    return line


def cmd_show(args: argparse.Namespace) -> int:
    store = open_store(args.store)
    view = inspect_run(args.run_id, store)
    run_id = view.run_id
    store.refresh_views(run_id, view.raw_events())
    summary = view.as_summary()
    if args.json:
        summary["attempt_history"] = [_attempt_dict(a) for a in view.attempts]
        if view.latest is not None and view.latest.values_seq is not None:
            summary["latest"]["variables"] = view.variables(view.latest)
        if args.all:
            summary["history"] = [
                {"n": w.n, "note": w.note, "at": w.at, **({"state": view.state(w)} if w.has_state else {}),
                 **({"variables": view.variables(w)} if w.values_seq is not None else {})}
                for w in view.waypoints
            ]
        _print_json(summary)
        return 0
    if view.copied is not None:
        print(_format_copied(view) + "\n")
    if args.all:
        blocks = [_format_waypoint(view, w) for w in view.waypoints]
        print(("\n\n" + "-" * 40 + "\n\n").join(blocks))
    elif view.latest is not None:
        print(_format_waypoint(view, view.latest))
    for loop, done in sorted(summary["items_done"].items()):
        print(f"\nitems done: {done} (resumable_iterate loop {loop})")
    checkpoints = view.checkpoints
    if checkpoints:
        origin = view.parent
        where = ""
        if origin is not None:
            point = origin.checkpoint_id[:12] if origin.checkpoint_id else f"event {origin.seq}"
            where = f"; forked from run {origin.run_id!r} at {point}"
        print(f"checkpoints: {checkpoints.checkpoints} committed; latest {(checkpoints.latest or '?')[:12]}, "
              f"steps done {checkpoints.steps_done}/{checkpoints.steps}" + where)
    attempts = _format_attempts(view) if view.own_attempts > 1 else ""
    if view.calls or view.agent_id or view.status == "failed":
        text = _format_run(view) + attempts
        print(text if view.waypoints or view.loops else text.lstrip("\n"))
    elif args.all and attempts:
        print(attempts)
    elif view.latest is None and not view.loops and not checkpoints:
        print(f"run {run_id!r} has no waypoints yet")
    return 0


def _attempt_dict(attempt: AttemptView) -> dict[str, Any]:
    return {"attempt": attempt.number, "kind": attempt.kind, "started_at": attempt.started_at, "end": attempt.end,
            "ended_at": attempt.ended_at, "last_event_at": attempt.last_event_at,
            **({"code": attempt.code, "message": attempt.message} if attempt.end == "failed" else {})}


def _format_attempts(view: RunView) -> str:
    """How each attempt ended (``show`` of a run resumed at least once)."""
    lines = ["\nattempts:"]
    for a in view.attempts:
        how = {
            "completed": f"completed at {a.ended_at}",
            "failed": f"failed at {a.ended_at}: {a.code}: {a.message}",
            "interrupted": f"interrupted at {a.ended_at}" + (f": {a.message}" if a.message else ""),
            "killed": f"killed: no end recorded (last event {a.last_event_at})",
            "open": f"open: running, or killed and not resumed yet (last event {a.last_event_at})",
            "imported": f"imported from {view.imported_from or 'an older caravanserai'} (how it ended was not recorded)",
        }.get(a.end, a.end)
        began = {"restarted": "restarted", "resumed": "resumed"}.get(a.kind, "started")
        lines.append(f"  {a.number}. {began} {a.started_at}: {how}")
    return "\n".join(lines)


def _format_run(view: RunView) -> str:
    """Status, result and receipt of a run that made journaled calls (after the 0.2.0 block)."""
    status = view.status
    count = len(view.attempts)
    lines = [f"\nstatus: {status} (attempt{'s' if count != 1 else ''}: {count})"]
    if status == "completed" and view.result is not None:
        lines.append(f"result: {json.dumps(view.result, ensure_ascii=False)}")
    if status == "failed":
        failed = next((a for a in reversed(view.attempts) if a.end == "failed"), None)
        code, message = (failed.code, failed.message) if failed else (view.summary.get("code"), view.summary.get("message"))
        lines.append(f"failed: {code}: {message}")
    if view.calls:  # counted as the Runs panel and receipts count them (RunView.calls_text)
        lines.append(f"receipt: {view.receipt_text()}")
    return "\n".join(lines)


def cmd_journal(args: argparse.Namespace) -> int:
    store = open_store(args.store)
    run_id = readable_run_id(args.run_id, store)
    events = require_events(run_id, store)
    if args.json:
        for event in events:
            print(json.dumps(event, ensure_ascii=False))
        return 0
    for event in events:
        detail = {k: v for k, v in event.items() if k not in ("v", "seq", "at", "type", "prev")}
        text = json.dumps(detail, ensure_ascii=False)
        print(f"{event['seq']:>5}  {event['at']}  {event['type']:<14} {text if len(text) <= 120 else text[:117] + '...'}")
    return 0


def cmd_settle(args: argparse.Namespace) -> int:
    if (args.result is None) == (args.error is None):
        raise UsageError("give exactly one of --result JSON or --error TEXT")
    result = None
    if args.result is not None:
        try:
            result = json.loads(args.result)
        except ValueError:
            raise UsageError(f"--result must be JSON (quote a string as '\"text\"'), got {args.result!r}") from None
    settle(args.run_id, args.call_id, result, error=args.error, store=open_store(args.store))
    print(f"settled {args.call_id} of run {args.run_id!r}; run it again to continue")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    store = open_store(args.store)
    run_id = readable_run_id(args.run_id, store)
    try:
        events = require_events(run_id, store)
    except RunNotFound:
        raise RunNotFound(f"no checkpoints for run {run_id!r} - nothing to resume", run_id=run_id) from None
    if RunView.from_events(run_id, events).status == "completed" and not args.force:
        raise ResumeError(
            f"run {run_id!r} already completed at {events[-1]['at']}; nothing to resume (use --force to run it again)",
            run_id=run_id,
        )
    if any(e["type"] == "checkpoint_committed" for e in events):  # a DurableAgent run: its log's pending steps
        from .cli_checkpoints import resume_log_run

        return resume_log_run(run_id, store)
    if "cell_source" in Segments.of(events).identity:  # a notebook cell's run: its kernel's command would not run the cell
        raise ResumeError(f"run {run_id!r} is a notebook cell's run: continue it by running its cell as "
                          f"`%%resumable {run_id}` (edited or not, if it is a fork that has not run yet)", run_id=run_id)
    source, source_events, launch = launch_of(run_id, events, store)
    command = cast("list[str]", launch.get("orig_argv") or launch.get("command"))  # a launch has one
    cwd = launch.get("cwd")
    where = f" (in {cwd})" if cwd else ""
    verdict = judge("command", "launch", launch_payload(launch), launch.get("launch_signed"), run_id=source,
                    store_url=store.url,  # SignatureInvalid: refused, even with --yes
                    resigned_items=resigned([*source_events, *events] if source != run_id else events))
    if source != run_id:  # a fork never run: the parent's launch, pointed at the fork
        command = [command[0], *(run_id if word == source else word for word in command[1:])]
    if not args.yes and not verdict.trusted:
        # the command is data read from the store: a forged journal would choose what runs here
        print(f"the journal asks to run: {shlex.join(command)}{where}", flush=True)
        raise ResumeNotConfirmed(f"{verdict.refusal(source, 'command', 'launch', store.url)}; check the command above, "
                                 "then run again with --yes; nothing was run", run_id=run_id, store=store.url, command=command)
    if cwd is not None and not os.path.isdir(cwd):
        raise ResumeError(f"run {run_id!r} was launched in {cwd!r}, which no longer exists; re-run it by hand", run_id=run_id)
    env = dict(os.environ)
    if args.store is not None or ENV_VAR in os.environ:
        env[ENV_VAR] = store.opened_url or store.url  # the child must find this same store, signed if it is
    print(f"resuming: {shlex.join(command)}{where}", flush=True)
    try:
        return subprocess.call(command, cwd=cwd, env=env)
    except OSError as exc:
        raise ResumeError(
            f"cannot run {command[0]!r} recorded for run {run_id!r}: {exc.strerror or exc}; re-run the script by hand",
            run_id=run_id,
        ) from None


def cmd_serve(args: argparse.Namespace) -> int:
    from .stores import default_store_url
    from .stores.http_service import serve

    serve(args.backing or args.store or default_store_url(), host=args.host, port=args.port, token=args.token,
          ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile)
    return 0


def cmd_store_init(args: argparse.Namespace) -> int:
    from .stores.sql import SqlDurableStore

    store = open_store(args.url)
    if not isinstance(store, SqlDurableStore):
        raise UsageError(f"{store.url} is not a SQL store: only sqlite:// and postgresql:// stores have a schema to create")
    store.create_schema()
    print(f"created the caravanserai tables ({store.table}, {store.table}_leases, {store.table}_objects) in {store.url}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Check every journal line's chain and every journaled figure, and report who signed what could run
    (a signature that does not verify is damage); exit 1 if any run is damaged."""
    from .errors import JournalCorruptionError

    store = open_store(args.store)
    runs = [readable_run_id(r, store) for r in args.run_ids] or store.list()
    damaged = 0
    for run_id in runs:
        try:
            events = require_events(run_id, store)
            RunView.from_events(run_id, events)  # revalidates money and token figures
            torn = store.torn_tail(run_id)
            note = (f" (a torn last line of {torn} bytes was dropped: a writer was killed mid-append; the next writer "
                    "removes it)") if torn else ""
            print(f"{run_id}\tok\t{len(events)} events{note}")
            report, refused = signature_report(run_id, events, store, store.load(run_id))
            for line in report:
                print(line)
            damaged += bool(refused)
        except JournalCorruptionError as exc:
            damaged += 1
            print(f"{run_id}	DAMAGED	{exc.message}")
    problems = check_index(store, runs)
    for problem in problems:
        print(f"index\tMISMATCH\t{problem} (run `caravanserai list` to rebuild it)")
    return 1 if damaged or problems else 0


def cmd_clean(args: argparse.Namespace) -> int:
    store = open_store(args.store)
    if not clean(args.run_id, store=store):
        raise RunNotFound.in_store(args.run_id, store.url)
    print(f"deleted checkpoints for {args.run_id!r}")
    return 0


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises ``UsageError`` (one line) instead of printing usage and exiting.

    The CLI turns it into one line on stderr and exit status 2; the magics into IPython's UsageError.
    """

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    common = ArgumentParser(add_help=False)
    common.add_argument("--store", default=argparse.SUPPRESS, metavar="URL",
                        help=f"store URL or path (default: ${ENV_VAR} or ./.caravanserai)")
    parser = ArgumentParser(prog="caravanserai", parents=[common],
                                     description="Inspect and resume durable caravanserai runs.")
    parser.add_argument("--version", action="version", version=f"caravanserai {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", parents=[common], help="every run, waypoint count, last updated, status")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_list)
    p = sub.add_parser("show", parents=[common], help="the latest waypoint note + state")
    p.add_argument("run_id")
    p.add_argument("--all", action="store_true", help="every waypoint, oldest first")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_show)
    p = sub.add_parser("resume", parents=[common],
                       help="re-run the command that started the run, where it started (a DurableAgent run: its pending steps)")
    p.add_argument("run_id")
    p.add_argument("--force", action="store_true", help="run it even if it already completed")
    p.add_argument("--yes", action="store_true",
                   help="run the recorded command even from a store that is not private to you nor trusted")
    p.set_defaults(func=cmd_resume)
    p = sub.add_parser("journal", parents=[common], help="the run's journal events, one per line")
    p.add_argument("run_id")
    p.add_argument("--json", action="store_true", help="the events as JSON lines")
    p.set_defaults(func=cmd_journal)
    p = sub.add_parser("settle", parents=[common], help="record by hand the outcome of an uncertain tool call")
    p.add_argument("run_id")
    p.add_argument("call_id")
    p.add_argument("--result", metavar="JSON", help="what the tool returned (JSON)")
    p.add_argument("--error", metavar="TEXT", help="the tool failed with this message")
    p.set_defaults(func=cmd_settle)
    add_checkpoint_commands(sub, common)
    add_proxy_command(sub, common)
    add_trust_commands(sub, common)
    p = sub.add_parser("verify", parents=[common], help="check journals' integrity (hash chain, journaled figures)")
    p.add_argument("run_ids", nargs="*", metavar="RUN", help="runs to check (default: every run)")
    p.set_defaults(func=cmd_verify)
    p = sub.add_parser("serve", parents=[common], help="run the HTTP journal service in front of a store")
    p.add_argument("backing", nargs="?", metavar="STORE_URL",
                   help="the store to serve (default: --store, $CARAVANSERAI_STORE or ./.caravanserai)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--token", help="bearer token clients must present (default: $CARAVANSERAI_HTTP_TOKEN; "
                                   "prefer the variable: arguments show in ps)")
    p.add_argument("--ssl-certfile", metavar="PEM")
    p.add_argument("--ssl-keyfile", metavar="PEM")
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser("store", parents=[common], help="store administration: `store init URL` creates SQL tables")
    store_sub = p.add_subparsers(dest="store_command", required=True)
    q = store_sub.add_parser("init", help="create the tables of a sqlite:// or postgresql:// store")
    q.add_argument("url")
    q.set_defaults(func=cmd_store_init)
    p = sub.add_parser("clean", parents=[common], help="delete a run's checkpoints")
    p.add_argument("run_id")
    p.set_defaults(func=cmd_clean)
    return parser


def run_command(argv: Sequence[str]) -> int:
    """Parse and run one command, letting its errors propagate (the ``%caravanserai`` magic uses this)."""
    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # what follows `--` is a command to run (proxy)
    args = build_parser().parse_args(argv[:cut])
    if cut < len(argv):
        if not hasattr(args, "program"):
            raise UsageError(f"`--` takes a command only after `caravanserai proxy`, not after `{args.command}`")
        args.program = [*args.program, *argv[cut + 1:]]
    if not hasattr(args, "store"):
        args.store = None
    return args.func(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; errors are one line on stderr: exit 1, or 2 for bad usage."""
    try:
        return run_command(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        print(f"caravanserai: error: {exc.message}", file=sys.stderr)
        return 2
    except CaravanseraiError as exc:
        print(f"caravanserai: error: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
