"""CheckpointLog on the real disk: delta storage, load by chain depth, fork cost at step k of 10,000.

    python benchmarks/bench_checkpoints.py            # full: a 10,000-step log (~5 min on a quiet 2 vCPU VM)
    python benchmarks/bench_checkpoints.py --quick    # a smoke run: a 40-step log, few samples (seconds)

Everything runs in this process, against ``LocalDirectoryStore`` in a fresh ``bench-ckpt-XXXX``
next to the repo (the real disk, not tmpfs; ``--dir`` moves it), deleted afterwards (``--keep``).

1. **Storage.** A 50-step ``DurableAgent`` run, one checkpoint per step, committed to a
   ``CheckpointLog`` with ``parent=`` the previous step (deltas, a full checkpoint every
   ``max_chain=16`` links), against the same 50 checkpoints stored in full (sum of their bytes, and
   a second log committed without parents). Every id is loaded back through a fresh log and
   compared byte for byte.
2. **Load by chain depth.** ``log.load(id)`` at depth 1 and depth 16, each sample with a FRESH
   ``CheckpointLog`` (its in-memory cache cannot help; the OS page cache is warm), and with a warm
   log (same object, id already loaded). On the 50-step log and near the end of the big log.
3. **Fork at step k of an N-step log** (N = 10,000, ``--steps``; 40 with ``--quick``; prompts
   ``"prompt {i}"``, so the last checkpoint is ~20 MB, mostly fake KV). The log is built once
   (``run_until_step(i)`` + ``commit(ckpt, parent=id of step i-1, step=i)``) and reused by every
   sample. ``--log every`` commits every step (the default up to 2,000 steps; 10,000 steps take
   1-2.5 h here, as each commit of bytes decodes and checks the whole run); ``--log chains`` (the default above 2,000) runs
   the same agent through every step but commits only the chains the measurements read, steps
   0-16 and the last three chains (9,962-9,999), each segment starting at a step where the
   every-step log holds a full checkpoint, so those objects are byte for byte the same.
   ``log.fork(id_at_step_k, agent.prompt_node_ids[k], "new prompt")`` is timed with a fresh
   log per sample at k = 10 and k = N-10; the fork's object and record are deleted after each
   sample (untimed), so every sample does the same real write. Separately: fork, then
   ``DurableAgent().resume_from(log.load(forked))`` for the remaining steps (that is resume, not fork).
   **The floor (issue 13).** For every fresh-log sample, ``hashlib.sha256`` of that fork's own
   checkpoint bytes (``log.load(fork)``, untimed; median of 7) is timed in the same run: a fork must
   hash its full checkpoint, since its id is that hash. Each position gets PASS/MISS against that
   floor: <= 3x for the warm log (the source already in the log's memory: the fork proper, its
   change plus one hash plus two durable writes) and <= 5x for a fresh log (issue 24: it also
   reads, verifies and parses the source), with the fsync time and the process CPU time beside it.
4. **Report.** A table with the peers' fork/load/storage figures quoted from
   ``shared/recipes/peers/durable-peers.md`` (context, not re-measured), PASS/MISS against the
   targets (a report: the exit status is 0 either way), raw numbers in
   ``benchmarks/results/checkpoints.json``. On a MISS, one sample of each missed operation is run
   under cProfile and the functions where the time goes are printed (and written next to the JSON).

``--log-dir DIR`` keeps the big log in DIR and reuses it on the next run with the same ``--steps``
and ``--log`` (worth it with ``--log every``).
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as _dt
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import (
    REPO,
    describe,
    fmt_load,
    install_fsync_counter,
    loadavg,
    machine_notes,
    md_table,
    parse_args,
    profile_rows,
    profile_text,
    save_results,
    say,
    say_verdict,
    time_each,
    workdir,
)
from _common import fmt_bytes as fmt_b
from _common import fmt_time as fmt_t

PEERS_DOC = "shared/recipes/peers/durable-peers.md"
FSYNC = install_fsync_counter()  # os.fsync/os.fdatasync counted and timed, before caravanserai is imported

sys.path.insert(0, str(REPO))
import caravanserai  # noqa: E402
from caravanserai.checkpoints import CheckpointLog, DurableAgent, LocalDirectoryStore  # noqa: E402

RUN_SMALL, RUN_FULL, RUN_BIG = "small-deltas", "small-full", "big"
MAX_CHAIN = 16
FORK_VALUE = "new prompt"
TARGET_MS = 5.0          # fork target (issue); also used for load, since every fork starts with a load
SAME_RATIO = 1.5         # "the same at both positions": slower median / faster median <= 1.5
FLOOR_RATIO = 3.0        # issue 13: a fork <= 3x the SHA-256 of its own checkpoint bytes, at both positions
FRESH_FLOOR_RATIO = 5.0  # issue 24: from a freshly opened log (which also reads and verifies the source), <= 5x


def prompts(n: int) -> list[str]:
    """The 50-step storage/load run: ~70-character prompts."""
    return [f"Step {i}: read the notes so far, then write the next finding in one line." for i in range(n)]


def short_prompts(n: int) -> list[str]:
    """The big log: short prompts, so the 10,000-step checkpoint stays ~20 MB (the fake backend keeps
    64 B of KV per context token, so a step costs ~1.9 KB of KV) and building the log stays ~25 min."""
    return [f"prompt {i}" for i in range(n)]


def chain_summary(steps: int) -> str:
    chosen = chain_steps(steps)
    runs, start = [], chosen[0]
    for a, b in zip(chosen, chosen[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start:,}-{a:,}")
            start = b
    return ", ".join(runs)


def keep_sampling(done: int, n: int, spent: float, budget: float, at_least: int) -> bool:
    """Take ``n`` samples, but stop after ``budget`` seconds once ``at_least`` are in."""
    return done < n and (done < at_least or spent < budget)


# ---- small helpers ---------------------------------------------------------------------------
def summary(samples: list[float]) -> dict:
    return describe(samples, scale=1, unit="") | {"samples": samples}


def git_notes() -> dict:
    """Which caravanserai was measured: version, file, git HEAD, local changes under caravanserai/."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "caravanserai"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head, dirty = "?", ""
    return {"caravanserai": getattr(caravanserai, "__version__", "?"), "caravanserai_file": caravanserai.__file__,
            "git_head": head, "package_modified_vs_head": bool(dirty)}


def tree_bytes(root: Path) -> dict:
    """Apparent bytes, allocated bytes (st_blocks) and file count under ``root``."""
    apparent = allocated = files = 0
    for folder, _dirs, names in os.walk(root):
        for name in names:
            st = os.stat(os.path.join(folder, name))
            apparent += st.st_size
            allocated += st.st_blocks * 512
            files += 1
    return {"apparent": apparent, "allocated": allocated, "files": files}


def fork_files(store: LocalDirectoryStore, run_id: str, cid: str) -> list[Path]:
    """The files a checkpoint's commit wrote: its record (``checkpoints/<run>/records/<id>.json``) and
    its object(s) (``checkpoints/<run>/objects/<id>...``: the key may carry the stored form, a delta's
    base, after the id)."""
    base = store.root / "checkpoints" / run_id
    return [p for p in [base / "records" / f"{cid}.json", *(base / "objects").glob(f"{cid}*")] if p.is_file()]


def drop_fork(store: LocalDirectoryStore, run_id: str, cid: str, known: set[str], since_ns: int | None = None) -> None:
    """Delete a fork's object and record, so the next sample writes them again (never a built id).

    With ``since_ns``: raise unless both were written after it, i.e. the sample really wrote them.
    """
    if cid in known:
        raise RuntimeError(f"fork produced an id already in the log ({cid}); refusing to delete it")
    files = fork_files(store, run_id, cid)
    if since_ns is not None:
        fresh = [p for p in files if p.stat().st_mtime_ns >= since_ns]
        if len(files) < 2 or len(fresh) != len(files):
            raise RuntimeError(f"the fork did not write its record and object in the sample ({files}, fresh {fresh})")
    for path in files:
        os.unlink(path)
    if fork_files(store, run_id, cid):
        raise RuntimeError(f"could not remove the fork {cid}")


def store_write_floor(store: LocalDirectoryStore, samples: int) -> dict:
    """One ``put_if_absent`` of 100 B (tmp write + fsync + link + dir fsync): a fork makes two."""
    times = time_each(samples, lambda i: store.put_if_absent(f"floor/obj-{i}", b"x" * 100))
    for i in range(samples):
        store.delete(f"floor/obj-{i}")
    return summary(times)


# ---- 1. storage of a 50-step run -------------------------------------------------------------
def bench_storage(root: Path, steps: int) -> dict:
    store = LocalDirectoryStore(root)
    deltas, full = CheckpointLog(store, RUN_SMALL, max_chain=MAX_CHAIN), CheckpointLog(store, RUN_FULL, max_chain=MAX_CHAIN)
    agent = DurableAgent().begin(prompts(steps))
    ids, blobs, parent = [], [], None
    for i in range(steps):
        blob = agent.run_until_step(i)
        parent = deltas.commit(blob, parent=parent, step=i)
        assert full.commit(blob, step=i) == parent
        ids.append(parent)
        blobs.append(blob)
    recs = [deltas.record(cid) for cid in ids]
    full_recs = [full.record(cid) for cid in ids]
    for cid, blob in zip(ids, blobs):   # every id rebuilt through a fresh log, byte for byte
        assert CheckpointLog(store, RUN_SMALL).load(cid) == blob, cid
    logical = sum(len(b) for b in blobs)
    delta_objects = sum(r.stored_bytes for r in recs)
    full_objects = sum(r.stored_bytes for r in full_recs)
    delta_disk = tree_bytes(root / "checkpoints" / RUN_SMALL)
    full_disk = tree_bytes(root / "checkpoints" / RUN_FULL)
    return {
        "steps": steps, "ids": ids,
        "depths": [r.depth for r in recs], "kinds": [r.kind for r in recs],
        "full_objects_in_delta_log": sum(r.kind == "full" for r in recs),
        "checkpoint_bytes": [len(b) for b in blobs], "stored_bytes": [r.stored_bytes for r in recs],
        "sum_full_checkpoints": logical, "delta_log_objects": delta_objects, "full_log_objects": full_objects,
        "ratio_objects": logical / delta_objects,
        "delta_log_disk": delta_disk, "full_log_disk": full_disk,
        "ratio_disk_apparent": full_disk["apparent"] / delta_disk["apparent"],
        "ratio_disk_allocated": full_disk["allocated"] / delta_disk["allocated"],
        "delta_bytes_median": statistics.median(r.stored_bytes for r in recs if r.kind == "delta"),
        "last_checkpoint_bytes": len(blobs[-1]),
        "store": store, "blobs": blobs,
    }


# ---- 2. load ---------------------------------------------------------------------------------
def time_loads(store: LocalDirectoryStore, run_id: str, cid: str, fresh_n: int, warm_n: int) -> dict:
    fresh, cpu = [], []
    for _ in range(fresh_n):
        log = CheckpointLog(store, run_id)
        c0 = time.process_time()
        t0 = time.perf_counter()
        log.load(cid)
        fresh.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    log = CheckpointLog(store, run_id)
    blob = log.load(cid)
    warm = time_each(warm_n, lambda _: log.load(cid))
    rec = log.record(cid)
    return {"id": cid, "step": rec.step, "depth": rec.depth, "checkpoint_bytes": len(blob),
            "fresh": summary(fresh), "fresh_cpu": summary(cpu), "warm": summary(warm)}


# ---- 3. the big log --------------------------------------------------------------------------
def chain_steps(steps: int) -> list[int]:
    """The steps ``--log chains`` commits: the first chain (steps 0-16, holding the fork at step 10)
    and the last chains (from the full checkpoint at 17*m, three chains before the end, to the last
    step). Each segment starts where the every-step log has a full checkpoint (a multiple of
    max_chain + 1), so every object of it is byte for byte the every-step log's object."""
    link = MAX_CHAIN + 1
    tail_start = max(link, link * ((steps - 1) // link - 2))
    return sorted(set(range(min(link, steps))) | set(range(tail_start, steps)))


def build_big_log(root: Path, steps: int, mode: str) -> dict:
    """Run a ``steps``-prompt DurableAgent and commit its checkpoints with parents (``mode``: every
    step, or only ``chain_steps``; the agent still runs every step)."""
    store = LocalDirectoryStore(root)
    log = CheckpointLog(store, RUN_BIG, max_chain=MAX_CHAIN)
    agent = DurableAgent().begin(short_prompts(steps))
    wanted = list(range(steps)) if mode == "every" else chain_steps(steps)
    ids: dict[int, str] = {}
    parent, logical, t_run, t_commit, first = None, 0, 0.0, 0.0, 0
    t_start = time.perf_counter()
    every = max(1, len(wanted) // 10)
    for n, i in enumerate(wanted):
        t0 = time.perf_counter()
        blob = agent.run_until_step(i)
        t1 = time.perf_counter()
        parent = log.commit(blob, parent=ids.get(i - 1), step=i)
        t_commit += time.perf_counter() - t1
        t_run += t1 - t0
        logical += len(blob)
        first = first or len(blob)
        ids[i] = parent
        if (n + 1) % every == 0 or n + 1 == len(wanted):
            elapsed = time.perf_counter() - t_start
            # a commit costs about its checkpoint's size, which grows linearly: extrapolate the bytes
            slope = (len(blob) - first) / max(1, i)
            rest = sum(first + slope * j for j in wanted[n + 1:])
            eta = elapsed * rest / logical
            say(f"   committed {n + 1:,}/{len(wanted):,} checkpoints (step {i:,}) in {elapsed:.0f} s "
                f"(checkpoint {len(blob):,} B){'' if n + 1 == len(wanted) else f', ~{eta:.0f} s to go (rough)'}")
    agent.run_until_step(steps - 1)
    for i, cid in ids.items():   # same structure as the every-step log: depth = step mod (max_chain + 1)
        depth = log.record(cid).depth
        if depth != i % (MAX_CHAIN + 1):
            raise RuntimeError(f"step {i} was committed at depth {depth}, expected {i % (MAX_CHAIN + 1)}")
    return {"steps": steps, "mode": mode, "committed": len(ids), "ids": ids, "outputs": agent.step_outputs(),
            "build_s": time.perf_counter() - t_start, "run_until_step_s": t_run, "commit_s": t_commit,
            "sum_full_checkpoints": logical, "last_checkpoint_bytes": len(blob)}


def open_big_log(log_dir: Path, steps: int, mode: str) -> tuple[dict, bool]:
    """Reuse a log kept by --log-dir (same steps, mode and prompts), or build it there."""
    manifest = log_dir / "bench-manifest.json"
    if manifest.is_file():
        info = json.loads(manifest.read_text())
        info["ids"] = {int(k): v for k, v in info.get("ids", {}).items()}
        if info.get("steps") == steps and info.get("mode") == mode and info.get("prompt0") == short_prompts(1)[0]:
            store = LocalDirectoryStore(log_dir)
            known = set(info["ids"].values())
            stray = [k for k in store.list(f"checkpoints/{RUN_BIG}/records/")
                     if k.rsplit("/", 1)[1].removesuffix(".json") not in known]
            for key in stray:   # forks left by an interrupted earlier run
                for path in fork_files(store, RUN_BIG, key.rsplit("/", 1)[1].removesuffix(".json")):
                    os.unlink(path)
            say(f"   reusing the {steps:,}-step log in {log_dir} (built {info.get('built_utc')}; "
                f"{len(stray)} stray forks removed)")
            return info, True
        say(f"   {log_dir} holds a different log: rebuilding it")
        shutil.rmtree(log_dir / "checkpoints", ignore_errors=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    info = build_big_log(log_dir, steps, mode)
    info["disk"] = tree_bytes(log_dir / "checkpoints" / RUN_BIG)
    info["built_utc"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    info["prompt0"] = short_prompts(1)[0]
    manifest.write_text(json.dumps(info))
    return info, False


def fork_samples(store: LocalDirectoryStore, k: int, src: str, node: str, known: set[str], n: int,
                 budget: float) -> dict:
    times, cpu, fsync_n, fsync_s, fresh_ids, stored, floors = [], [], [], [], set(), [], []
    t_start = time.perf_counter()
    while keep_sampling(len(times), n, time.perf_counter() - t_start, budget, 3):
        log = CheckpointLog(store, RUN_BIG)
        since = time.time_ns() - 1_000_000_000   # file timestamps use a coarse clock
        with FSYNC.delta() as fs:
            c0 = time.process_time()
            t0 = time.perf_counter()
            cid = log.fork(src, node, FORK_VALUE)
            elapsed = time.perf_counter() - t0
            cpu.append(time.process_time() - c0)
        rec = log.record(cid)
        floors.append(sha_floor(log.load(cid)))   # untimed: the floor, on this fork's own bytes
        times.append(elapsed)
        fsync_n.append(fs["calls"])
        fsync_s.append(fs["seconds"])
        fresh_ids.add(cid)
        stored.append({"kind": rec.kind, "depth": rec.depth, "stored_bytes": rec.stored_bytes,
                       "checkpoint_bytes": rec.checkpoint_bytes})
        drop_fork(store, RUN_BIG, cid, known, since)
    # warm: the source already loaded by this log object
    log = CheckpointLog(store, RUN_BIG)
    log.load(src)
    warm, warm_fsync, warm_cpu = [], [], []
    t_start = time.perf_counter()
    while keep_sampling(len(warm), max(n, 3), time.perf_counter() - t_start, budget / 2, 3):
        since = time.time_ns() - 1_000_000_000
        with FSYNC.delta() as fs:
            c0 = time.process_time()
            t0 = time.perf_counter()
            cid = log.fork(src, node, FORK_VALUE)
            warm.append(time.perf_counter() - t0)
            warm_cpu.append(time.process_time() - c0)
        warm_fsync.append(fs["seconds"])
        drop_fork(store, RUN_BIG, cid, known, since)
    src_rec = CheckpointLog(store, RUN_BIG).record(src)
    return {"k": k, "source": src, "source_depth": src_rec.depth, "source_bytes": src_rec.checkpoint_bytes,
            "node": node, "fork_ids": sorted(fresh_ids), "fresh": summary(times), "fresh_cpu": summary(cpu),
            "warm_source_cached": summary(warm), "warm_fsync_s": summary(warm_fsync), "warm_cpu": summary(warm_cpu),
            "floor_sha256": summary(floors),
            "fsyncs": statistics.median(fsync_n), "fsync_s": summary(fsync_s), "fork_record": stored[0]}


def sha_floor(blob: bytes, n: int = 7) -> float:
    """The physics of a fork: one ``hashlib.sha256`` over its full checkpoint bytes (median of ``n``)."""
    return statistics.median(time_each(n, lambda _: hashlib.sha256(blob).digest()))


def resume_samples(store: LocalDirectoryStore, k: int, src: str, node: str, known: set[str], n: int,
                   steps: int, original: list, budget: float) -> dict:
    rows: list[dict] = []
    t_start = time.perf_counter()
    while keep_sampling(len(rows), n, time.perf_counter() - t_start, budget, 1):
        log = CheckpointLog(store, RUN_BIG)
        since = time.time_ns() - 1_000_000_000
        t0 = time.perf_counter()
        cid = log.fork(src, node, FORK_VALUE)
        t1 = time.perf_counter()
        blob = log.load(cid)
        t2 = time.perf_counter()
        agent = DurableAgent()
        outputs = agent.resume_from(blob)
        t3 = time.perf_counter()
        ok = (agent.computed_steps == list(range(k, steps)) and outputs[:k] == original[:k]
              and all(o is not None for o in outputs))
        rows.append({"fork_s": t1 - t0, "load_s": t2 - t1, "resume_s": t3 - t2, "total_s": t3 - t0,
                     "steps_computed": len(agent.computed_steps), "checks_ok": ok,
                     "step_k_output_changed": outputs[k] != original[k]})
        drop_fork(store, RUN_BIG, cid, known, since)
    return {"k": k, "rows": rows, **{key: summary([r[key] for r in rows]) for key in ("fork_s", "load_s", "resume_s", "total_s")},
            "steps_computed": rows[0]["steps_computed"], "checks_ok": all(r["checks_ok"] for r in rows)}


# ---- profiling -------------------------------------------------------------------------------
KEY_FUNCS = [  # (file suffix, function) shown in the "where the time goes" breakdown
    ("checkpoints/log.py", "fork"), ("checkpoints/log.py", "load"), ("checkpoints/log.py", "_load_sections"),
    ("checkpoints/log.py", "record"), ("checkpoints/log.py", "_commit"), ("checkpoints/log.py", "make_delta"),
    ("checkpoints/log.py", "apply_delta"), ("checkpoints/log.py", "_remember"), ("checkpoints/log.py", "_read_object"),
    ("checkpoints/agent.py", "fork_change"), ("checkpoints/agent.py", "validate_header"),
    ("checkpoints/format.py", "encode"), ("checkpoints/format.py", "decode_identified"),
    ("checkpoints/format.py", "_parse_header"), ("checkpoints/format.py", "_value_items"),
    ("checkpoints/format.py", "edit"), ("checkpoints/format.py", "identify"),
    ("local/files.py", "write_file_atomic"), ("local/objects.py", "get"), ("local/objects.py", "exists"),
    ("encoder.py", "iterencode"), ("decoder.py", "raw_decode"),
    ("~", "<built-in method _hashlib.openssl_sha256>"), ("~", "<method 'update' of '_hashlib.HASH' objects>"),
    ("_common.py", "wrapper"),  # the fsync counter
]


def profile_call(label: str, fn: Callable[[], Any], out_dir: Path, repeat: int = 1,
                 after: Callable[[Any], None] | None = None) -> dict:
    """cProfile ``repeat`` calls of ``fn`` (``after(result)`` runs unprofiled between them); per-call figures."""
    prof = cProfile.Profile()
    wall = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        prof.enable()
        try:
            value = fn()
        finally:
            prof.disable()
        wall += time.perf_counter() - t0
        if after is not None:
            after(value)
    rows = [r | {"own_ms": r["own_s"] * 1e3, "cum_ms": r["cum_s"] * 1e3} for r in profile_rows(prof, per=repeat)]
    key = []
    for suffix, func in KEY_FUNCS:
        hits = [r for r in rows if r["func"] == func and r["file"].endswith(suffix)]
        if hits:
            name = "os.fsync (all calls)" if func == "wrapper" else f"{suffix.replace('~', '')}:{func}".lstrip(":")
            key.append({"name": name, "calls": sum(h["calls"] for h in hits),
                        "cum_ms": sum(h["cum_ms"] for h in hits), "own_ms": sum(h["own_ms"] for h in hits)})
    top_own = sorted(rows, key=lambda r: r["own_ms"], reverse=True)[:12]
    for r in top_own:
        r["where"] = f"{Path(r['file']).name}:{r['func']}" if r["file"] != "~" else r["func"]
    path = out_dir / f"checkpoints_profile_{''.join(c if c.isalnum() else '_' for c in label).strip('_')}.txt"
    path.write_text(profile_text(prof, [("cumulative", 40)]))
    return {"label": label, "repeat": repeat, "wall_ms_profiled": wall * 1e3 / repeat, "key": key, "top_own": top_own,
            "file": str(path)}


def print_profile(p: dict, unprofiled_ms: float | None) -> None:
    extra = f" (unprofiled median {unprofiled_ms:.2f} ms)" if unprofiled_ms is not None else ""
    say(f"\n-- cProfile: {p['label']}: {p['wall_ms_profiled']:.2f} ms per call under the profiler "
        f"(mean of {p['repeat']}){extra}")
    say(f"   {'function (per call of the operation)':<48} {'calls':>7} {'cumulative':>12} {'own':>11}")
    for r in p["key"]:
        say(f"   {r['name']:<48} {r['calls']:>7g} {r['cum_ms']:>9.2f} ms {r['own_ms']:>8.2f} ms")
    say("   top own time:")
    for r in p["top_own"][:8]:
        say(f"   {r['where'][:48]:<48} {r['calls']:>7g} {r['cum_ms']:>9.2f} ms {r['own_ms']:>8.2f} ms")


# ---- main ------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10_000, help="steps of the big log (default 10,000; at least 40)")
    ap.add_argument("--small-steps", type=int, default=50, help="steps of the storage/load run (default 50)")
    ap.add_argument("--load-samples", type=int, default=200, help="fresh-log loads per depth on the small log (default 200)")
    ap.add_argument("--big-load-samples", type=int, default=7, help="loads per depth on the big log (default 7)")
    ap.add_argument("--fork-samples", type=int, default=7, help="fork samples per position (default 7)")
    ap.add_argument("--resume-samples", type=int, default=3, help="fork+resume samples per position (default 3)")
    ap.add_argument("--log", choices=("every", "chains"),
                    help="big log: a checkpoint for EVERY step (default up to 2,000 steps), or only the CHAINS the "
                         "measurements read (default for 10,000 steps; every step takes 1-2.5 h here)")
    ap.add_argument("--budget", type=float, default=60.0,
                    help="seconds per fork/resume measurement after its minimum samples (3 fresh forks, 1 warm, 1 resume); "
                         "the fork at step 10 of 10,000 takes about a minute a sample")
    ap.add_argument("--log-dir", help="keep the big log here and reuse it on the next run with the same --steps")
    ap.add_argument("--no-profile", action="store_true", help="no cProfile runs, even on a MISS")
    args = parse_args(ap, "checkpoints", quick={"steps": 40, "small_steps": 20, "load_samples": 5, "big_load_samples": 2,
                                                "fork_samples": 2, "resume_samples": 1, "budget": 2.0})
    steps, load_n, big_load_n = args.steps, args.load_samples, args.big_load_samples
    fork_n, resume_n, out = args.fork_samples, args.resume_samples, args.out
    if steps < 40:
        ap.error("--steps must be at least 40")
    ks = (10, steps - 10)
    mode = args.log or ("every" if steps <= 2_000 else "chains")

    with workdir("bench-ckpt-", args) as (work, mount):
        notes = machine_notes() | git_notes()
        out.parent.mkdir(parents=True, exist_ok=True)
        say(f"caravanserai {notes['caravanserai']} ({notes['caravanserai_file']}), git {notes['git_head']}"
            f"{' + local changes in caravanserai/' if notes['package_modified_vs_head'] else ''}")
        say(f"Python {notes['python']}, {notes['cpu_count']} CPUs ({notes['cpu_model']}), {notes['platform']}")
        say(f"load average at start: {fmt_load(notes['loadavg_start'])} (other jobs share these CPUs: "
            "compare the CPU-time columns when it is high)")
        say(f"big log: {steps:,} steps; forks at steps {ks[0]:,} and {ks[1]:,}; small run: {args.small_steps} steps\n")
        result: dict[str, Any] = {"machine": notes, "mount": mount, "work_dir": str(work),
                                  "params": {"steps": steps, "small_steps": args.small_steps, "max_chain": MAX_CHAIN,
                                             "load_samples": load_n, "big_load_samples": big_load_n,
                                             "fork_samples": fork_n, "resume_samples": resume_n, "fork_value": FORK_VALUE,
                                             "budget_s": args.budget, "log_mode": mode, "small_prompt0": prompts(1)[0],
                                             "big_prompt0": short_prompts(1)[0],
                                             "quick": args.quick, "target_ms": TARGET_MS, "same_ratio": SAME_RATIO}}
        floor_store = LocalDirectoryStore(work / "floor")
        result["store_write_floor"] = store_write_floor(floor_store, 30)
        say(f"store write floor: put_if_absent(100 B) median {fmt_t(result['store_write_floor']['median'])} "
            f"(a fork makes 2: object + record)")

        # 1 + 2 on the small run
        say(f"1. storage: {args.small_steps}-step run ...")
        small = bench_storage(work / "small", args.small_steps)
        store_small = small.pop("store")
        small.pop("blobs")
        result["storage"] = small
        by_depth = {d: small["ids"][small["depths"].index(d)] for d in (1, MAX_CHAIN) if d in small["depths"]}
        say(f"2. load at depth 1 / {MAX_CHAIN} on the {args.small_steps}-step log ({load_n} fresh + {load_n} warm each) ...")
        result["load_small"] = {str(d): time_loads(store_small, RUN_SMALL, cid, load_n, load_n) for d, cid in by_depth.items()}

        # 3: the big log
        say(f"3. the {steps:,}-step log, " + ("a checkpoint committed for every step ..." if mode == "every" else
            f"checkpoints committed for steps {chain_summary(steps)} (--log chains) ..."))
        if args.log_dir:
            log_root = Path(args.log_dir).expanduser().resolve()
            big, reused = open_big_log(log_root, steps, mode)
        else:
            log_root = work / "big"
            big, reused = build_big_log(log_root, steps, mode), False
            big["disk"] = tree_bytes(log_root / "checkpoints" / RUN_BIG)
        store_big = LocalDirectoryStore(log_root)
        ids, known = big["ids"], set(big["ids"].values())
        result["big_log"] = {k: v for k, v in big.items() if k not in ("ids", "outputs")}
        result["big_log"].update({"reused": reused, "root": str(log_root)})
        if not reused:
            say(f"   built in {big['build_s']:.1f} s ({big['committed']:,} commits; "
                f"run_until_step {big['run_until_step_s']:.1f} s, "
                f"commit {big['commit_s']:.1f} s); {fmt_b(result['big_log']['disk']['apparent'])} on disk "
                f"for {fmt_b(big['sum_full_checkpoints'])} of full checkpoints")
        probe = CheckpointLog(store_big, RUN_BIG)
        tail = {}
        for step in sorted(ids, reverse=True):
            depth = probe.record(ids[step]).depth
            if depth in (1, MAX_CHAIN) and depth not in tail:
                tail[depth] = ids[step]
        say(f"   load at depth 1 / {MAX_CHAIN} near step {steps:,} ({big_load_n} fresh + {big_load_n} warm each) ...")
        result["load_big"] = {str(d): time_loads(store_big, RUN_BIG, tail[d], big_load_n, big_load_n) for d in sorted(tail)}

        agent = DurableAgent().begin(short_prompts(steps))   # only for prompt_node_ids, as a caller would
        result["fork"], result["resume"] = {}, {}
        for k in ks:
            say(f"   fork at step {k:,} (up to {fork_n} fresh-log + {min(fork_n, 3)} warm-log samples, "
                f"~{args.budget:.0f} s budget) ...")
            result["fork"][str(k)] = fork_samples(store_big, k, ids[k], agent.prompt_node_ids[k], known, fork_n, args.budget)
        for k in ks:
            say(f"   fork at step {k:,} + resume_from(load(forked)) for steps {k:,}..{steps - 1:,} "
                f"(up to {resume_n} samples) ...")
            result["resume"][str(k)] = resume_samples(store_big, k, ids[k], agent.prompt_node_ids[k], known, resume_n,
                                                      steps, big["outputs"], args.budget)

        # ---- verdicts ------------------------------------------------------------------------
        f_lo, f_hi = (result["fork"][str(k)]["fresh"]["median"] for k in ks)
        same = max(f_lo, f_hi) / min(f_lo, f_hi)
        verdicts = []
        ok_fork = f_lo * 1e3 <= TARGET_MS and f_hi * 1e3 <= TARGET_MS and same <= SAME_RATIO
        verdicts.append({"name": f"fork at step {ks[0]:,} and at step {ks[1]:,} of {steps:,}: "
                                 f"the same (<= {SAME_RATIO}x apart) and <= {TARGET_MS:g} ms (fresh log)",
                         "pass": ok_fork,
                         "detail": f"medians {fmt_t(f_lo)} and {fmt_t(f_hi)} ({same:.1f}x apart)"})
        for name, group in (("load_small", f"{args.small_steps}-step log"), ("load_big", f"{steps:,}-step log, near the end")):
            for d, row in result[name].items():
                med = row["fresh"]["median"]
                verdicts.append({"name": f"load at depth {d} ({group}, fresh log) <= {TARGET_MS:g} ms",
                                 "pass": med * 1e3 <= TARGET_MS,
                                 "detail": f"median {fmt_t(med)} over {row['fresh']['n']}; "
                                           f"warm log {fmt_t(row['warm']['median'])}; "
                                           f"checkpoint {row['checkpoint_bytes']:,} B"})
        for k in ks:   # issue 13: a fork costs the size of its change plus one SHA-256 of its bytes
            f = result["fork"][str(k)]
            floor = f["floor_sha256"]["median"]
            for mode, label, ratio in (("warm_source_cached", "source in the log's cache", FLOOR_RATIO),
                                       ("fresh", "fresh log", FRESH_FLOOR_RATIO)):
                med = f[mode]["median"]
                fsync_med = f["warm_fsync_s" if mode == "warm_source_cached" else "fsync_s"]["median"]
                cpu_med = f["warm_cpu" if mode == "warm_source_cached" else "fresh_cpu"]["median"]
                f[f"ratio_{mode}"] = med / floor
                verdicts.append({"name": f"fork at step {k:,} of {steps:,} ({label}) <= {ratio:g}x the floor "
                                         f"(SHA-256 of its {f['fork_record']['checkpoint_bytes']:,} B)",
                                 "pass": med <= ratio * floor,
                                 "detail": f"fork {fmt_t(med)} / floor {fmt_t(floor)} = {med / floor:.1f}x; "
                                           f"of which fsync {fmt_t(fsync_med)}: without it "
                                           f"{max(med - fsync_med, 0) / floor:.1f}x; CPU time {fmt_t(cpu_med)} = "
                                           f"{cpu_med / floor:.1f}x"})
        result["verdicts"] = verdicts

        # ---- profiling of what missed ---------------------------------------------------------
        profiles = []
        prof_dir = out.parent
        if not args.no_profile:
            for name, group in (("load_small", RUN_SMALL), ("load_big", RUN_BIG)):
                row = result[name].get(str(MAX_CHAIN))
                if row and row["fresh"]["median"] * 1e3 > TARGET_MS:
                    st = store_small if group == RUN_SMALL else store_big
                    label = f"load depth {MAX_CHAIN} {'small' if group == RUN_SMALL else 'big'} log"
                    p = profile_call(label, lambda st=st, group=group, cid=row["id"]: CheckpointLog(st, group).load(cid),
                                     prof_dir, repeat=20 if group == RUN_SMALL else 3)
                    p["unprofiled_ms"] = row["fresh"]["median"] * 1e3
                    profiles.append(p)
            if not ok_fork:
                for k in ks:
                    slow = result["fork"][str(k)]["fresh"]["median"] > 5.0
                    p = profile_call(f"fork at step {k}",
                                     lambda k=k: CheckpointLog(store_big, RUN_BIG).fork(ids[k], agent.prompt_node_ids[k],
                                                                                       FORK_VALUE),
                                     prof_dir, repeat=1 if slow else 3,
                                     after=lambda cid: drop_fork(store_big, RUN_BIG, cid, known, time.time_ns() - 60_000_000_000))
                    p["unprofiled_ms"] = result["fork"][str(k)]["fresh"]["median"] * 1e3
                    profiles.append(p)
        result["profiles"] = profiles

        report(result, steps, ks, args.small_steps)
    result["loadavg_end"] = loadavg()
    say(f"load average at the end: {fmt_load(result['loadavg_end'])}")
    save_results(out, result)
    return 0


def report(r: dict, steps: int, ks: tuple[int, int], small_steps: int) -> None:
    s = r["storage"]
    rows: list[tuple[str, str, str]] = []
    rows.append((f"1. {small_steps} full checkpoints of a {small_steps}-step run (sum of bytes)",
                 fmt_b(s["sum_full_checkpoints"]), ""))
    rows.append(("   log with parents: stored objects (sum of stored_bytes)", fmt_b(s["delta_log_objects"]),
                 "LG default: 510x the logical bytes; DeltaChannel: 9.3x"))
    rows.append(("   ratio full / log with parents (objects)", f"{s['ratio_objects']:.1f}x", ""))
    rows.append(("   on disk incl. records: log with parents / all-full log",
                 f"{fmt_b(s['delta_log_disk']['apparent'])} / {fmt_b(s['full_log_disk']['apparent'])}",
                 "LG ~818 B (SQLite) / 927 B (PG) per ckpt of a ~110 B state"))
    rows.append(("   ratio on disk: apparent / allocated (4 KB blocks)",
                 f"{s['ratio_disk_apparent']:.1f}x / {s['ratio_disk_allocated']:.1f}x", "DBOS 379-522 B per recorded step"))
    rows.append(("   full objects in the log; median delta object",
                 f"{s['full_objects_in_delta_log']}; {fmt_b(s['delta_bytes_median'])}", ""))
    b = r["big_log"]
    if "disk" in b:
        rows.append((f"   {steps:,}-step log ({b['committed']:,} ckpts) on disk / their full bytes",
                     f"{fmt_b(b['disk']['apparent'])} / {fmt_b(b['sum_full_checkpoints'])}", ""))
    for name, label in (("load_small", f"{small_steps}-step log"), ("load_big", f"{steps:,}-step log, step")):
        for d, row in r[name].items():
            where = f"{label} {row['step']:,}" if name == "load_big" else label
            ctx = ""
            if name == "load_small":
                ctx = ("LG get_state latest, 10k: 0.6-0.9 ms SQLite, 2-6.7 ms PG" if d == "1"
                       else "LG DeltaChannel get_state: 1.8-2.1 ms SQLite, 6.1-8.4 ms PG")
            rows.append((f"2. load depth {d} ({where}, {fmt_b(row['checkpoint_bytes'])}), fresh log; CPU",
                         f"{fmt_t(row['fresh']['median'])}; {fmt_t(row['fresh_cpu']['median'])}", ctx))
            rows.append((f"   load depth {d}, warm log (cache hit)", fmt_t(row["warm"]["median"]), ""))
    for k in ks:
        f = r["fork"][str(k)]
        ctx = ("LG update_state (mid) + 1 step, 10k: 2.3 ms SQLite, 4-38 ms PG" if k == ks[0]
               else "DBOS fork_workflow(9999)+finish: 2.7-2.9 s SQLite, 5.8-8.4 s PG")
        rows.append((f"3. fork at step {k:,} of {steps:,} (fresh log; source depth {f['source_depth']})",
                     fmt_t(f["fresh"]["median"]), ctx))
        rows.append((f"   min / max over {f['fresh']['n']}; CPU time (median)",
                     f"{fmt_t(f['fresh']['min'])} / {fmt_t(f['fresh']['max'])}; {fmt_t(f['fresh_cpu']['median'])}", ""))
        rows.append(("   of which fsync (count, time)", f"{f['fsyncs']:.0f}, {fmt_t(f['fsync_s']['median'])}", ""))
        rows.append(("   fork, warm log (source already loaded)", fmt_t(f["warm_source_cached"]["median"]), ""))
        rows.append((f"   floor: SHA-256 of the fork's {f['fork_record']['checkpoint_bytes']:,} B; ratio fresh / warm",
                     f"{fmt_t(f['floor_sha256']['median'])}; {f['ratio_fresh']:.1f}x / "
                     f"{f['ratio_warm_source_cached']:.1f}x", "targets: warm <= 3x (issue 13), fresh <= 5x (issue 24)"))
        rec = f["fork_record"]
        rows.append(("   fork stored as", f"{rec['kind']} depth {rec['depth']}, {fmt_b(rec['stored_bytes'])}", ""))
    for k in ks:
        rs = r["resume"][str(k)]
        ctx = ("LG: re-executes every call after the fork" if k == ks[0]
               else "DBOS: copies the earlier rows, then replays them")
        rows.append((f"   fork at {k:,} + load + resume_from: {rs['steps_computed']:,} steps run (n={rs['total_s']['n']})",
                     fmt_t(rs["total_s"]["median"]), ctx))
        rows.append(("     fork / load(forked) / resume_from",
                     f"{fmt_t(rs['fork_s']['median'])} / {fmt_t(rs['load_s']['median'])} / {fmt_t(rs['resume_s']['median'])}",
                     "" if rs["checks_ok"] else "CHECK FAILED (see JSON)"))
    rows.append(("store write floor: put_if_absent(100 B), fsync'd", fmt_t(r["store_write_floor"]["median"]), ""))
    if "disk" in b:
        rows.append((f"build of the {steps:,}-step log: {b['committed']:,} x (run_until_step + commit)"
                     f"{' (earlier run)' if b['reused'] else ''}",
                     f"{b['build_s']:.1f} s", ""))

    say()
    say("\n".join(md_table(("metric", "ours", "peers (durable-peers.md, quoted, not re-measured)"), rows,
                             align="lrl", min_widths=(0, 8, 0))))
    say(f"\nFresh log = a new CheckpointLog object per sample (the OS page cache stays warm); medians. Peers: {PEERS_DOC}"
        " (same VM type, their runs, not re-measured here).\n")
    for v in r["verdicts"]:
        say_verdict(v["pass"], v["name"], v["detail"])
    for p in r["profiles"]:
        print_profile(p, p.get("unprofiled_ms"))


if __name__ == "__main__":
    sys.exit(main())
