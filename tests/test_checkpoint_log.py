"""CheckpointLog: deltas, lineage, forks, corruption, many workers, the run's journal, every store."""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
import time
import uuid

import pytest
from agent_helpers import (
    CHILDREN,
    PROMPTS,
    PYTHON,
    commit_chain,
    files_under,
    flip,
    full_run,
    last_json,
    long_run,
    object_key,
)

import caravanserai
from caravanserai import DurableAgent, ckpt_format
from caravanserai.checkpoints import (
    CheckpointLog,
    CheckpointStore,
    LocalDirectoryStore,
    MemoryCheckpointStore,
)
from caravanserai.errors import CheckpointCorruptionError, CheckpointFormatError, ObjectNotFound
from caravanserai.runs import read_events


# ---- 4. CheckpointLog -----------------------------------------------------------------------
def test_log_bounds_delta_chains_and_writes_a_full_checkpoint_every_16_links(tmp_path):
    ckpts = long_run(40)
    store = LocalDirectoryStore(tmp_path / "ckpt")
    log = CheckpointLog(store, "long")
    assert log.max_chain == 16
    ids = commit_chain(log, ckpts)
    assert len(set(ids)) == 40
    assert ids == [hashlib.sha256(c).hexdigest() for c in ckpts]
    records = {r.id: r for r in log.manifest()}
    depths = [records[i].depth for i in ids]
    kinds = [records[i].kind for i in ids]
    assert depths == [step % 17 for step in range(40)], depths
    assert max(depths) == 16
    assert [s for s, k in enumerate(kinds) if k == "full"] == [0, 17, 34]
    for step, cid in enumerate(ids):
        record = records[cid]
        assert record.step == step and record.run_id == "long"
        assert record.parent == (ids[step - 1] if step else None)
        assert record.base == (None if record.kind == "full" else ids[step - 1])
        assert record.checkpoint_bytes == len(ckpts[step])
        stored = store.get(object_key(store, "long", cid))
        assert len(stored) == record.stored_bytes
        if record.kind == "full":
            assert stored == ckpts[step]


def test_log_respects_a_custom_max_chain():
    log = CheckpointLog(MemoryCheckpointStore(), "short", max_chain=3)
    ids = commit_chain(log, long_run(40)[:12])
    assert [log.record(i).depth for i in ids] == [s % 4 for s in range(12)]
    fresh = CheckpointLog(log.objects, "short", max_chain=3)
    assert [fresh.load(i) for i in ids] == list(long_run(40)[:12])
    with pytest.raises(ValueError):
        CheckpointLog(MemoryCheckpointStore(), "r", max_chain=0)


def test_log_load_returns_every_checkpoint_exactly(tmp_path):
    ckpts = long_run(40)
    store = LocalDirectoryStore(tmp_path / "ckpt")
    ids = commit_chain(CheckpointLog(store, "long"), ckpts)
    # a fresh log (nothing cached), in forward, backward and scattered order
    for order in (range(40), reversed(range(40)), [39, 0, 20, 16, 17, 33, 34, 5]):
        log = CheckpointLog(LocalDirectoryStore(tmp_path / "ckpt"), "long")
        for step in order:
            assert log.load(ids[step]) == ckpts[step], f"step {step}"


def test_log_deltas_are_much_smaller_than_full_checkpoints(tmp_path):
    ckpts = long_run(40)
    root = tmp_path / "ckpt"
    log = CheckpointLog(LocalDirectoryStore(root), "long")
    ids = commit_chain(log, ckpts)
    on_disk = {cid: (root / object_key(log.objects, "long", cid)).stat().st_size for cid in ids}
    for step, cid in enumerate(ids):
        record = log.record(cid)
        if record.kind == "delta":
            assert on_disk[cid] * 4 < len(ckpts[step]) or step < 4, f"step {step}: {on_disk[cid]} of {len(ckpts[step])}"
            assert on_disk[cid] < 3 * len(ckpts[0])
    assert sum(on_disk.values()) * 5 < sum(len(c) for c in ckpts)


def test_committing_the_same_checkpoint_again_is_a_no_op(tmp_path):
    ckpts = long_run(40)[:6]
    root = tmp_path / "ckpt"
    log = CheckpointLog(LocalDirectoryStore(root), "again")
    ids = commit_chain(log, ckpts)
    before = {name: (root / name).read_bytes() for name in files_under(root)}
    for other in (log, CheckpointLog(LocalDirectoryStore(root), "again")):
        assert commit_chain(other, ckpts) == ids
        assert other.commit(ckpts[3]) == ids[3]  # even with another (no) parent and step
        assert other.commit(ckpts[3], parent=ids[0], step=99) == ids[3]
    after = {name: (root / name).read_bytes() for name in files_under(root)}
    assert after == before, "a re-commit must not write or change any object or record"
    assert len(log.manifest()) == 6


def test_lineage_heads_and_fork_records():
    ckpts = long_run(40)[:20]
    log = CheckpointLog(MemoryCheckpointStore(), "tree")
    ids = commit_chain(log, ckpts)
    assert [r.id for r in log.lineage(ids[12])] == ids[:13]
    assert [r.id for r in log.lineage(ids[0])] == [ids[0]]
    assert log.heads() == [ids[-1]]

    alt = log.fork(ids[7], "prompt-5", "a different fifth step")
    record = log.record(alt)
    assert record.parent == ids[7] and record.step == 7
    assert record.fork["node_id"] == "prompt-5" and record.fork["value"] == "a different fifth step"
    assert sorted(log.heads()) == sorted([ids[-1], alt])
    assert [r.id for r in log.lineage(alt)] == ids[:8] + [alt]
    forked = DurableAgent()
    forked.resume_from(log.load(alt))
    original = DurableAgent()
    original.resume_from(ckpts[-1])
    assert forked.step_outputs()[:5] == original.step_outputs()[:5]
    assert forked.step_outputs()[5] != original.step_outputs()[5]
    assert forked.computed_steps == list(range(5, 40))

    # a fork of the fork, and a fork on top of the tip: three tips, then the tip is no head
    alt2 = log.fork(alt, "step-9", [1, 2, 3])
    tip_fork = log.fork(ids[-1], "prompt-19", "last step, reworded")
    assert sorted(log.heads()) == sorted([alt2, tip_fork])
    assert [r.id for r in log.lineage(alt2)] == ids[:8] + [alt, alt2]
    # alt ran steps 0-4 only; alt2 sets step 9's output, so a resume computes 5-8 and 10 on, never 9
    assert DurableAgent.inspect(log.load(alt2))["executed_nodes"] == [f"step-{i}" for i in (0, 1, 2, 3, 4, 9)]
    replay = DurableAgent()
    replay.resume_from(log.load(alt2))
    assert replay.computed_steps == [5, 6, 7, 8, *range(10, 40)]
    assert replay.step_outputs()[9] == [1, 2, 3] and replay.step_outputs()[:5] == original.step_outputs()[:5]
    assert len(log.manifest()) == 23
    with pytest.raises(KeyError):
        log.fork(ids[3], "no-such-node", "x")


def test_manifest_lists_every_record(tmp_path):
    ckpts = long_run(40)[:18]
    log = CheckpointLog(LocalDirectoryStore(tmp_path / "ckpt"), "m")
    ids = commit_chain(log, ckpts)
    alt = log.fork(ids[4], "prompt-2", "changed")
    manifest = CheckpointLog(LocalDirectoryStore(tmp_path / "ckpt"), "m").manifest()
    assert sorted(r.id for r in manifest) == sorted(ids + [alt])
    assert all(isinstance(r, type(log.record(alt))) for r in manifest)
    assert [r.step for r in manifest] == sorted(r.step for r in manifest)
    assert CheckpointLog(LocalDirectoryStore(tmp_path / "ckpt"), "other-run").manifest() == []


def test_a_flipped_byte_in_a_stored_delta_object_is_corruption(tmp_path):
    ckpts = long_run(40)[:8]
    root = tmp_path / "ckpt"
    ids = commit_chain(CheckpointLog(LocalDirectoryStore(root), "flip"), ckpts)
    path = root / object_key(LocalDirectoryStore(root), "flip", ids[5])
    original = path.read_bytes()
    assert ckpt_format.decode(original).kind == ckpt_format.DELTA
    wrong = []
    for position in range(len(original)):
        path.write_bytes(flip(original, position))
        for step in (5, 7):  # the damaged delta itself, and a checkpoint whose chain runs through it
            try:
                CheckpointLog(LocalDirectoryStore(root), "flip").load(ids[step])
            except CheckpointCorruptionError:
                continue
            except Exception as exc:  # noqa: BLE001 - collected and reported below
                wrong.append(f"byte {position}, load(step {step}): {type(exc).__name__}: {exc}")
            else:
                wrong.append(f"byte {position}, load(step {step}): accepted")
    assert not wrong, f"{len(wrong)} damaged loads misreported, e.g. {wrong[:4]}"
    path.write_bytes(original)
    log = CheckpointLog(LocalDirectoryStore(root), "flip")
    assert [log.load(i) for i in ids] == list(ckpts)


def test_a_flipped_byte_in_a_stored_full_object_is_corruption(tmp_path):
    ckpts = long_run(40)[:4]
    root = tmp_path / "ckpt"
    ids = commit_chain(CheckpointLog(LocalDirectoryStore(root), "flip"), ckpts)
    path = root / object_key(LocalDirectoryStore(root), "flip", ids[0])
    original = path.read_bytes()
    for position in range(12, len(original), 53):  # bytes 0-11: the delta-object test
        path.write_bytes(flip(original, position))
        with pytest.raises(CheckpointCorruptionError):
            CheckpointLog(LocalDirectoryStore(root), "flip").load(ids[3])
    path.unlink()
    with pytest.raises(CheckpointCorruptionError, match="missing"):
        CheckpointLog(LocalDirectoryStore(root), "flip").load(ids[2])


def _tamper_base(record: dict, ids: list[str]) -> dict:
    return {**record, "base": ids[3]}


def _tamper_base_none(record: dict, ids: list[str]) -> dict:
    return {**record, "base": None, "kind": "full", "depth": 0}


def _tamper_id(record: dict, ids: list[str]) -> dict:
    return {**record, "id": ids[4]}


def _tamper_extra_field(record: dict, ids: list[str]) -> dict:
    return {**record, "surprise": 1}


def _tamper_missing_field(record: dict, ids: list[str]) -> dict:
    return {k: v for k, v in record.items() if k != "base"}


@pytest.mark.parametrize("tamper", [_tamper_base, _tamper_base_none, _tamper_id, _tamper_extra_field,
                                    _tamper_missing_field, None],
                         ids=["base-changed", "claims-full", "id-changed", "extra-field", "missing-field", "not-json"])
def test_a_tampered_record_is_corruption(tmp_path, tamper):
    ckpts = long_run(40)[:8]
    root = tmp_path / "ckpt"
    ids = commit_chain(CheckpointLog(LocalDirectoryStore(root), "rec"), ckpts)
    path = root / "checkpoints" / "rec" / "records" / f"{ids[5]}.json"
    if tamper is None:
        path.write_bytes(b"{ this is not json")
    else:
        path.write_bytes(json.dumps(tamper(json.loads(path.read_bytes()), ids)).encode())
    for step in (5, 6):
        with pytest.raises(CheckpointCorruptionError):
            CheckpointLog(LocalDirectoryStore(root), "rec").load(ids[step])
    log = CheckpointLog(LocalDirectoryStore(root), "rec")
    assert [log.load(ids[s]) for s in (0, 4)] == [ckpts[0], ckpts[4]]


def test_a_missing_record_is_a_clear_error(tmp_path):
    log = CheckpointLog(LocalDirectoryStore(tmp_path / "ckpt"), "r")
    ids = commit_chain(log, long_run(40)[:2])
    with pytest.raises(ObjectNotFound, match="no checkpoint"):
        log.load("0" * 64)
    with pytest.raises(ObjectNotFound):
        log.commit(long_run(40)[2], parent="f" * 64, step=2)
    assert log.manifest()[-1].id == ids[-1]


def test_a_stored_delta_is_not_a_checkpoint_on_its_own(tmp_path):
    ckpts = long_run(40)[:3]
    store = LocalDirectoryStore(tmp_path / "ckpt")
    log = CheckpointLog(store, "d")
    ids = commit_chain(log, ckpts)
    delta = store.get(object_key(store, "d", ids[2]))
    for action in (lambda: DurableAgent.inspect(delta), lambda: DurableAgent().resume_from(delta),
                   lambda: log.commit(delta)):
        with pytest.raises(CheckpointFormatError):
            action()


class GatedStore(CheckpointStore):
    """Wraps a store; a chosen thread's record write waits until told to go (an interleaving of two workers)."""

    def __init__(self, inner: CheckpointStore) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.waiting = threading.Event()
        self.gated_thread: int | None = None

    def put(self, key, data):
        self.inner.put(key, data)

    def put_if_absent(self, key, data):
        if "/records/" in key and threading.get_ident() == self.gated_thread:
            self.waiting.set()
            assert self.gate.wait(30)
        return self.inner.put_if_absent(key, data)

    def get(self, key):
        return self.inner.get(key)

    def exists(self, key):
        return self.inner.exists(key)

    def list(self, prefix=""):
        return self.inner.list(prefix)

    def delete(self, key):
        return self.inner.delete(key)


@pytest.mark.parametrize("first_parent, second_parent", [(True, False), (False, True)],
                         ids=["delta-then-full", "full-then-delta"])
def test_two_workers_committing_one_checkpoint_with_different_parents(first_parent, second_parent):
    """Worker A commits X (as a delta, or in full) and is paused between its object and its record;
    worker B commits the same X with the other parent choice. Both are no-lock commits of one
    checkpoint, which the seed says is safe; the log must still load X."""
    ckpts = long_run(40)[:3]
    store = GatedStore(MemoryCheckpointStore())
    setup = CheckpointLog(store, "race")
    parent = setup.commit(ckpts[0], step=0)
    x = ckpts[1]
    errors: list[BaseException] = []

    def worker_a():
        store.gated_thread = threading.get_ident()
        try:
            CheckpointLog(store, "race").commit(x, parent=parent if first_parent else None, step=1)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=worker_a)
    thread.start()
    assert store.waiting.wait(30)
    CheckpointLog(store, "race").commit(x, parent=parent if second_parent else None, step=1)
    store.gate.set()
    thread.join(30)
    assert not errors
    assert CheckpointLog(store, "race").load(hashlib.sha256(x).hexdigest()) == x


def test_a_recommit_after_a_crash_between_object_and_record(tmp_path):
    """A worker died after writing X's object (a delta) but before its record; another worker then
    commits X without a parent. The log must load X."""
    ckpts = long_run(40)[:3]
    store = LocalDirectoryStore(tmp_path / "ckpt")
    log = CheckpointLog(store, "crash")
    ids = commit_chain(log, ckpts[:2])
    assert store.delete(f"checkpoints/crash/records/{ids[1]}.json")  # the state the crash left
    assert CheckpointLog(store, "crash").commit(ckpts[1], step=1) == ids[1]
    assert CheckpointLog(store, "crash").load(ids[1]) == ckpts[1]


# ---- 5. many workers, one log ---------------------------------------------------------------
@pytest.mark.parametrize("kind", ["objects", "store"])
def test_many_worker_processes_commit_into_one_log(project, child_env, kind):
    steps = 20
    prompt_sets = {name: [f"worker {name} task, step {i}" for i in range(steps)] for name in "ABC"}
    plan = ["A", "A", "B", "C"]  # two workers commit the very same checkpoints
    root = project / "shared-log"
    start_at = time.time() + 3.0
    procs = [subprocess.Popen([PYTHON, str(CHILDREN / "agent_log_worker.py"), f"{kind}:{root}", "crowd",
                               f"{start_at}", json.dumps(prompt_sets[name])],
                              cwd=project, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name in plan]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"worker exited {proc.returncode}:\n{out}\n{err}"
        results.append(last_json(out))
    # they really overlapped
    assert max(r["first"] for r in results) < min(r["last"] for r in results)
    assert results[0]["ids"] == results[1]["ids"]
    everything = set().union(*(r["ids"] for r in results))
    assert len(everything) == 3 * steps

    store = LocalDirectoryStore(root) if kind == "objects" else caravanserai.open_store(str(root))
    log = CheckpointLog(store, "crowd")
    manifest = log.manifest()
    assert sorted(r.id for r in manifest) == sorted(everything), "a record was lost or invented"
    for result, name in zip(results, plan):
        expected = DurableAgent().begin(prompt_sets[name])
        for step, cid in enumerate(result["ids"]):
            assert CheckpointLog(store, "crowd").load(cid) == expected.run_until_step(step)
            record = log.record(cid)
            assert record.step == step and record.parent == (result["ids"][step - 1] if step else None)
    objects = store if kind == "objects" else store.objects
    keys = objects.list("checkpoints/crowd/")
    assert len(keys) == 2 * len(everything)
    object_root = root if kind == "objects" else root / ".objects"
    assert not [f for f in files_under(object_root) if f.endswith(".tmp")], "temp files left behind"
    if kind == "store":
        events = read_events("crowd", store)
        assert events[0]["type"] == "run_started"
        assert sum(e["type"] == "run_started" for e in events) == 1
        committed = [e["checkpoint_id"] for e in events if e["type"] == "checkpoint_committed"]
        assert sorted(committed) == sorted(everything), "each checkpoint is journaled exactly once"


# ---- 6. the run's journal -------------------------------------------------------------------
def test_log_on_a_store_journals_commits_and_forks(project):
    store = caravanserai.open_store(str(project / "store"))
    log = CheckpointLog(store, "ticket-42")
    agent = DurableAgent().begin(PROMPTS)
    ids = commit_chain(log, [agent.run_until_step(i) for i in range(4)])
    alt = log.fork(ids[3], "prompt-3", "open a draft PR instead")

    events = read_events("ticket-42", store)
    assert events[0]["type"] == "run_started" and events[0]["run_id"] == "ticket-42"
    committed = [e for e in events if e["type"] == "checkpoint_committed"]
    assert [e["checkpoint_id"] for e in committed] == ids + [alt]
    for step, event in enumerate(committed[:4]):
        assert event["parent"] == (ids[step - 1] if step else None)
        assert event["step"] == step
        assert event["kind"] == ("full" if step == 0 else "delta")
        assert event["kind"] == log.record(ids[step]).kind
    assert committed[4]["fork"]["node_id"] == "prompt-3" and committed[4]["parent"] == ids[3]
    (forked,) = [e for e in events if e["type"] == "forked"]
    assert forked["checkpoint_id"] == alt and forked["source"] == ids[3] and forked["node_id"] == "prompt-3"
    assert events.index(forked) > events.index(committed[4])

    # a no-op re-commit journals nothing
    assert log.commit(agent.run_until_step(3), parent=ids[2], step=3) == ids[3]
    assert read_events("ticket-42", store) == events


def test_fork_into_a_new_run(project):
    store = caravanserai.open_store(str(project / "store"))
    log = CheckpointLog(store, "ticket-42")
    agent = DurableAgent().begin(PROMPTS)
    ids = commit_chain(log, [agent.run_until_step(i) for i in range(4)])
    alt = log.fork(ids[1], "prompt-2", "draft two fixes", new_run_id="ticket-42-alt")

    alt_events = read_events("ticket-42-alt", store)
    first = alt_events[0]
    assert first["type"] == "run_started" and first["run_id"] == "ticket-42-alt"
    assert first["forked_from"] == {"run_id": "ticket-42", "checkpoint_id": ids[1]}
    assert alt in [e.get("checkpoint_id") for e in alt_events if e["type"] == "checkpoint_committed"]

    alt_log = CheckpointLog(store, "ticket-42-alt")
    assert [r.id for r in alt_log.manifest()] == [alt]
    record = alt_log.record(alt)
    assert record.parent == ids[1] and record.parent_run == "ticket-42" and record.run_id == "ticket-42-alt"
    assert record.fork["node_id"] == "prompt-2" and record.fork["value"] == "draft two fixes"
    assert [(r.run_id, r.id) for r in alt_log.lineage(alt)] == [("ticket-42", ids[0]), ("ticket-42", ids[1]),
                                                                ("ticket-42-alt", alt)]
    outputs = DurableAgent().resume_from(CheckpointLog(store, "ticket-42-alt").load(alt))
    assert outputs == full_run(PROMPTS[:2] + ["draft two fixes", PROMPTS[3]]).step_outputs()
    # the source run keeps its own log, and its journal names the new run
    assert sorted(r.id for r in log.manifest()) == sorted(ids)
    (forked,) = [e for e in read_events("ticket-42", store) if e["type"] == "forked"]
    assert forked["new_run_id"] == "ticket-42-alt" and forked["source"] == ids[1] and forked["checkpoint_id"] == alt
    assert "ticket-42-alt" in store.list()


# ---- 7. every checkpoint store --------------------------------------------------------------
def _local(tmp_path):
    return LocalDirectoryStore(tmp_path / "ckpt")


def _memory(tmp_path):
    return MemoryCheckpointStore()


def _full_local(tmp_path):
    return caravanserai.open_store(str(tmp_path / "full"))


def _full_memory(tmp_path):
    return caravanserai.open_store(f"memory://agent-{uuid.uuid4().hex}")


@pytest.mark.parametrize("make", [_local, _memory, _full_local, _full_memory],
                         ids=["LocalDirectoryStore", "MemoryCheckpointStore", "open_store(path)", "open_store(memory)"])
def test_checkpoint_log_round_trip_on_every_store(tmp_path, make):
    store = make(tmp_path)
    ckpts = long_run(40)[:20]
    log = CheckpointLog(store, "round-trip")
    ids = commit_chain(log, ckpts)
    objects = log.objects
    keys = objects.list()
    assert commit_chain(log, ckpts) == ids and objects.list() == keys
    fresh = CheckpointLog(store, "round-trip")
    assert [fresh.load(i) for i in reversed(ids)] == list(reversed(ckpts))
    assert [r.depth for r in fresh.lineage(ids[-1])] == [s % 17 for s in range(20)]
    assert sorted(r.id for r in fresh.manifest()) == sorted(ids)
    assert fresh.heads() == [ids[-1]]
    alt = fresh.fork(ids[15], "prompt-12", "edited")
    assert sorted(fresh.heads()) == sorted([ids[-1], alt])
    forked = DurableAgent()
    forked.resume_from(CheckpointLog(store, "round-trip").load(alt))
    assert forked.computed_steps == list(range(12, 40))
    # the run_until_step / resume_from store= face
    agent = DurableAgent().begin(PROMPTS)
    parked = agent.run_until_step(1, store=store, key="parked/step-2")
    assert DurableAgent().resume_from(store=store, key="parked/step-2") == full_run(PROMPTS).step_outputs()
    assert objects.get("parked/step-2") == parked
    # a damaged stored delta is caught whatever the store
    key = object_key(objects, "round-trip", ids[4])
    good = objects.get(key)
    objects.put(key, flip(good, len(good) // 2))
    with pytest.raises(CheckpointCorruptionError):
        CheckpointLog(store, "round-trip").load(ids[6])
    objects.put(key, good)
    assert CheckpointLog(store, "round-trip").load(ids[6]) == ckpts[6]
