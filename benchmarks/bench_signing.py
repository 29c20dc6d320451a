"""What per-person Ed25519 signing costs: per saved variable, per journal append, and raw.

    python benchmarks/bench_signing.py            # full: 7 interleaved rounds, 500 local / 2,000 memory appends each (~1 min)
    python benchmarks/bench_signing.py --quick    # a smoke run: 1 round, 30 / 200 appends, few repeats (seconds)

Everything runs in this process. ``CARAVANSERAI_KEY_FILE`` and ``XDG_DATA_HOME`` point into a fresh
temp dir first (removed at the end), so the benchmark makes and uses its own key and never reads or
touches yours (nor your trusted keys or stores). Stores live in a fresh ``bench-signing-XXXX`` next
to the repo (the real disk, not tmpfs; ``--dir`` moves it), deleted afterwards (``--keep``).

1. **Per saved variable.** A custom-class instance (pickled: neither JSON nor typed JSON fits) of
   ~1 kB and of ~1 MB. Timed one call at a time: ``pickle.dumps`` alone (the unsigned
   save) against ``runs.snapshots.encode_value`` (the JSON and typed-JSON attempts, the pickle,
   then ``runs.trust.sign_item``: SHA-256 of the payload + an Ed25519 signature), and
   ``sign_item`` alone. Loading: ``pickle.loads`` alone against ``runs.trust.judge`` (SHA-256,
   trusted keys, verify) and a full ``Snapshotter.decode`` of the entry ``Snapshotter.capture``
   saved in a local store (inline base64 for the small one, the object face for the large one).
2. **Per append.** ``with durable(run_id, store=URL) as run: run.checkpoint({...}, "step")``, 20
   untimed, then N timed one at a time, on a local directory store (one fdatasync per append: the
   fsync floor underneath) with ``file:///abs/path`` against ``file:///abs/path?signed=1``, and on
   ``memory://`` (no fsync: the raw signing overhead) plain against ``?signed=1``. The four run in
   a rotated order every round; the disk's floor (``os.write`` + ``os.fdatasync`` of a 300 B line)
   is sampled in each round. Per variant: the median over rounds of the per-round median; ratios
   and differences are taken within a round, then their median. Also the bytes a signature adds to
   a journal line (measured on the written journals, whose signed lines are all verified).
3. **Raw Ed25519** (``cryptography``) sign and verify of a journal line, next to caravanserai's
   wrappers (``Identity.sign``, ``signing.verify``, ``line_signer``, ``line_signature``).

The per-call timings of 1. and 3. are split in ``--chunks`` rounds of all the operations, the order
rotated each round (a shared 2-vCPU VM's speed drifts): median over rounds of each round's median.

Prints tables and the ratios "signed / unsigned" and "signing cost / fsync floor"; raw numbers in
``benchmarks/results/signing.json``. A report, not a test: exit status 0 (no targets judged).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pickle
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import (
    REPO,
    describe,
    fmt_bytes,
    fmt_load,
    fmt_ratio,
    fsync_floor,
    install_fsync_counter,
    loadavg,
    machine_notes,
    md_table,
    median_of,
    parse_args,
    save_results,
    say,
    time_each,
    workdir,
)
from _common import fmt_time as fmt_t

FSYNC = install_fsync_counter()  # os.fsync/os.fdatasync counted and timed, before caravanserai is imported

sys.path.insert(0, str(REPO))
import caravanserai  # noqa: E402
from caravanserai import durable, open_store  # noqa: E402
from caravanserai.runs.snapshots import Snapshotter, encode_value  # noqa: E402
from caravanserai.runs.trust import TRUST_ENV, judge, sign_item  # noqa: E402
from caravanserai.signing import (  # noqa: E402
    KEY_ENV,
    TRUSTED_KEYS_ENV,
    identity,
    item_message,
    line_signature,
    line_signer,
    verify,
)
from caravanserai.stores.local.views import RENDERER  # noqa: E402

FLOOR_RECORD = b"x" * 299 + b"\n"  # about a signed checkpoint line
SIG_FIELD = ',"sig":"'


class Payload:
    """A user's own class: not JSON, not a dataclass or pydantic model, so it is saved with pickle."""

    def __init__(self, name: str, step: int, scores: list[float], blob: bytes) -> None:
        self.name, self.step, self.scores, self.blob = name, step, scores, blob


def make_payload(target: int) -> Payload:
    """A ``Payload`` whose pickle is about ``target`` bytes."""
    rng = random.Random(target)
    scores = [rng.random() for _ in range(8)]
    empty = len(pickle.dumps(Payload("model", 7, scores, b""), protocol=pickle.HIGHEST_PROTOCOL))
    return Payload("model", 7, scores, rng.randbytes(max(0, target - empty - 8)))


def med_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def interleaved(ops: dict[str, Callable[[], Any]], n: int, chunks: int) -> dict[str, dict]:
    """Each op called ``n`` times, timed one call at a time, in ``chunks`` rounds of all ops (the order
    rotated each round: a shared VM's CPU drifts); the median over rounds of each round's median (us)."""
    names = list(ops)
    per = max(1, n // chunks)
    for name in names:
        time_each(max(2, per // 5), lambda _i, fn=ops[name]: fn())  # warm up
    medians: dict[str, list[float]] = {name: [] for name in names}
    for index in range(chunks):
        for name in names[index % len(names):] + names[:index % len(names)]:
            medians[name].append(med_us(time_each(per, lambda _i, fn=ops[name]: fn())))
    return {name: {"median_us": statistics.median(m), "min_round_us": min(m), "max_round_us": max(m),
                   "n": per * chunks, "rounds": chunks} for name, m in medians.items()}


def fmt_u(us: float | None) -> str:
    return fmt_t(None if us is None else us / 1e6)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


# ---- 1. per saved variable ----------------------------------------------------------------------
def bench_values(root: Path, sizes: dict[str, int], reps: dict[str, int], chunks: int) -> dict:
    store = open_store(str(root / "values-store"))
    return {label: bench_value(store, label, make_payload(target), reps[label], chunks)
            for label, target in sizes.items()}


def bench_value(store: Any, label: str, value: Payload, n: int, chunks: int) -> dict:
    """Save and load costs of one value, signed and not (median per call)."""
    name, run_id = f"obj_{label.replace(' ', '')}", f"values-{label.replace(' ', '')}"
    codec, payload, extra = encode_value(name, value)
    if codec != "pickle":
        sys.exit(f"the {label} value was saved as {codec!r}, not pickle: the benchmark measures nothing")
    snap = Snapshotter({name: value}, [name], objects=store.objects, run_id=run_id, store_url=store.url, strict=[name])
    entry = snap.capture()[name]
    if snap.decode(name, entry).blob != value.blob:
        sys.exit(f"Snapshotter.decode of the {label} value did not give it back")
    row: dict[str, Any] = {
        "pickle_bytes": len(payload),
        "where": "object face" if "object" in entry else "inline (base64)",
        **interleaved({
            "dumps": lambda: pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL),
            "encode_value": lambda: encode_value(name, value),
            "sign_item": lambda: sign_item("pickle", name, payload),
            "sha256": lambda: hashlib.sha256(payload).hexdigest(),
            "loads": lambda: pickle.loads(payload),  # noqa: S301 - our own bytes
            "judge": lambda: judge("pickle", name, payload, extra["signed"], run_id=run_id, store_url=store.url),
            "decode": lambda: snap.decode(name, entry),
        }, n, chunks),
    }
    m = {k: v["median_us"] for k, v in row.items() if isinstance(v, dict)}
    row["derived"] = {
        "signing_cost_us": m["encode_value"] - m["dumps"],
        "other_attempts_us": m["encode_value"] - m["dumps"] - m["sign_item"],
        "save_signed_over_unsigned": ratio(m["encode_value"], m["dumps"]),
        "dumps_plus_sign_item_over_dumps": ratio(m["dumps"] + m["sign_item"], m["dumps"]),
        "decode_without_judge_us": m["decode"] - m["judge"],
        "load_signed_over_unsigned": ratio(m["decode"], m["decode"] - m["judge"]),
        "judge_over_loads": ratio(m["judge"], m["loads"]),
    }
    return row


# ---- 2. per append -------------------------------------------------------------------------------
def append_variant(url: str, run_id: str, n: int, warmup: int) -> dict:
    RENDERER.flush()
    with durable(run_id, store=url) as run:
        for i in range(warmup):
            run.checkpoint({"step": -1 - i, "total": 0}, "warmup")
        calls, seconds = FSYNC.calls, FSYNC.seconds
        cpu0, t0 = time.thread_time(), time.perf_counter()
        samples = time_each(n, lambda i: run.checkpoint({"step": i, "total": i * 2}, "step"))
        wall, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
        fsyncs, fsync_s = FSYNC.calls - calls, FSYNC.seconds - seconds
    RENDERER.flush()
    return {"url": url, "run_id": run_id, "n": n, **describe(samples), "wall_per_append_us": wall / n * 1e6,
            "thread_cpu_per_append_us": cpu / n * 1e6, "fsyncs_per_append": fsyncs / n,
            "fsync_us_per_append": fsync_s / n * 1e6}


def bench_appends(root: Path, args: argparse.Namespace) -> dict:
    variants = {
        "local": ("local dir", f"file://{root / 'local-plain'}", args.n_local),
        "local_signed": ("local dir ?signed=1", f"file://{root / 'local-signed'}?signed=1", args.n_local),
        "memory": ("memory://", "memory://bench-signing-plain", args.n_memory),
        "memory_signed": ("memory:// ?signed=1", "memory://bench-signing-signed?signed=1", args.n_memory),
    }
    order = list(variants)
    rounds = []
    for index in range(args.rounds):
        current: dict[str, Any] = {}
        rotated = order[index % len(order):] + order[:index % len(order)]
        say(f"round {index + 1}/{args.rounds}: {', '.join(rotated)} ...")
        floor = fsync_floor(root, args.n_floor, FLOOR_RECORD)
        current["floor"] = describe(floor)
        for key in rotated:
            _label, url, n = variants[key]
            current[key] = append_variant(url, f"r{index + 1}-{key}", n, args.warmup)
        rounds.append(current)

    summary: dict[str, Any] = {"labels": {k: v[0] for k, v in variants.items()},
                               "urls": {k: v[1] for k, v in variants.items()}}
    for key in ["floor", *order]:
        summary[key] = {m: median_of(r[key].get(m) for r in rounds)
                        for m in ("median_us", "p99_us", "mean_us", "thread_cpu_per_append_us", "fsyncs_per_append",
                                  "fsync_us_per_append")}
    for kind in ("local", "memory"):
        signed = f"{kind}_signed"
        summary[f"{kind}_ratio"] = median_of(ratio(r[signed]["median_us"], r[kind]["median_us"]) for r in rounds)
        summary[f"{kind}_added_us"] = median_of(r[signed]["median_us"] - r[kind]["median_us"] for r in rounds)
        summary[f"{kind}_added_cpu_us"] = median_of(r[signed]["thread_cpu_per_append_us"]
                                                    - r[kind]["thread_cpu_per_append_us"] for r in rounds)
        summary[f"{kind}_added_over_floor"] = median_of(
            ratio(r[signed]["median_us"] - r[kind]["median_us"], r["floor"]["median_us"]) for r in rounds)
    summary["local_over_floor"] = median_of(ratio(r["local"]["median_us"], r["floor"]["median_us"]) for r in rounds)
    summary["local_signed_over_floor"] = median_of(ratio(r["local_signed"]["median_us"], r["floor"]["median_us"])
                                                   for r in rounds)
    summary["bytes"] = journal_bytes(root / "local-plain", root / "local-signed")
    return {"rounds": rounds, "summary": summary}


def journal_lines(store_dir: Path) -> list[str]:
    return [line for path in sorted(store_dir.rglob("journal.jsonl"))
            for line in path.read_text(encoding="utf-8").splitlines() if line]


def journal_bytes(plain_dir: Path, signed_dir: Path) -> dict:
    """What a signature adds: per signed line (the line against its body without ``"sig"``), and the
    journals' bytes per line; every signed line verified with ``line_signature``."""
    plain, signed = journal_lines(plain_dir), journal_lines(signed_dir)
    added = [len(line.encode()) - len((line[: line.rindex(SIG_FIELD)] + "}").encode()) for line in signed
             if SIG_FIELD in line]
    verdicts = [line_signature(line) for line in signed]
    mine = identity().public
    return {
        "plain_lines": len(plain), "signed_lines": len(signed),
        "plain_bytes_per_line": statistics.fmean(len(x.encode()) + 1 for x in plain) if plain else None,
        "signed_bytes_per_line": statistics.fmean(len(x.encode()) + 1 for x in signed) if signed else None,
        "added_per_line": statistics.median(added) if added else None,
        "lines_with_sig": len(added),
        "lines_verified": sum(1 for v in verdicts if v is not None and v[1] and v[0] == mine),
    }


# ---- 3. raw Ed25519 ------------------------------------------------------------------------------
def bench_raw(n: int, chunks: int, line: str) -> dict:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    public = key.public_key()
    message = line.encode("utf-8")
    raw_sig = key.sign(message)
    me = identity()
    sig = me.sign(message)
    signer = line_signer()
    signed_line = line[:-1] + f'{SIG_FIELD}{signer(message)}"}}'
    if line_signature(signed_line) != (me.public, True):
        sys.exit("line_signature did not verify a line signed with line_signer")
    item = item_message("pickle", "obj", "0" * 64)
    return {
        "message_bytes": len(message),
        **interleaved({
            "ed25519_sign": lambda: key.sign(message),
            "ed25519_verify": lambda: public.verify(raw_sig, message),
            "identity_sign": lambda: me.sign(message),
            "signing_verify": lambda: verify(me.public, message, sig),
            "line_signer": lambda: signer(message),
            "line_signature": lambda: line_signature(signed_line),
            "identity_lookup": identity,
            "sign_item_message": lambda: me.sign(item),
        }, n, chunks),
    }


# ---- report --------------------------------------------------------------------------------------
def report(out: dict, args: argparse.Namespace) -> None:
    values, appends, raw = out["values"], out["appends"]["summary"], out["raw"]
    m = out["machine"]
    say()
    say(f"caravanserai {out['versions']['caravanserai']}, cryptography {out['versions']['cryptography']}, "
        f"Python {m['python']}, {m['cpu_count']} CPUs, {m['mount']['fstype']} on {m['mount']['device']}; load average "
        f"{fmt_load(m.get('loadavg_start'))} before, {fmt_load(out.get('loadavg_end'))} after; "
        f"{'QUICK (figures mean nothing)' if args.quick else 'full run'}")

    say("\n1. Per saved variable: a custom-class instance saved with pickle (median per call)\n")
    cols = list(values)
    v = {k: values[k] for k in cols}
    rows = [
        ("pickle bytes", *(fmt_bytes(v[k]["pickle_bytes"]) for k in cols)),
        ("saved as", *(v[k]["where"] for k in cols)),
        ("pickle.dumps alone (unsigned save)", *(fmt_u(v[k]["dumps"]["median_us"]) for k in cols)),
        ("encode_value (signed save)", *(fmt_u(v[k]["encode_value"]["median_us"]) for k in cols)),
        ("  signing cost = encode_value - dumps", *(fmt_u(v[k]["derived"]["signing_cost_us"]) for k in cols)),
        ("  of which sign_item (SHA-256 + Ed25519)", *(fmt_u(v[k]["sign_item"]["median_us"]) for k in cols)),
        ("    of which SHA-256 of the pickle", *(fmt_u(v[k]["sha256"]["median_us"]) for k in cols)),
        ("  the rest: the JSON and typed-JSON attempts", *(fmt_u(v[k]["derived"]["other_attempts_us"]) for k in cols)),
        ("  signed / unsigned (encode_value / dumps)",
         *(fmt_ratio(v[k]["derived"]["save_signed_over_unsigned"]) for k in cols)),
        ("  signed / unsigned ((dumps + sign_item) / dumps)",
         *(fmt_ratio(v[k]["derived"]["dumps_plus_sign_item_over_dumps"]) for k in cols)),
        ("pickle.loads alone (unsigned load)", *(fmt_u(v[k]["loads"]["median_us"]) for k in cols)),
        ("runs.trust.judge (verify)", *(fmt_u(v[k]["judge"]["median_us"]) for k in cols)),
        ("Snapshotter.decode of the saved entry", *(fmt_u(v[k]["decode"]["median_us"]) for k in cols)),
        ("  decode without judge", *(fmt_u(v[k]["derived"]["decode_without_judge_us"]) for k in cols)),
        ("  signed / unsigned (decode / decode - judge)",
         *(fmt_ratio(v[k]["derived"]["load_signed_over_unsigned"]) for k in cols)),
    ]
    say("\n".join(md_table(["per value", *(f"~{k}" for k in cols)], rows)))

    say(f"\n2. Per append: durable() + run.checkpoint(), median of {args.rounds} round(s) of per-round medians\n")
    labels = appends["labels"]
    rows = []
    for key in ("local", "local_signed", "memory", "memory_signed"):
        s = appends[key]
        rows.append((labels[key], fmt_u(s["median_us"]), fmt_u(s["p99_us"]), fmt_u(s["thread_cpu_per_append_us"]),
                     f"{s['fsyncs_per_append']:.2f}", fmt_u(s["fsync_us_per_append"])))
    f = appends["floor"]
    rows.append(("fsync floor: write + fdatasync, 300 B", fmt_u(f["median_us"]), fmt_u(f["p99_us"]), "", "1.00", ""))
    say("\n".join(md_table(["per append", "median", "p99", "CPU (thread)", "fsyncs", "fsync wait"], rows)))
    b = appends["bytes"]
    say()
    rows = [
        ("local dir (fdatasync per append)", fmt_ratio(appends["local_ratio"]), fmt_u(appends["local_added_us"]),
         fmt_u(appends["local_added_cpu_us"]), f"{appends['local_added_over_floor']:.2f}"),
        ("memory:// (no fsync)", fmt_ratio(appends["memory_ratio"]), fmt_u(appends["memory_added_us"]),
         fmt_u(appends["memory_added_cpu_us"]), f"{appends['memory_added_over_floor']:.2f}"),
        ("line_signer alone (one line)", "", fmt_u(raw["line_signer"]["median_us"]), "",
         f"{raw['line_signer']['median_us'] / f['median_us']:.2f}"),
    ]
    say("\n".join(md_table(["signing, per append", "signed / unsigned", "signing cost (added)", "added CPU",
                            "signing cost / fsync floor"], rows)))
    say(f"\nlocal dir: plain {fmt_ratio(appends['local_over_floor'])} of the fsync floor, signed "
        f"{fmt_ratio(appends['local_signed_over_floor'])}")
    say(f"bytes per journal line: +{b['added_per_line']:.0f} B for the signature "
        f"(plain {b['plain_bytes_per_line']:.0f} B/line, signed {b['signed_bytes_per_line']:.0f} B/line on average); "
        f"{b['lines_verified']}/{b['signed_lines']} signed lines verified with line_signature, "
        f"{b['lines_with_sig']} carry a sig")

    say(f"\n3. Raw Ed25519 (cryptography), a {raw['message_bytes']} B journal line, median per call\n")
    rows = [
        ("Ed25519PrivateKey.sign", fmt_u(raw["ed25519_sign"]["median_us"])),
        ("Ed25519PublicKey.verify", fmt_u(raw["ed25519_verify"]["median_us"])),
        ("Identity.sign (+ base64)", fmt_u(raw["identity_sign"]["median_us"])),
        ("signing.verify (parse key + verify)", fmt_u(raw["signing_verify"]["median_us"])),
        ("line_signer (a signed journal line's sig)", fmt_u(raw["line_signer"]["median_us"])),
        ("line_signature (check a signed line)", fmt_u(raw["line_signature"]["median_us"])),
        ("identity() (cached; stats the key file)", fmt_u(raw["identity_lookup"]["median_us"])),
    ]
    say("\n".join(md_table(["operation", "median"], rows)))
    say(f"\nelapsed {out['elapsed_s']:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds of the append variants (default 7)")
    parser.add_argument("--n-local", type=int, default=500, help="timed appends per local-store variant and round")
    parser.add_argument("--n-memory", type=int, default=2000, help="timed appends per memory:// variant and round")
    parser.add_argument("--n-floor", type=int, default=200, help="fsync floor samples per round")
    parser.add_argument("--warmup", type=int, default=20, help="untimed appends first (default 20)")
    parser.add_argument("--small-reps", type=int, default=2000, help="timed calls per operation, ~1 kB value")
    parser.add_argument("--large-reps", type=int, default=100, help="timed calls per operation, ~1 MB value")
    parser.add_argument("--raw-reps", type=int, default=5000, help="timed calls per raw Ed25519 operation")
    parser.add_argument("--chunks", type=int, default=10, help="interleaved rounds the per-call timings are split in")
    args = parse_args(parser, "signing", quick={"rounds": 1, "n_local": 30, "n_memory": 200, "n_floor": 30,
                                                "warmup": 5, "small_reps": 200, "large_reps": 6, "raw_reps": 300,
                                                "chunks": 2})
    started = time.perf_counter()
    keys = Path(tempfile.mkdtemp(prefix="caravanserai-bench-key-"))  # never the user's own key
    saved_env = {k: os.environ.get(k) for k in (KEY_ENV, "XDG_DATA_HOME", TRUSTED_KEYS_ENV, TRUST_ENV,
                                                "CARAVANSERAI_SIGNING_KEY")}
    os.environ[KEY_ENV] = str(keys / "signing_key")
    os.environ["XDG_DATA_HOME"] = str(keys / "data")  # trusted keys and stores: none but this key
    for name in (TRUSTED_KEYS_ENV, TRUST_ENV, "CARAVANSERAI_SIGNING_KEY"):
        os.environ.pop(name, None)
    try:
        import cryptography

        me = identity()
        say(f"signing key: {me.path} ({me.public[:16]}…), made for this run")
        with workdir("bench-signing-", args, tmpfs_note=": the per-append figures are CPU only") as (root, mount):
            out: dict[str, Any] = {
                "machine": machine_notes() | {"mount": mount, "workdir": str(root)},
                "versions": {"caravanserai": caravanserai.__version__, "cryptography": cryptography.__version__},
                "config": {k: v for k, v in vars(args).items() if k not in ("out", "dir")},
            }
            say("1. per saved variable ...")
            out["values"] = bench_values(root, {"1 kB": 1_000, "1 MB": 1_000_000},
                                         {"1 kB": args.small_reps, "1 MB": args.large_reps}, args.chunks)
            say("2. per append ...")
            out["appends"] = bench_appends(root, args)
            say("3. raw Ed25519 ...")
            line = journal_lines(root / "local-plain")[-2]  # a waypoint line, as a signed journal signs it
            out["raw"] = bench_raw(args.raw_reps, args.chunks, line)
        out["loadavg_end"] = loadavg()
        out["elapsed_s"] = time.perf_counter() - started
        report(out, args)
        save_results(args.out, out)
    finally:
        shutil.rmtree(keys, ignore_errors=True)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return 0


if __name__ == "__main__":
    sys.exit(main())
