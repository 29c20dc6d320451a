"""What a ``%%resumable`` cell does when it runs (the ``with`` block the transformer writes).

Entering: open the cell's run (``durable()`` semantics: one writer, identity = the digest of the
cell's source), restore the variables saved with its last commit, and make it the current run so
``checkpoint(state, note)``, ``resumable_iterate(items)`` and journaled calls use it. While the
body runs, every waypoint or progress commit also saves the cell's variables (and which top-level
statement was running). On resume, a top-level assignment that ran before that statement and
whose names were restored is skipped, so ``total = 0`` does not undo the restored ``total``.
Leaving: complete the run (keeping the printed output and the last expression's text), record
the failure of an exception, or leave the run pending on Kernel > Interrupt.
"""

from __future__ import annotations

import argparse
import difflib
import shlex
import sys
import time
from typing import Any, Literal

from caravanserai.calls.ledger import calls_text
from caravanserai.cli import ArgumentParser
from caravanserai.errors import CellChanged
from caravanserai.errors import UsageError as CaravanseraiUsageError
from caravanserai.journal import digest
from caravanserai.runs.fork import code_diff, fork
from caravanserai.runs.lifecycle import RunScope
from caravanserai.runs.snapshots import Snapshotter
from caravanserai.runs.trust import item_bytes, judge, resigned, sign_item
from caravanserai.stores import open_store

OUTPUT_LIMIT = 64 * 1024


def parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="%%resumable", add_help=False,
                       usage="%(prog)s RUN_ID [--store URL] [--state a,b] [--every N] [--fork NEW_ID | --from RUN@N] [--restart]",
                                description="Run a cell as a durable run that survives kernel restarts.")
    p.add_argument("run_id")
    p.add_argument("--store", help="store URL (default: %%caravanserai store, $CARAVANSERAI_STORE or ./.caravanserai)")
    p.add_argument("--state", help="comma-separated names to save (default: every name the cell assigns)")
    p.add_argument("--every", type=_positive, help="save the variables at most every N commits (default: every commit)")
    p.add_argument("--fork", metavar="NEW_ID", help="continue from the run's last waypoint under a new run id")
    p.add_argument("--from", dest="from_", metavar="RUN@N", type=_run_at,
                   help="start this run as a fork of RUN at its waypoint N (RUN alone: its last waypoint)")
    p.add_argument("--restart", action="store_true", help="start again from scratch (the old attempt stays in history)")
    return p


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def _run_at(text: str) -> tuple[str, int | None]:
    run_id, _, at = text.partition("@")
    if not run_id or (at and not at.isdigit()):
        raise ValueError(text)
    return run_id, int(at) if at else None


def parse_args(line: str) -> argparse.Namespace | None:
    """The magic line's arguments; None for ``--help`` (the help is printed). Bad ones: IPython's UsageError."""
    from IPython.core.error import UsageError

    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"%%resumable {line}: {exc}") from None
    if "-h" in words or "--help" in words:
        print(parser().format_help())
        return None
    try:
        return parser().parse_args(words)
    except CaravanseraiUsageError as exc:
        raise UsageError(f"%%resumable: {exc.message}") from None


class _Tee:
    """Writes go to the real stream and are kept (bounded) to re-show a completed cell's output."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.parts: list[str] = []
        self.size = 0

    def write(self, text: str) -> int:
        if self.size < OUTPUT_LIMIT:
            self.parts.append(text[: OUTPUT_LIMIT - self.size])
            self.size += len(text)
        return self.stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


#: What a completed cell re-shows from a store that is neither private to this user nor trusted:
#: formats a front end renders inert. HTML, JavaScript, SVG (which can hold script), Markdown
#: (which can hold HTML) and widget views are dropped, so a forged ``run_completed`` event cannot
#: put script into the notebook.
INERT_FORMATS = ("text/plain", "image/png", "image/jpeg")


def shown_bundle(recorded: dict, run: Any) -> dict | None:
    """The recorded display bundle to re-show: every string format when its signature verifies against a
    key the reader trusts (or the store is trusted), only ``INERT_FORMATS`` otherwise; SignatureInvalid
    for a signature that does not verify (runs.trust)."""
    bundle = recorded.get("display")
    if not isinstance(bundle, dict):
        return None
    verdict = judge("display", "result", item_bytes(bundle), recorded.get("display_signed"),
                    run_id=run.run_id, store_url=run.store.url, resigned_items=resigned(run.opened_events))
    kept = {k: v for k, v in bundle.items() if isinstance(k, str) and isinstance(v, str)
            and (verdict.trusted or k in INERT_FORMATS)}
    return kept or None


def signed_bundle(bundle: dict | None) -> dict:
    """A display bundle as the completed event records it, signed with this person's key."""
    if bundle is None:
        return {}
    signed = sign_item("display", "result", item_bytes(bundle))
    return {"display": bundle} if signed is None else {"display": bundle, "display_signed": signed}


class _Recorded:
    """A completed cell's last value, shown as the front end showed it, without recomputing it."""

    def __init__(self, text: str, bundle: dict | None = None) -> None:
        self.text = text
        self.bundle = bundle or {"text/plain": text}

    def __repr__(self) -> str:
        return self.bundle.get("text/plain", self.text)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        return dict(self.bundle)


class CellRun:
    """The context manager ``%%resumable`` wraps a cell's body in."""

    def __init__(self, line: str, source: str, *, names: tuple = (), assignments: tuple = ()) -> None:
        from IPython import get_ipython

        self.shell = get_ipython()
        self.namespace = self.shell.user_ns if self.shell is not None else sys.modules["__main__"].__dict__
        args = parse_args(line)
        self.help = args is None  # `%%resumable --help`: the help was printed, the cell does not run
        self.args = args or argparse.Namespace(run_id="", store=None, state=None, every=None, fork=None, from_=None,
                                               restart=False)
        self.args.from_run, self.args.from_at = self.args.from_ or (None, None)
        self.source = source
        explicit = [n.strip() for n in (self.args.state or "").split(",") if n.strip()]
        self.names = explicit or [n for n in names if not n.startswith("__caravanserai")]
        self.defined = set(names)  # names the cell binds (its classes included): deferred restores wait for them
        self.strict = explicit
        self.assignments = {index: set(targets) for index, targets in assignments}
        self.execute = True
        self.result: Any = None
        self.stmt = 0
        self.resume_at: int | None = None
        self.restored: set[str] = set()
        self.deferred: dict = {}
        self.run: Any = None
        self.scope: Any = None
        self.status: Any = None
        self._commits = 0
        self._tee: _Tee | None = None

    # ---- called from the transformed cell ---------------------------------------------------
    def at(self, index: int) -> None:
        self.stmt = index
        if self.deferred:  # a class defined earlier in this cell may exist now
            pending, self.deferred = self.deferred, {}
            self.snapshot.restore(pending, self.deferred, definable=self.defined)

    def keep(self, index: int) -> bool:
        """False for a top-level assignment already done before the last save (its names restored)."""
        targets = self.assignments.get(index)
        if self.resume_at is None or index >= self.resume_at or not targets:
            return True
        return not targets <= self.restored

    @property
    def shown(self) -> Any:
        return self.result

    # ---- the with block ----------------------------------------------------------------------
    def __enter__(self) -> CellRun:
        if self.help:
            self.execute = False
            return self
        store = open_store(self.args.store)
        definition = digest({"cell": self.source})
        run_id = self.args.fork or self.args.run_id
        source = self.args.run_id if self.args.fork else self.args.from_run
        if source is not None and not store.load(run_id):  # once: re-running the cell resumes the fork
            fork(source, at=self.args.from_at, new_run_id=run_id, store=store,
                 started={"definition_sha256": definition, "cell_source": self.source})
        self.scope = RunScope(run_id, store, not_failures=(CellChanged,))
        self.run = run = self.scope.__enter__()
        self.scope.ending = False  # until the cell's body runs, leaving records nothing
        try:
            self._prepare(run, store, definition)
        except BaseException:
            self.scope.__exit__(*sys.exc_info())
            raise
        self.scope.ending = True
        self.status = StatusLine(self.shell, run, how=self._how(run), restored=self.restored, completed=not self.execute,
                                 snapshot=self.snapshot)
        self._tee = _Tee(sys.stdout)
        sys.stdout = self._tee
        return self

    def _how(self, run: Any) -> str | None:
        """How this attempt began, for the status line: restarted, a fork's first attempt, resumed, or None (new)."""
        if self.args.restart:
            return "restarted"
        origin = run.segments.parent
        if origin is not None and run.attempt == 1:
            return f"forked from {origin}"
        return "resumed" if self.restored or run.attempt > 1 else None

    def _prepare(self, run: Any, store: Any, definition: str) -> None:
        """Check the cell's source against the run's, restart it if asked, put its variables back."""
        events = run.opened_events
        if events and not self.args.restart:
            _check_source(run, definition, self.source)
        run.describe(cell_source=self.source, definition_sha256=definition)
        if self.args.restart and events:
            run.append({"type": "restarted", "definition_sha256": definition, "cell_source": self.source})
        self.snapshot = Snapshotter(self.namespace, self.names, objects=store.objects, run_id=run.run_id,
                                    store_url=store.url, strict=self.strict, resigned=resigned(events))
        saved = run.notebook.saved
        if saved.get("values"):
            self.restored = set(self.snapshot.restore(saved["values"], self.deferred, definable=self.defined))
            self.restored |= set(self.deferred)  # restored once their class is defined (see at())
            self.resume_at = saved.get("at")
        if run.completed_event is not None and not self.args.restart:
            self.execute = False  # completed: re-show, don't recompute
        run.notebook.capture = self._capture
        run.notebook.listeners.append(self._on_commit)

    def __exit__(self, etype: Any, error: Any, tb: Any) -> Literal[False]:  # never swallows the cell's error
        run = self.run
        if run is None:
            return False
        if self._tee is not None and sys.stdout is self._tee:
            sys.stdout = self._tee.stream
        try:
            if etype is None and self.execute:
                output = "".join(self._tee.parts) if self._tee else ""
                result: dict[str, Any] = {"stdout": output}
                if self.result is not None:
                    result["repr"] = repr(self.result)[:OUTPUT_LIMIT]
                    result.update(signed_bundle(self._bundle(self.result)))
                self.scope.result, self.scope.names = result, {"values": self._values(), "at": None}
            elif etype is None:
                self.scope.complete = False  # completed earlier: re-show its output, record nothing
                recorded = (run.completed_event or {}).get("result") or {}
                recorded = recorded if isinstance(recorded, dict) else {}  # data from the store, whatever its shape
                if isinstance(recorded.get("stdout"), str) and recorded["stdout"]:
                    sys.stdout.write(recorded["stdout"])
                if "repr" in recorded:
                    self.result = _Recorded(str(recorded["repr"]), shown_bundle(recorded, run))
        finally:
            run.notebook.capture = None
            if self._on_commit in run.notebook.listeners:
                run.notebook.listeners.remove(self._on_commit)
            if self.status is not None:
                self.status.finish(etype)
            self.scope.__exit__(etype, error, tb)
        return False

    def _bundle(self, value: Any) -> dict | None:
        """The value's display as the front end showed it (text/plain, text/html...), small formats only."""
        if self.shell is None:
            return None
        try:
            data, _ = self.shell.display_formatter.format(value)
        except Exception:
            return None
        kept = {k: v for k, v in data.items() if isinstance(v, str) and len(v) <= OUTPUT_LIMIT}
        return kept or None

    # ---- saving ------------------------------------------------------------------------------
    def _values(self) -> dict:
        return self.snapshot.capture()

    def _capture(self) -> dict | None:
        self._commits += 1
        every = self.args.every or 1
        if self._commits % every and self._commits != 1:
            return None  # --every N: this commit carries no variables (the last saved ones stay current)
        return {"values": self._values(), "at": self.stmt}

    def _on_commit(self, events: list[dict]) -> None:
        if self.status is not None:
            self.status.update(announce=True)


def _check_source(run: Any, definition: str, source: str) -> None:
    """Refuse a cell edited in the middle of its own run (CellChanged); a fork whose own first attempt
    has not run yet takes the edit (a what-if may change the code) and records the diff."""
    identity = run.segments.identity
    if identity.get("definition_sha256") in (None, definition):
        return
    old = identity.get("cell_source") or ""
    if run.segments.parent is not None and run.segments.number == 0:
        run.append({"type": "cell_edited", "definition_sha256": definition, "cell_source": source,
                    "code_changed": code_diff(old, source)})
        return
    diff = [line for line in difflib.unified_diff(old.splitlines(), source.splitlines(), "started with", "now",
                                                  lineterm="", n=0)
            if not line.startswith(("---", "+++", "@@"))][:6]
    changed = "; ".join(diff) or "the cell's source"
    raise CellChanged(
        f"run {run.run_id!r} was started by a different version of this cell ({changed}): use "
        f"`%%resumable {run.run_id} --fork NEW_ID` to continue from its last waypoint under a new id, or "
        f"`%%resumable {run.run_id} --restart` to start it again",
        run_id=run.run_id, field="definition_sha256",
    )


class StatusLine:
    """One line under the cell, updated in place: waypoints, last note, calls, tokens, cost, resume."""

    def __init__(self, shell: Any, run: Any, *, how: str | None, restored: set[str], completed: bool,
                 snapshot: Any = None) -> None:
        self.run = run
        self.snapshot = snapshot
        self.announced: tuple = ((), ())
        self.how = how
        self.restored = sorted(restored)
        self.completed = completed
        self.rich = shell is not None and type(shell).__name__ == "ZMQInteractiveShell"
        self.handle = None
        self.hint = ""
        self.shown_at = 0.0
        text = self.text()
        if self.rich:
            from IPython.display import display

            self.hint = run.run_id  # while it runs the line names the magic; at the end a button opens the panels
            self.handle = display(_Text(text, self.hint), display_id=True)
        else:
            print(text)

    def text(self, ending: str = "") -> str:
        run = self.run
        receipt = run.receipt()
        latest = run.latest
        parts = [f"[caravanserai] {run.run_id}"]
        if self.completed:
            parts.append("completed earlier: output re-shown, nothing recomputed")
        elif self.how:
            parts.append(f"{self.how} (attempt {run.attempt}"
                         + (f", restored {', '.join(self.restored)}" if self.restored else "") + ")")
        parts.append(f"{run.waypoint_count} waypoint(s)")
        done = sum(run.loops.done.values())
        if done:
            parts.append(f"{done} item(s) done")
        if latest is not None:
            parts.append(f"last: {latest.note[:60]!r}")
        if receipt.calls:
            parts.append(f"{calls_text(len(receipt.calls))}, {receipt.tokens} tokens, {receipt.usd_text()} (inferred)")
        parts.extend(self.warnings())
        if ending:
            parts.append(ending)
        return " | ".join(parts)

    def warnings(self) -> list[str]:
        """Variables saved with pickle or not saved at all, by name (said at save time, not after a crash)."""
        snapshot = self.snapshot
        if snapshot is None:
            return []
        out = []
        if snapshot.skipped:
            out.append("not saved: " + ", ".join(f"{name} ({kind})" for name, kind in snapshot.skipped.items()))
        if snapshot.pickled:
            out.append(f"pickled: {', '.join(snapshot.pickled)} (signed with your key)")
        return out

    def update(self, *, force: bool = False, announce: bool = False) -> None:
        """Refresh the line (at most every 0.25 s), at once when the set of unsaved or pickled names changed."""
        now = time.monotonic()
        changed = False
        if announce and self.snapshot is not None:
            current = (tuple(self.snapshot.skipped), tuple(self.snapshot.pickled))
            changed, self.announced = current != self.announced, current
        if self.handle is not None and (force or changed or now - self.shown_at > 0.25):
            self.shown_at = now
            self.handle.update(_Text(self.text(), self.hint))
        elif self.handle is None and changed and any(self.announced):
            print(f"[caravanserai] {self.run.run_id}: " + " | ".join(self.warnings()), file=sys.stderr)

    def finish(self, etype: Any) -> None:
        ending = "done" if etype is None else "interrupted: run again to resume" if etype is KeyboardInterrupt else "failed"
        if self.handle is not None:
            # The button comes when the cell ends, not before: a widget made by an execution that
            # is then SIGKILLed keeps JupyterLab (4.x) from running the cells after the restart.
            link = _dashboard_link(self.run)
            if link is not None:
                self.hint = ""
            self.handle.update(_Text(self.text(ending), self.hint))
            if link is not None:
                from IPython.display import display

                display(link)
        elif not self.completed:
            print(self.text(ending))


def _dashboard_link(run: Any) -> Any:
    """The status line's link to the run's panels (a button that opens them), when widgets are installed."""
    try:
        from caravanserai.widgets import DashboardLink
    except ImportError:  # no [notebook] extra: the line names the magic instead
        return None
    return DashboardLink(run.run_id, run.store)


class _Text:
    """The status line: text, and in HTML the command that opens the run's panels (``run_id``: when
    no "timeline ▸" button is shown under it)."""

    def __init__(self, text: str, run_id: str = "") -> None:
        self.text = text
        self.run_id = run_id

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        import html

        panel = (f' <span style="color:#1f6feb">· timeline: <code>%caravanserai show {html.escape(self.run_id)}</code>'
                 "</span>") if self.run_id else ""
        return (f'<div class="caravanserai-status" style="font-family:monospace;font-size:12px;color:#555">'
                f"{html.escape(self.text)}{panel}</div>")
