"""The store conformance suite: the same behaviour checked on every backend.

Subclass ``StoreConformance`` in a test module and provide a ``store`` fixture that yields a
fresh, empty store (or ``ObjectsConformance`` with an ``objects`` fixture for an object face
alone, such as a checkpoint store); pytest then runs every case below against it. A backend that
``open_store`` reaches by URL also gives a ``store_url`` fixture (a fresh URL of the same kind):
the close-then-reopen case uses it (the default None is for a store built in code, which has no
URL to cache). The object cases read the face's ``supports_cas`` flag: compare-and-swap is checked
where it is offered, and refused with ``ObjectConditionalPutRequired`` where it is not::

    class TestMyStore(StoreConformance):
        @pytest.fixture
        def store(self, tmp_path):
            yield MyStore(tmp_path)

        @pytest.fixture
        def store_url(self, tmp_path):
            return f"mine://{tmp_path}/runs"

``journal_machine(make_store)`` builds a Hypothesis state machine that drives acquire/append/
release/load against a plain list model. Requires pytest (and Hypothesis for the machine).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, cast

import pytest

from .. import journal
from ..errors import (
    ForeignLease,
    InvalidObjectKey,
    InvalidPutMode,
    InvalidRunId,
    JournalCorruptionError,
    LeaseLost,
    ObjectConditionalPutRequired,
    ObjectNotFound,
    ObjectPreconditionFailed,
    RunLocked,
    SequenceMismatch,
)
from ..stores import open_store
from ..stores.base import IfVersion, Lease, Objects, Store

__all__ = ["ObjectStoreConformance", "ObjectsConformance", "StoreConformance", "journal_machine", "make_lines"]


def make_lines(run_id: str, count: int, tail: journal.Tail | None = None, **fields) -> tuple[list[str], journal.Tail]:
    events = [{"type": "note", "i": i, "text": f"event {i} ✓", **fields} for i in range(count)]
    lines, _, new_tail = journal.encode(events, tail or journal.Tail())
    return lines, new_tail


class ObjectsConformance:
    """Behaviour every object face must have: put modes, write-once creates, atomic reads, listing,
    and compare-and-swap exactly where ``supports_cas`` says so."""

    def test_objects_put_get_exists_delete(self, objects: Objects) -> None:
        key = f"ckpt/{uuid.uuid4().hex}/a.bin"
        assert not objects.exists(key)
        objects.put(key, b"\x00\x01binary\xff")
        assert objects.exists(key)
        assert objects.get(key) == b"\x00\x01binary\xff"
        objects.put(key, b"v2")
        assert objects.get(key) == b"v2"
        assert objects.delete(key) is True
        assert objects.delete(key) is False
        with pytest.raises(ObjectNotFound):
            objects.get(key)
        with pytest.raises(KeyError):
            objects.get(key)

    def test_objects_put_if_absent_is_write_once(self, objects: Objects) -> None:
        key = f"once/{uuid.uuid4().hex}"
        assert objects.put_if_absent(key, b"first") is True
        assert objects.put_if_absent(key, b"second") is False
        assert objects.get(key) == b"first"

    def test_objects_put_if_absent_has_one_winner_under_contention(self, objects: Objects) -> None:
        key = f"race/{uuid.uuid4().hex}"
        wins: list[bytes] = []

        def contend(i: int) -> None:
            if objects.put_if_absent(key, f"writer {i}".encode()):
                wins.append(f"writer {i}".encode())

        _race(8, contend)
        assert len(wins) == 1
        assert objects.get(key) == wins[0]

    def test_objects_list_by_prefix_sorted(self, objects: Objects) -> None:
        base = f"l{uuid.uuid4().hex[:6]}"
        for name in ("b", "a", "sub/c", "sub/d"):
            objects.put(f"{base}/{name}", name.encode())
        assert objects.list(f"{base}/") == [f"{base}/{n}" for n in ("a", "b", "sub/c", "sub/d")]
        assert objects.list(f"{base}/sub/") == [f"{base}/sub/c", f"{base}/sub/d"]

    @pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b"])
    def test_objects_reject_bad_keys(self, objects: Objects, key: str) -> None:
        with pytest.raises(ValueError):
            objects.put(key, b"x")
        with pytest.raises(InvalidObjectKey) as info:
            objects.put(key, b"x", mode="create")
        assert info.value.code == "invalid_object_key" and "\n" not in str(info.value)

    def test_objects_create_mode_refuses_an_existing_key(self, objects: Objects) -> None:
        key = f"create/{uuid.uuid4().hex}"
        objects.put(key, b"first", mode="create")
        with pytest.raises(ObjectPreconditionFailed) as info:
            objects.put(key, b"second", mode="create")
        assert info.value.code == "object_precondition_failed" and info.value.key == key
        assert objects.get(key) == b"first"
        objects.put(key, b"third", mode="overwrite")
        assert objects.get(key) == b"third"

    @pytest.mark.parametrize("mode", ["update", "", None, 0, "CREATE"])
    def test_objects_refuse_unknown_put_modes(self, objects: Objects, mode: object) -> None:
        key = f"mode/{uuid.uuid4().hex}"
        with pytest.raises(InvalidPutMode) as info:
            objects.put(key, b"x", mode=mode)  # type: ignore[arg-type]
        assert info.value.code == "invalid_put_mode"
        assert not objects.exists(key)

    def test_objects_compare_and_swap_or_a_clear_refusal(self, objects: Objects) -> None:
        key = f"cas/{uuid.uuid4().hex}"
        if not objects.supports_cas:
            objects.put(key, b"v1")
            with pytest.raises(ObjectConditionalPutRequired):
                objects.put(key, b"v2", mode=IfVersion("1"))
            with pytest.raises(ObjectConditionalPutRequired):
                objects.get_versioned(key)
            assert objects.get(key) == b"v1"
            return
        assert objects.get_versioned(key) is None
        first = objects.put(key, b"v1", mode="create")
        assert isinstance(first, str) and first
        assert objects.get_versioned(key) == (b"v1", first)
        second = objects.put(key, b"v2", mode=IfVersion(first))
        assert isinstance(second, str) and second != first
        with pytest.raises(ObjectPreconditionFailed):  # a stale version: someone else wrote since
            objects.put(key, b"stale", mode=IfVersion(first))
        assert objects.get_versioned(key) == (b"v2", second)
        objects.delete(key)
        with pytest.raises(ObjectPreconditionFailed):  # the object vanished
            objects.put(key, b"gone", mode=IfVersion(second))
        assert not objects.exists(key)

    def test_objects_compare_and_swap_has_one_winner_under_contention(self, objects: Objects) -> None:
        if not objects.supports_cas:
            pytest.skip(f"{objects!r} has no compare-and-swap (supports_cas is False)")
        key = f"cas-race/{uuid.uuid4().hex}"
        base = objects.put(key, b"base", mode="create")
        assert base is not None
        wins: list[bytes] = []

        def contend(i: int) -> None:
            try:
                objects.put(key, f"writer {i}".encode(), mode=IfVersion(base))
            except ObjectPreconditionFailed:
                return
            wins.append(f"writer {i}".encode())

        _race(6, contend)
        assert len(wins) == 1
        assert objects.get(key) == wins[0]


def _race(n: int, contend: Callable[[int], None]) -> None:
    """Run ``contend(0..n-1)`` in ``n`` threads released together by a barrier; wait for all."""
    barrier = threading.Barrier(n)

    def go(i: int) -> None:
        barrier.wait()
        contend(i)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


ObjectStoreConformance = ObjectsConformance  # the name before the object face became one contract


class StoreConformance(ObjectsConformance):
    """Behaviour every ``Store`` backend must have (journal face and object face)."""

    @pytest.fixture
    def objects(self, store: Store) -> Objects:
        return store.objects

    @pytest.fixture
    def run_id(self) -> str:
        return f"run-{uuid.uuid4().hex[:8]}"

    @pytest.fixture
    def store_url(self) -> str | None:
        """A fresh URL ``open_store`` opens for this backend; subclasses give it. None: no URL exists."""
        return None

    # ---- journal face -------------------------------------------------------------------
    def test_unknown_run_loads_empty(self, store: Store, run_id: str) -> None:
        assert store.load(run_id) == []
        assert store.events(run_id) == []
        assert run_id not in store.list()

    def test_append_then_load_round_trips(self, store: Store, run_id: str) -> None:
        lines, tail = make_lines(run_id, 3)
        with store.acquire(run_id) as lease:
            store.append(run_id, lines, lease=lease, seq=0)
            more, _ = make_lines(run_id, 2, tail)
            store.append(run_id, more, lease=lease, seq=3)
        assert store.load(run_id) == lines + more
        assert [e["seq"] for e in store.events(run_id)] == [0, 1, 2, 3, 4]
        assert run_id in store.list()

    def test_second_acquire_is_refused_naming_the_holder(self, store: Store, run_id: str) -> None:
        with store.acquire(run_id) as lease:
            with pytest.raises(RunLocked) as info:
                store.acquire(run_id)
            assert info.value.code == "run_locked"
            assert info.value.holder["pid"] == lease.holder["pid"]
            assert str(lease.holder["pid"]) in str(info.value)

    def test_release_lets_another_writer_in_with_a_newer_token(self, store: Store, run_id: str) -> None:
        first = store.acquire(run_id)
        lines, _ = make_lines(run_id, 1)
        store.append(run_id, lines, lease=first, seq=0)
        first.release()
        second = store.acquire(run_id)
        try:
            assert second.token > first.token
        finally:
            second.release()

    def test_released_lease_cannot_append(self, store: Store, run_id: str) -> None:
        lease = store.acquire(run_id)
        lease.release()
        assert not lease.held
        lines, _ = make_lines(run_id, 1)
        with pytest.raises(LeaseLost):
            store.append(run_id, lines, lease=lease, seq=0)
        assert store.load(run_id) == []

    def test_a_late_renewal_keeps_a_lease_nobody_took_and_fails_on_one_taken_over(self, store: Store,
                                                                                  run_id: str) -> None:
        """A holder that could not renew in time (paused, starved) keeps a run no other writer took:
        the renewal proves its token is still current; on a run taken over meanwhile it is LeaseLost
        and its append is refused. An expiring lease with a TTL over 5 s is only made late by its own clock."""
        from ..stores.leases import ExpiringLease

        kept, taken, removed = (store.acquire(run_id + suffix) for suffix in ("", "-taken", "-removed"))
        first, tail = make_lines(run_id, 1)
        store.append(run_id, first, lease=kept, seq=0)
        expiring = [lease for lease in (kept, taken, removed) if isinstance(lease, ExpiringLease)]
        if len(expiring) == 3:
            for lease in expiring:
                lease._stop.set()  # no background renewals: as if the process were paused or starved
            expired = expiring[0].ttl <= 5
            if expired:
                time.sleep(expiring[0].ttl + 0.3)  # past the store's expiry too
            for lease in expiring:
                lease._deadline = time.monotonic()
                assert not lease.held
            if expired:
                taker = store.acquire(run_id + "-taken")  # the expired lease goes to another writer at once
                assert taker.token > taken.token
                with pytest.raises(LeaseLost):
                    taken.renew()
                with pytest.raises(LeaseLost):
                    store.append(run_id + "-taken", first, lease=taken, seq=0)
                taker.release()
                store.remove(run_id + "-removed")  # a removal fences the expired holder off too...
                again = store.acquire(run_id + "-removed")
                assert again.token > removed.token  # ...and the run id's tokens do not start over
                with pytest.raises(LeaseLost):
                    removed.renew()
                again.release()
        taken.release()
        removed.release()
        kept.renew()
        assert kept.held
        more, _ = make_lines(run_id, 1, tail)
        store.append(run_id, more, lease=kept, seq=1)
        with pytest.raises(RunLocked):
            store.acquire(run_id)  # renewed: locked again
        kept.release()
        assert store.load(run_id) == first + more and store.load(run_id + "-taken") == []

    def test_append_at_wrong_seq_is_a_sequence_mismatch(self, store: Store, run_id: str) -> None:
        lines, _ = make_lines(run_id, 3)
        with store.acquire(run_id) as lease:
            assert lease.next_seq == 0
            store.append(run_id, lines[:1], lease=lease, seq=0)
            assert lease.next_seq == 1
            for wrong in (5, 0):
                with pytest.raises(SequenceMismatch) as info:
                    store.append(run_id, lines[1:], lease=lease, seq=wrong)
                assert info.value.code == "seq_mismatch" and info.value.expected == 1
                assert isinstance(info.value, ValueError) and "\n" not in str(info.value)
            assert store.load(run_id) == lines[:1]
            store.append(run_id, lines[1:], lease=lease, seq=1)  # the lease is still good at the right seq
        assert store.load(run_id) == lines
        with store.acquire(run_id) as again:
            assert again.next_seq == 3

    def test_append_with_a_lease_on_another_run_is_refused(self, store: Store, run_id: str) -> None:
        other = f"{run_id}-other"
        lines, _ = make_lines(run_id, 1)
        with store.acquire(other) as lease:
            with pytest.raises(ForeignLease) as info:
                store.append(run_id, lines, lease=lease, seq=0)
            assert info.value.code == "foreign_lease"
        assert store.load(run_id) == [] and store.load(other) == []

    def test_remove_deletes_and_respects_the_lock(self, store: Store, run_id: str) -> None:
        lines, _ = make_lines(run_id, 2)
        with store.acquire(run_id) as lease:
            store.append(run_id, lines, lease=lease, seq=0)
            with pytest.raises(RunLocked):
                store.remove(run_id)
        assert store.remove(run_id) is True
        assert store.load(run_id) == []
        assert store.remove(run_id) is False

    def test_runs_are_independent_and_listed_sorted(self, store: Store) -> None:
        ids = ["b-run", "a-run", "c.run_1"]
        for rid in ids:
            lines, _ = make_lines(rid, 1)
            with store.acquire(rid) as lease:
                store.append(rid, lines, lease=lease, seq=0)
        listed = [r for r in store.list() if r in ids]
        assert listed == sorted(ids)
        assert all(len(store.load(rid)) == 1 for rid in ids)

    def test_tampered_line_is_detected_on_read(self, store: Store, run_id: str) -> None:
        lines, _ = make_lines(run_id, 3)
        forged = lines[1].replace("event 1", "event X")
        with store.acquire(run_id) as lease:
            store.append(run_id, [lines[0], forged, lines[2]], lease=lease, seq=0)
        with pytest.raises(JournalCorruptionError) as info:
            store.events(run_id)
        assert info.value.line == 3  # line 3 no longer chains to the edited line 2

    @pytest.mark.parametrize("bad", ["../x", "a/b", "CON", "nul.txt", "a.", "x" * 300, "", None])
    def test_invalid_run_ids_are_refused_before_anything_is_written(self, store: Store, bad: Any) -> None:
        # `bad` is Any on purpose: the store must refuse whatever it is given, str or not
        before = store.list()
        for call in (lambda: store.acquire(bad), lambda: store.load(bad), lambda: store.remove(bad),
                     lambda: store.events(bad), lambda: store.torn_tail(bad), lambda: store.last_updated(bad)):
            with pytest.raises(InvalidRunId) as info:
                call()
            assert info.value.code == "invalid_run_id" and "\n" not in str(info.value)
        assert store.list() == before

    def test_many_small_appends_across_holders_load_in_order(self, store: Store, run_id: str) -> None:
        """One line per append, three holders in turn (where a backend compacts, across its compactions):
        every reader and every new holder sees the same lines, each once, in order (the second holder
        asks ``load_held`` only after its appends: what its acquire read is out of date by then)."""
        written: list[str] = []
        tail = journal.Tail()
        for holder in range(3):
            with store.acquire(run_id) as lease:
                assert lease.next_seq == len(written)
                if holder != 1:
                    assert store.load_held(lease) == written
                for i in range(7):
                    lines, tail = make_lines(run_id, 1, tail, holder=holder, i=i)
                    store.append(run_id, lines, lease=lease, seq=len(written))
                    written += lines
                assert store.load(run_id) == written and store.load_held(lease) == written
        assert [e["seq"] for e in store.events(run_id)] == list(range(21))
        assert store.list().count(run_id) == 1

    def test_a_clean_journal_has_no_torn_tail(self, store: Store, run_id: str) -> None:
        lines, _ = make_lines(run_id, 2)
        with store.acquire(run_id) as lease:
            store.append(run_id, lines, lease=lease, seq=0)
        assert store.torn_tail(run_id) == 0

    def test_close_then_open_store_again_lists_and_appends(self, store_url: str | None, run_id: str) -> None:
        """``open_store(url).close()`` then ``open_store(url)``: a fresh store, never the closed one
        from the per-URL cache; what was written before the close is all there."""
        if store_url is None:
            return  # a backend without a URL (built in code): open_store has nothing to cache
        open_store(store_url).close()  # closed before any use
        first = open_store(store_url)
        assert open_store(store_url) is first  # one store per URL while it is open
        lines, tail = make_lines(run_id, 2)
        with first.acquire(run_id) as lease:
            first.append(run_id, lines, lease=lease, seq=0)
        first.close()
        second = open_store(store_url)
        try:
            assert second is not first
            assert run_id in second.list() and second.load(run_id) == lines
            more, _ = make_lines(run_id, 1, tail)
            with second.acquire(run_id) as lease:
                second.append(run_id, more, lease=lease, seq=2)
            assert second.load(run_id) == lines + more
        finally:
            second.close()

    def test_concurrent_appends_of_many_runs_all_land_in_order(self, store: Store, run_id: str) -> None:
        # group commit (issue 13): writers of different runs appending at once through one store
        runs = [f"{run_id}-{k}" for k in range(6)]
        expected = {r: make_lines(r, 5)[0] for r in runs}
        errors: list[BaseException] = []

        def write(r: str) -> None:
            try:
                with store.acquire(r) as lease:
                    for seq, line in enumerate(expected[r]):
                        store.append(r, [line], lease=lease, seq=seq)
            except BaseException as exc:  # reported below, in the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(r,)) for r in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert {r: store.load(r) for r in runs} == expected

def journal_machine(make_store: Callable[[], Store]):
    """A Hypothesis RuleBasedStateMachine checking a store's journal against a list model."""
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

    class JournalMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.store = make_store()
            self.run_id = f"sm-{uuid.uuid4().hex[:8]}"
            self.model: list[str] = []
            self.tail = journal.Tail()
            self.lease: Lease | None = None
            self.stale: Lease | None = None

        @rule()
        def acquire(self) -> None:
            if self.lease is not None:
                with pytest.raises(RunLocked):
                    self.store.acquire(self.run_id)
            else:
                self.lease = self.store.acquire(self.run_id)

        @precondition(lambda self: self.lease is not None)
        @rule(count=st.integers(1, 4), text=st.text(max_size=20))
        def append(self, count: int, text: str) -> None:
            lines, _, tail = journal.encode([{"type": "t", "text": text}] * count, self.tail)
            self.store.append(self.run_id, lines, lease=cast(Lease, self.lease), seq=self.tail.seq)  # held: see @precondition
            self.model.extend(lines)
            self.tail = tail

        @precondition(lambda self: self.lease is not None)
        @rule()
        def release(self) -> None:
            cast(Lease, self.lease).release()  # held: see @precondition
            self.stale, self.lease = self.lease, None

        @precondition(lambda self: self.stale is not None and self.lease is None)
        @rule()
        def stale_append_is_refused(self) -> None:
            lines, _, _ = journal.encode([{"type": "t"}], self.tail)
            with pytest.raises(LeaseLost):
                self.store.append(self.run_id, lines, lease=cast(Lease, self.stale), seq=self.tail.seq)

        @invariant()
        def load_matches_model(self) -> None:
            assert self.store.load(self.run_id) == self.model

        def teardown(self) -> None:
            if self.lease is not None:
                self.lease.release()

    return JournalMachine
