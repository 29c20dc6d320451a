"""``caravanserai key``, ``trust``, ``sign`` and the signature part of ``verify``: who signed what a
reader could run, and which signers (or stores) this person trusts (``signing``, ``runs.trust``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from . import signing
from .errors import UsageError
from .runs.api import readable_run_id
from .runs.lifecycle import require_events
from .runs.signed_items import review, sign_run
from .runs.trust import TRUST_ENV, trust_store_always, trusted_store_urls
from .stores import open_store

__all__ = ["add_trust_commands", "signature_report"]


def cmd_key(args: argparse.Namespace) -> int:
    me = signing.identity()
    if args.quiet:
        print(me.public)
        return 0
    print(f"{me.public}\n(your public key, from {me.path}: give it to colleagues, who run "
          f"`caravanserai trust --key {me.public} --name YOUR_NAME`)")
    return 0


def cmd_trust(args: argparse.Namespace) -> int:
    if args.key:
        path = signing.add_trusted_key(args.key, args.name or "")
        print(f"trusted {args.key} ({args.name or 'no name'}): what it signs loads and runs for you (in {path})")
        return 0
    if args.store is not None:
        store = open_store(args.store)
        path = trust_store_always(store.url)
        print(f"trusted the store {store.url}: everything in it loads and runs for you, signed or not (in {path})")
        return 0
    for key, name in signing.trusted_keys().items():
        print(f"key\t{key}\t{name}")
    for url in trusted_store_urls():
        print(f"store\t{url}")
    print(f"(trust a colleague's key: caravanserai trust --key KEY --name NAME; a store: --store URL or {TRUST_ENV})")
    return 0


def cmd_sign(args: argparse.Namespace) -> int:
    store = open_store(args.store)
    run_id = readable_run_id(args.run_id, store)
    reviewed = review(run_id, require_events(run_id, store), store)
    bad = next((r for r in reviewed if r.invalid is not None), None)
    if bad is not None:
        assert bad.invalid is not None
        raise type(bad.invalid)(f"{bad.invalid.message}; caravanserai sign does not sign an altered item: nothing was signed",
                                **bad.invalid.fields)
    chosen = [r.item for r in reviewed if r.verdict is not None and (r.verdict.key is None or r.verdict.by != "yours")]
    if not chosen:
        print(f"nothing to sign in run {run_id!r}: every item is signed with your key" if reviewed
              else f"run {run_id!r} holds nothing to sign (no pickled value, launch command or output)")
        return 0
    me = signing.identity()
    print(f"run {run_id!r} in {store.url}: sign with your key {signing.short(me.public)} ({me.path}):")
    for item in chosen:
        print(f"  {item.what}: {item.about}")
    if not args.yes:
        if not sys.stdin.isatty():
            raise UsageError(f"look at the {len(chosen)} item(s) above, then run again with --yes to sign them; "
                             "nothing was signed")
        if input(f"sign these {len(chosen)} item(s)? [y/N] ").strip().lower() not in ("y", "yes"):
            print("nothing was signed")
            return 1
    sign_run(run_id, store, chosen)
    print(f"signed {len(chosen)} item(s) of run {run_id!r}")
    return 0


def signature_report(run_id: str, events: Sequence[dict], store: Any, lines: Sequence[str]) -> tuple[list[str], int]:
    """``verify``'s lines about a run's signatures, and how many of them are problems (a signature that
    does not verify; in a store opened with ``?signed=1``, a journal line not signed by a trusted key)."""
    out, problems = [], 0
    keys = signing.trusted_keys()
    by_signer: dict[str, list[str]] = {}
    for reviewed in review(run_id, events, store):
        item, verdict = reviewed.item, reviewed.verdict
        if reviewed.invalid is not None:
            problems += 1
            out.append(f"{run_id}\tBAD SIGNATURE\t{reviewed.invalid.message}")
            continue
        if verdict is not None and verdict.ignored:
            problems += 1
            out.append(f"{run_id}\tBAD SIGNATURE\t{verdict.ignored} signature(s) that `caravanserai sign` events add to "
                       f"{item.what} do not verify (forged or altered): left out")
        if verdict is not None and verdict.key is not None:
            who = keys.get(verdict.key) or f"{signing.short(verdict.key)}, not trusted"
            by_signer.setdefault(f"{who} ({signing.short(verdict.key)})" if who in keys.values() else who, []).append(
                item.label)
        else:
            by_signer.setdefault("no one" + (" (trusted store)" if verdict and verdict.trusted else
                                              f": `caravanserai sign {run_id}` after looking"), []).append(item.label)
    if by_signer:
        out.insert(0, f"{run_id}\tsigned\t" + "; ".join(f"{', '.join(labels)} by {who}" for who, labels in by_signer.items()))
    signers: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        found = signing.line_signature(line)
        if found is not None and not found[1]:
            problems += 1
            out.append(f"{run_id}\tBAD SIGNATURE\tjournal line {number}: its signature does not verify (edited or forged)")
        elif store.journal_signer is not None and (found is None or found[0] not in keys):
            problems += 1
            who = "is not signed" if found is None else f"is signed by {signing.short(found[0])}, a key you do not trust"
            out.append(f"{run_id}\tUNSIGNED\tjournal line {number} {who}: written by someone without a trusted key")
        elif found is not None:
            name = keys.get(found[0], signing.short(found[0]))
            signers[name] = signers.get(name, 0) + 1
    if signers:
        by = ", ".join(f"{count} by {name}" for name, count in signers.items())
        out.append(f"{run_id}\tjournal\t{sum(signers.values())} of {len(lines)} lines signed ({by})")
    return out, problems


def add_trust_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register key, trust and sign on the CLI's subparsers."""
    p = sub.add_parser("key", parents=[common], help="your public signing key (made on first use), to give to colleagues")
    p.add_argument("--quiet", action="store_true", help="the key alone")
    p.set_defaults(func=cmd_key)
    p = sub.add_parser("trust", parents=[common],
                       help="trust a colleague's signing key (--key), or everything in the store given by --store "
                            "(only one no one else can write); no option: list what you trust")
    p.add_argument("--key", metavar="PUBLIC_KEY", help="ed25519:… as `caravanserai key` prints it")
    p.add_argument("--name", help="who the key belongs to, as verify and errors will name it")
    p.set_defaults(func=cmd_trust)
    p = sub.add_parser("sign", parents=[common],
                       help="sign a run's unsigned pickles, command and output with your key, after showing them")
    p.add_argument("run_id")
    p.add_argument("--yes", action="store_true", help="sign without asking (after looking at what it lists)")
    p.set_defaults(func=cmd_sign)
