"""The items of a run that the trust rule covers, found in its journal without loading any of them:
what ``caravanserai verify`` reports per run and what ``caravanserai sign RUN`` shows and signs."""

from __future__ import annotations

import base64
import binascii
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import signing
from ..errors import SignatureInvalid
from ..journal import canonical
from ..stores import Store
from .lifecycle import append_event
from .trust import Verdict, describe, judge, launch_payload, resigned, sign_digest

__all__ = ["Item", "Reviewed", "items", "review", "sign_run"]


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


def items(events: Iterable[dict]) -> list[Item]:
    """Every pickled value, recorded launch command and recorded output bundle in ``events``, once each."""
    found: dict[tuple[str, str, str], Item] = {}

    def add(item: Item) -> None:
        found.setdefault((item.kind, item.name, item.sha256), item)

    for event in events:
        names = event.get("names")
        saved = names.get("values") if isinstance(names, dict) else None
        for name, entry in (saved.items() if isinstance(saved, dict) else ()):
            digest = _pickle_digest(entry)
            if digest is not None:
                kind = entry.get("type") if isinstance(entry.get("type"), str) else "a value of unrecorded type"
                add(Item("pickle", str(name), digest, entry.get("signed"), f"{kind[:120]}, sha256 {digest[:12]}"))
        command = event.get("orig_argv") or event.get("command")
        if isinstance(command, list) and event.get("type") in ("run_started", "attempt"):
            where = f" (in {event['cwd']})" if isinstance(event.get("cwd"), str) else ""
            add(Item("command", "launch", signing.sha256(launch_payload(event)), event.get("launch_signed"),
                     shlex.join(map(str, command)) + where))
        result = event.get("result") if event.get("type") == "run_completed" else None
        display = result.get("display") if isinstance(result, dict) else None
        if isinstance(result, dict) and isinstance(display, dict):
            text = str(display.get("text/plain", ""))[:60].replace("\n", " ")
            add(Item("display", "result", signing.sha256(canonical(display).encode("utf-8")), result.get("display_signed"),
                     f"{', '.join(sorted(map(str, display)))}: {text!r}"))
    return list(found.values())


def _pickle_digest(entry: Any) -> str | None:
    """The SHA-256 of a pickled value's bytes as saved (inline base64 or a stored object), None if it is not one."""
    if not isinstance(entry, dict) or entry.get("codec") != "pickle":
        return None
    if isinstance(entry.get("object"), str):
        return entry["object"]
    try:
        return signing.sha256(base64.b64decode(entry.get("data", ""), validate=True))
    except (binascii.Error, TypeError, ValueError):
        return None


def review(run_id: str, events: Sequence[dict], store_url: str) -> list[Reviewed]:
    """Each item of the run with the trust rule's answer, nothing loaded."""
    again = resigned(events)
    out = []
    for item in items(events):
        try:
            out.append(Reviewed(item, judge(item.kind, item.name, item.sha256, item.signed, run_id=run_id,
                                            store_url=store_url, resigned_items=again)))
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
