"""The trust rule for what a reader could execute or render as active content: a pickled value, a
recorded launch command, a re-shown rich output bundle ("items").

An item is used only if a signature on it verifies against the reader's own key or a key the
reader trusts (``caravanserai.signing``), or the store is trusted explicitly (``trust_store`` /
``%caravanserai trust URL`` / ``caravanserai trust --store URL`` / ``CARAVANSERAI_TRUSTED_STORES``).
A signature that is present and does not verify is refused always (``SignatureInvalid``), whatever
else holds. Who owns the files plays no part: an unpacked colleague's store is the reader's too.

A signature sits on the item (``signed``: ``{"key", "sig"}``) when it is written, or comes later in
a ``signed`` event appended by ``caravanserai sign RUN`` (the journal is append-only), which names
each item by kind, name and SHA-256.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import signing
from ..errors import SignatureInvalid
from ..journal import canonical

__all__ = ["TRUST_ENV", "Verdict", "describe", "item_bytes", "judge", "launch_payload", "resigned", "sign_digest",
           "sign_item", "store_trusted", "trust_store", "trust_store_always", "trusted_store_urls"]

TRUST_ENV = "CARAVANSERAI_TRUSTED_STORES"
_TRUSTED: set[str] = set()
_WHAT = {"pickle": "pickled variable {name!r}", "command": "the recorded launch command", "display": "the cell's recorded output"}
Resigned = dict[tuple[str, str, str], list[dict]]


def trust_store(url: str) -> None:
    """Trust everything in the store at ``url`` in this process (only for stores you control)."""
    _TRUSTED.add(url)


def _trusted_stores_file() -> Path:
    return signing.data_dir() / "trusted_stores"


def trusted_store_urls() -> list[str]:
    """The stores this person trusted explicitly: this process's, ``CARAVANSERAI_TRUSTED_STORES`` and lasting ones."""
    urls = [*_TRUSTED, *(u.strip() for u in os.environ.get(TRUST_ENV, "").split(",") if u.strip())]
    try:
        urls += [line.strip() for line in _trusted_stores_file().read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError):
        pass
    return list(dict.fromkeys(urls))


def _listed(url: str) -> bool:
    try:
        return url in _trusted_stores_file().read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return False


def store_trusted(url: str) -> bool:
    """True if the user trusted the store ``url`` explicitly: ``trust_store``, ``CARAVANSERAI_TRUSTED_STORES``,
    or ``caravanserai trust --store``."""
    return url in trusted_store_urls()


def trust_store_always(url: str) -> Path:
    """Trust the store ``url`` from now on, in every process of this person (``caravanserai trust --store``)."""
    path = _trusted_stores_file()
    if not _listed(url):
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as out:
            out.write(url + "\n")
    return path


def describe(kind: str, name: str) -> str:
    """An item as a message names it: ``pickled variable 'model'``, ``the recorded launch command``."""
    return _WHAT.get(kind, kind + " {name!r}").format(name=name)


def sign_item(kind: str, name: str, payload: bytes) -> dict[str, str] | None:
    """This person's signature on an item, as the item carries it (``{"key", "sig"}``); None when they
    have no usable key (``signing.signer`` says so once): the item is written unsigned."""
    me = signing.signer()
    return None if me is None else {"key": me.public, "sig": me.sign(signing.item_message(kind, name,
                                                                                          signing.sha256(payload)))}


def sign_digest(kind: str, name: str, sha256: str) -> dict[str, str]:
    """This person's signature on an item known by its SHA-256 (``caravanserai sign``: KeyFileInvalid without a key)."""
    me = signing.identity()
    return {"key": me.public, "sig": me.sign(signing.item_message(kind, name, sha256))}


def launch_payload(event: dict) -> bytes:
    """The bytes a recorded launch's signature covers: what would run, and where."""
    return item_bytes({k: event.get(k) for k in ("command", "orig_argv", "cwd")})


def item_bytes(value: Any) -> bytes:
    """A JSON item's bytes as signed: canonical JSON; a lone surrogate (an undecodable argv byte) passes
    through here, and the journal then refuses it with its own one-line error."""
    return canonical(value).encode("utf-8", "surrogatepass")


def resigned(events: Iterable[dict]) -> Resigned:
    """The signatures ``caravanserai sign`` appended, by (kind, name, sha256) of the item they cover."""
    found: Resigned = {}
    for event in events:
        if event.get("type") != "signed" or not isinstance(event.get("items"), list):
            continue
        for item in event["items"]:
            if isinstance(item, dict) and all(isinstance(item.get(k), str) for k in ("kind", "name", "sha256")):
                found.setdefault((item["kind"], item["name"], item["sha256"]), []).append(item)
    return found


@dataclass(frozen=True)
class Verdict:
    """Whether an item may be used: ``by`` says on whose word ("yours", a trusted key's name, "trusted
    store"), or why not ("unsigned", "signed by a key you do not trust"); ``key`` signed it, if anyone;
    ``ignored`` counts signatures in ``signed`` events that did not verify (left out, for ``verify``)."""

    trusted: bool
    by: str
    key: str | None = None
    ignored: int = 0

    def refusal(self, run_id: str, kind: str, name: str, store_url: str) -> str:
        """Why the item was not used and what to do, in one sentence (for an untrusted verdict)."""
        what = describe(kind, name)
        if self.key is None:
            return (f"{what} of run {run_id!r} is not signed (written by an older caravanserai, or not by you): "
                    f"if it is yours, look at it and sign it with `caravanserai sign {run_id}`, or trust the store with "
                    f"`caravanserai trust --store {store_url}`")
        return (f"{what} of run {run_id!r} is signed by {self.key}, a key you do not trust: if you trust its author, "
                f"run `caravanserai trust --key {self.key}`")


def judge(kind: str, name: str, payload: bytes | str, signed: Any, *, run_id: str, store_url: str,
          resigned_items: Resigned | None = None) -> Verdict:
    """The trust rule for one item (``payload``: its bytes as signed, or their SHA-256 in hex).

    SignatureInvalid if the signature the item carries does not verify. A signature a ``signed`` event
    added that does not verify is left out (``Verdict.ignored``): anyone who can append could add one,
    and it must not make an intact item unusable. Otherwise: trusted by a key, by the store's explicit
    trust, or not at all."""
    digest = payload if isinstance(payload, str) else signing.sha256(payload)
    message = signing.item_message(kind, name, digest)
    keys = signing.trusted_keys()
    found: list[str] = []
    if signed is not None:
        key = signed.get("key") if isinstance(signed, dict) else None
        if not (isinstance(key, str) and signing.verify(key, message, signed.get("sig"))):
            shown = signing.short(key) if key is not None else "no key"
            raise SignatureInvalid(
                f"the signature on {describe(kind, name)} of run {run_id!r} does not verify ({shown}): it was "
                "altered, or the item was swapped after signing; refused, nothing was loaded or run",
                run_id=run_id, item=name, kind=kind, key=shown)
        found.append(key)
    ignored = 0
    for record in (resigned_items or {}).get((kind, name, digest), []):
        key = record.get("key")
        if isinstance(key, str) and signing.verify(key, message, record.get("sig")):
            found.append(key)
        else:
            ignored += 1
    trusted = next((key for key in found if key in keys), None)
    if trusted is not None:
        return Verdict(True, keys[trusted], trusted, ignored)
    unknown = found[0] if found else None
    if store_trusted(store_url):
        return Verdict(True, "trusted store", unknown, ignored)
    return Verdict(False, "unsigned" if unknown is None else "signed by a key you do not trust", unknown, ignored)
