"""The items of a run that the trust rule covers, found in its journal without loading any of them:
what ``caravanserai verify`` reports per run, what ``caravanserai sign RUN`` shows and signs, and
which launch ``caravanserai resume`` would run (``launch_of``: the same one for all three)."""

from __future__ import annotations

import base64
import binascii
import io
import pickle
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import signing
from ..errors import ObjectNotFound, ResumeError, SignatureInvalid
from ..events import Segments
from ..stores import Store
from .lifecycle import append_event, require_events
from .trust import Verdict, describe, item_bytes, judge, launch_payload, resigned, sign_digest

__all__ = ["Item", "Reviewed", "first_launch", "items", "launch_of", "review", "sign_run"]

_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def shown(text: str, limit: int = 200) -> str:
    """``text`` read from a store, safe to print: control and bidi characters escaped, cut to ``limit``."""
    text = _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
    return text if len(text) <= limit else text[:limit] + "…"


@dataclass(frozen=True)
class Item:
    """One signable item: ``kind`` (pickle, command, display), ``name``, the SHA-256 of its bytes, the
    signature it carries (or None) and ``about``: what a person checks before signing it."""

    kind: str
    name: str
    sha256: str
    signed: Any
    about: str

    @property
    def what(self) -> str:
        return describe(self.kind, self.name)

    @property
    def label(self) -> str:
        """Short, for a list: ``launch command``, ``output``, ``pickle 'model'``."""
        return {"command": "launch command", "display": "output"}.get(self.kind, f"{self.kind} {self.name!r}")


@dataclass(frozen=True)
class Reviewed:
    """An item and the trust rule's answer for it: a verdict, or the SignatureInvalid it raised."""

    item: Item
    verdict: Verdict | None
    invalid: SignatureInvalid | None = None


def first_launch(events: Sequence[dict]) -> dict | None:
    """The first of the run's own attempts that records its command (a fork's copied ones are its parent's)."""
    segments = Segments()
    return next((e for e in events if segments.feed(e) == "attempt" and (e.get("orig_argv") or e.get("command"))), None)


def launch_of(run_id: str, events: Sequence[dict], store: Any) -> tuple[str, Sequence[dict], dict]:
    """(the run whose launch it is, that run's events, the launch event) for ``resume``. A fork never run
    resumes by its parent's command with the parent's run id argument replaced by the fork's; ResumeError
    when there is none, or the parent's command does not name its run id."""
    launch = first_launch(events)
    if launch is not None:
        return run_id, events, launch
    parent = Segments.of(events).parent
    if parent is None:
        raise ResumeError(
            f"run {run_id!r} has no recorded command (written by {events[0].get('imported_from') or 'an old version'}); "
            "re-run the script that created it", run_id=run_id)
    parent_events = require_events(parent, store)
    launch = first_launch(parent_events)
    command = launch and (launch.get("orig_argv") or launch.get("command"))
    if launch is None or not isinstance(command, list) or parent not in command[1:]:
        raise ResumeError(f"run {run_id!r} is a fork of {parent!r}, whose command does not take its run id as an "
                          f"argument; continue it from Python with caravanserai.durable({run_id!r}) around the same code",
                          run_id=run_id)
    return parent, parent_events, launch


def items(events: Iterable[dict], launch: dict | None = None, objects: Any = None, run_id: str = "") -> list[Item]:
    """Every pickled value and recorded output bundle in ``events``, and ``launch`` (``launch_of``), once
    each. With ``objects`` (the store's object face), a pickle stored there is read to list its imports."""
    found: dict[tuple[str, str, str], Item] = {}

    def add(item: Item) -> None:
        found.setdefault((item.kind, item.name, item.sha256), item)

    if launch is not None:
        command = launch.get("orig_argv") or launch.get("command")
        where = f" (in {launch['cwd']})" if isinstance(launch.get("cwd"), str) else ""
        add(Item("command", "launch", signing.sha256(launch_payload(launch)), launch.get("launch_signed"),
                 shown(shlex.join(map(str, command if isinstance(command, list) else [])) + where, 400)))
    for event in events:
        names = event.get("names")
        saved = names.get("values") if isinstance(names, dict) else None
        for name, entry in (saved.items() if isinstance(saved, dict) else ()):
            payload, digest = _pickle(entry, objects, run_id)
            if digest is not None:
                kind = entry.get("type") if isinstance(entry.get("type"), str) else "a value of unrecorded type"
                add(Item("pickle", str(name), digest, entry.get("signed"),
                         f"recorded as {shown(kind, 120)}, sha256 {digest[:12]}; {_imports(payload)}"))
        result = event.get("result") if event.get("type") == "run_completed" else None
        display = result.get("display") if isinstance(result, dict) else None
        if isinstance(result, dict) and isinstance(display, dict):
            formats = "; ".join(f"{shown(str(k), 40)}: {shown(str(v), 160)!r}" for k, v in sorted(display.items(), key=str))
            add(Item("display", "result", signing.sha256(item_bytes(display)), result.get("display_signed"), formats))
    return list(found.values())


def _pickle(entry: Any, objects: Any, run_id: str) -> tuple[bytes | None, str | None]:
    """(its bytes if at hand, their SHA-256) for a pickled value's entry; (None, None) if it is not one."""
    if not isinstance(entry, dict) or entry.get("codec") != "pickle":
        return None, None
    if isinstance(entry.get("object"), str):
        try:
            payload = objects.get(f"values/{run_id}/{entry['object']}") if objects is not None else None
        except ObjectNotFound:
            payload = None
        return payload, entry["object"]
    try:
        payload = base64.b64decode(entry.get("data", ""), validate=True)
    except (binascii.Error, TypeError, ValueError):
        return None, None
    return payload, signing.sha256(payload)


class _Stub:
    """Stands in for every class and function a pickle names while ``_imports`` reads it: calling,
    building or filling it does nothing, so reading the pickle runs none of its code."""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Stub:
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Stub:
        return _Stub()

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        pass

    def extend(self, values: Any) -> None:
        pass


class _Lister(pickle.Unpickler):
    """An unpickler that records each ``module.name`` a pickle asks for and hands it a ``_Stub`` instead
    of importing it (the documented way to restrict globals: ``find_class``)."""

    def __init__(self, payload: bytes) -> None:
        super().__init__(io.BytesIO(payload))
        self.names: list[str] = []

    def find_class(self, module: str, name: str) -> Any:
        self.names.append(f"{module}.{name}")
        return _Stub

    def persistent_load(self, pid: Any) -> Any:
        return _Stub()


def _imports(payload: bytes | None) -> str:
    """What loading the pickle would import and call, read from the pickle itself (nothing is imported
    or run: every global is a ``_Stub``), not from the type name its writer recorded."""
    if payload is None:
        return "its bytes were not read"
    lister = _Lister(payload)
    try:
        lister.load()
    except Exception as exc:  # a damaged pickle, or one a stub cannot stand in for: say so
        if not lister.names:
            return f"its bytes are not a readable pickle ({type(exc).__name__})"
    unique = list(dict.fromkeys(lister.names))
    listed = ", ".join(shown(n, 80) for n in unique[:12]) + (" …" if len(unique) > 12 else "")
    return f"loading it imports and may call {listed}" if unique else "loading it imports nothing"


def review(run_id: str, events: Sequence[dict], store: Any) -> list[Reviewed]:
    """Each item of the run with the trust rule's answer, nothing loaded (the launch ``resume`` would run,
    a fork's parent's included)."""
    try:
        source, source_events, launch = launch_of(run_id, events, store)
    except ResumeError:
        source, source_events, launch = run_id, events, None
    again = resigned([*source_events, *events] if source != run_id else events)
    out = []
    for item in items(events, launch, store.objects, run_id):
        owner = source if item.kind == "command" else run_id
        try:
            out.append(Reviewed(item, judge(item.kind, item.name, item.sha256, item.signed, run_id=owner,
                                            store_url=store.url, resigned_items=again)))
        except SignatureInvalid as exc:
            out.append(Reviewed(item, None, exc))
    return out


def sign_run(run_id: str, store: Store, chosen: Sequence[Item]) -> dict:
    """Append a ``signed`` event carrying this person's signature on each of ``chosen``; returns it."""
    me = signing.identity()
    event = {"type": "signed", "by": me.public,
             "items": [{"kind": i.kind, "name": i.name, "sha256": i.sha256, **sign_digest(i.kind, i.name, i.sha256)}
                       for i in chosen]}
    return append_event(store, run_id, event)
