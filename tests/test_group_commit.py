"""Group commit (issue 13): concurrent appends of different runs share one flush, each acknowledged
only once durable.

The SQL stores are exercised on a real SQLite file and a real PostgreSQL server; a batch is made
deterministic by holding the leader's first statement until the other writers are queued behind
it (nothing is timed). The journal service runs as a real child process and is SIGKILLed right
after acknowledgements.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from conftest import need_module
from servers.journal_service import JournalServiceProcess

from caravanserai import LeaseLost, StoreFull, StoreUnavailable
from caravanserai.stores.group_commit import GroupCommit, Member
from caravanserai.stores.sql import SqliteStore

TOKEN = "group-commit-token-0123456789"


# ---- helpers --------------------------------------------------------------------------------------
@pytest.fixture(params=["sqlite", "postgres"])
def sql_store(request, tmp_path):
    if request.param == "sqlite":
        store = SqliteStore(str(tmp_path / "runs.db"))
    else:
        from caravanserai.stores.postgres import PostgresStore

        pg = request.getfixturevalue("pg")
        store = PostgresStore(pg.dsn, table=f"gc_{uuid.uuid4().hex[:12]}", create_schema=True)
    yield store
    store.close()


def hold_first_append(store, queued: int) -> list[str]:
    """Hold the first append statement until ``queued`` more appends wait behind it; returns the
    log of statements sent from then on (their first word)."""
    real, log, first = store._exec, [], threading.Event()

    def exec_(query, params):
        if query.startswith("INSERT INTO") and "WHERE EXISTS" in query and not first.is_set():
            first.set()
            deadline = time.monotonic() + 20
            while len(store._commits._queue) < queued and time.monotonic() < deadline:
                time.sleep(0.005)
        if first.is_set():  # "INSERT*": a whole batch in one statement
            log.append(query.split()[0].upper() + ("*" if "json_to_recordset" in query else ""))
        return real(query, params)

    exec_.connection = real.connection  # type: ignore[attr-defined]  # close() closes it
    store._exec = exec_
    return log


def assert_one_commit(store, log: list[str], queued: int) -> None:
    """The ``queued`` writers behind the held leader were committed together: SQLite in one transaction
    (BEGIN, an INSERT each, COMMIT), PostgreSQL in one statement (the leader's INSERT, then one more)."""
    if store.dialect == "postgres":
        assert log[:2] == ["INSERT", "INSERT*"] and "BEGIN" not in log and "COMMIT" not in log, log
        return
    begin = log.index("BEGIN")
    end = log.index("COMMIT", begin)
    assert set(log[begin + 1: end]) == {"INSERT"} and end - begin - 1 >= queued, log


def in_threads(*calls):
    """Run each call in its own thread; returns each one's result or exception."""
    out: list = [None] * len(calls)

    def run(i, fn):
        try:
            out[i] = fn()
        except BaseException as exc:  # noqa: BLE001
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def appender(store, run_id, lease, lines):
    def go():
        seq = lease.next_seq
        for line in lines:
            store.append(run_id, [line], lease=lease, seq=seq)
            seq += 1
        return "ok"
    return go


# ---- the primitive -------------------------------------------------------------------------------
def test_a_lone_writer_flushes_at_once_and_a_failed_flush_fails_every_member():
    batches = []

    def flush(batch):
        batches.append([m.item for m in batch])
        if any(m.item == "boom" for m in batch):
            raise OSError("disk gone")
        for m in batch:
            m.done(m.item.upper())

    commits = GroupCommit(flush, key=lambda item: item)
    assert commits.submit("a") == "A" and batches == [["a"]]
    gate, release = threading.Event(), threading.Event()

    def slow_flush(batch):
        if not gate.is_set():
            gate.set()
            release.wait(10)
        flush(batch)

    commits._flush = slow_flush
    first = threading.Thread(target=commits.submit, args=("lead",))
    first.start()
    gate.wait(10)
    results: dict = {}
    threads = [threading.Thread(target=lambda x=x: results.__setitem__(x, _outcome(commits.submit, x)))
               for x in ("x", "boom", "y")]
    for t in threads:
        t.start()
    while len(commits._queue) < 3:
        time.sleep(0.005)
    release.set()
    first.join(10)
    for t in threads:
        t.join(10)
    assert sorted(batches[-1]) == ["boom", "x", "y"]  # the three queued writers shared one flush
    assert all(isinstance(results[x], OSError) for x in ("x", "boom", "y"))  # and all saw it fail


def test_a_leader_interrupted_before_its_flush_leaves_no_member_waiting():
    """A Ctrl-C that reaches the leader between taking a batch and flushing it: the leader raises it, every
    other member of the batch gets a retryable error instead of waiting for ever, and the next submit works."""
    commits = GroupCommit(lambda batch: [m.done(m.item) for m in batch], key=lambda item: item)

    def interrupted_run(batch, own):
        raise KeyboardInterrupt

    commits._run = interrupted_run
    follower = Member("follow")
    commits._queue.append(follower)  # another writer's append, queued before the leader takes the batch
    assert isinstance(_interrupt(commits.submit, "lead"), KeyboardInterrupt)
    assert follower.settled and isinstance(follower.error, StoreUnavailable), follower.error
    del commits._run
    assert commits.submit("again") == "again" and not commits._leading and not commits._queue


def _interrupt(fn, *args):
    try:
        return fn(*args)
    except BaseException as exc:  # noqa: BLE001 - the test looks at a KeyboardInterrupt
        return exc


def _outcome(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001
        return exc


# ---- SQL stores -----------------------------------------------------------------------------------
def test_concurrent_appends_of_many_runs_share_one_commit_and_stay_in_order(sql_store):
    runs = [f"gc-{k}" for k in range(6)]
    leases = {r: sql_store.acquire(r) for r in runs}
    log = hold_first_append(sql_store, queued=len(runs) - 1)
    lines = {r: [f'{{"run": "{r}", "i": {i}}}' for i in range(4)] for r in runs}
    assert in_threads(*(appender(sql_store, r, leases[r], lines[r]) for r in runs)) == ["ok"] * len(runs)
    for r in runs:
        assert sql_store.load(r) == lines[r]
        leases[r].release()
    assert sql_store.commit_stats["largest"] >= len(runs) - 1
    assert_one_commit(sql_store, log, len(runs) - 1)


def test_a_fenced_writer_in_a_batch_is_refused_while_the_others_commit(sql_store):
    runs = ["lead", "a", "fenced", "c"]
    leases = {r: sql_store.acquire(r) for r in runs}
    # another writer took "fenced" over: its lease row carries a newer token now
    sql_store.exec(f"UPDATE {sql_store.table}_leases SET token = token + 1 WHERE run_id = "
                   f"{'?' if sql_store.dialect == 'sqlite' else '$1'}", ("fenced",))
    log = hold_first_append(sql_store, queued=3)
    out = in_threads(*(appender(sql_store, r, leases[r], [f'{{"r": "{r}"}}']) for r in runs))
    assert out[0] == out[1] == out[3] == "ok"
    assert isinstance(out[2], LeaseLost) and "fenced" in str(out[2])
    assert_one_commit(sql_store, log, 3)
    assert sql_store.load("a") == ['{"r": "a"}'] and sql_store.load("c") == ['{"r": "c"}']
    assert sql_store.load("fenced") == []


def test_a_batch_keeps_every_line_exactly_whatever_it_holds(sql_store):
    runs = ["lead", "quotes", "unicode", "escapes", "big"]
    leases = {r: sql_store.acquire(r) for r in runs}
    lines = {"lead": ['{"r": 0}'],
             "quotes": ['{"say": "\\"quoted\\" and \'single\'", "path": "C:\\\\dir\\\\file"}'],
             "unicode": ['{"text": "caf\u00e9 \u0645\u0631\u062d\u0628\u0627 \U0001f600 \u2028"}'],
             "escapes": ['{"nul": "\\u0000", "tab": "\\t", "newline": "\\n", "bs": "\\\\u00e9"}'],
             "big": ['{"blob": "' + "x\\\"y" * 30_000 + '"}']}
    log = hold_first_append(sql_store, queued=len(runs) - 1)
    assert in_threads(*(appender(sql_store, r, leases[r], lines[r]) for r in runs)) == ["ok"] * len(runs)
    assert_one_commit(sql_store, log, len(runs) - 1)
    for r in runs:
        assert sql_store.load(r) == lines[r], r
        leases[r].release()


def test_a_batch_whose_flush_fails_fails_every_member_and_leaves_nothing(sql_store):
    runs = ["lead", "a", "bad", "c"]
    leases = {r: sql_store.acquire(r) for r in runs}
    big = "x" * 2_000_000
    if sql_store.dialect == "sqlite":  # a real SQLITE_FULL: the file may not grow past its size now
        pages = sql_store.exec("PRAGMA page_count", ())[0][0]
        sql_store.exec(f"PRAGMA max_page_count = {pages + 20}", ())
        expected: type[Exception] = StoreFull
    else:  # a real server-side error in the middle of the batch's transaction
        t = sql_store.table
        sql_store.exec(f"CREATE FUNCTION {t}_boom() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF length(NEW.lines) "
                       "> 1000000 THEN RAISE EXCEPTION 'refused by a trigger'; END IF; RETURN NEW; END $$", ())
        sql_store.exec(f"CREATE TRIGGER {t}_boom BEFORE INSERT ON {t} FOR EACH ROW EXECUTE FUNCTION {t}_boom()", ())
        expected = StoreUnavailable
    hold_first_append(sql_store, queued=3)
    lines = {"lead": ['{"r": "lead"}'], "a": ['{"r": "a"}'], "bad": [big], "c": ['{"r": "c"}']}
    out = dict(zip(runs, in_threads(*(appender(sql_store, r, leases[r], lines[r]) for r in runs)), strict=True))
    leader = [r for r in runs if out[r] == "ok"]  # the first to arrive (threads start in any order) flushed alone
    assert len(leader) == 1 and leader != ["bad"], out
    batch = [r for r in runs if r not in leader]
    assert all(isinstance(out[r], expected) for r in batch), out
    for r in batch:
        assert sql_store.load(r) == []  # nothing of the failed batch is visible
        assert leases[r].next_seq == 0
    # the leases still hold and the journals continue at the same seq
    later = next(r for r in batch if r != "bad")
    sql_store.append(later, [f'{{"r": "{later}"}}'], lease=leases[later], seq=0)
    assert sql_store.load(later) == [f'{{"r": "{later}"}}']


# ---- the journal service --------------------------------------------------------------------------
@pytest.mark.parametrize("backing", ["sqlite", "local"])
def test_service_appends_of_many_runs_survive_a_sigkill_right_after_their_acknowledgement(tmp_path, backing):
    need_module("uvicorn", "http")
    from caravanserai import open_store
    from caravanserai.stores.http import HttpStore

    url = f"sqlite:///{tmp_path / 'backing.db'}" if backing == "sqlite" else str(tmp_path / "backing")
    service = JournalServiceProcess(url, TOKEN)
    runs = [f"svc-{k}" for k in range(8)]
    acked: dict[str, list[str]] = {r: [] for r in runs}
    started = threading.Barrier(len(runs) + 1)

    def client(run_id):
        store = HttpStore(service.url, TOKEN, retries=0, lease_ttl_ms=30_000)
        lease = store.acquire(run_id)
        started.wait(30)
        seq = lease.next_seq
        try:
            while True:  # until the service dies under us
                line = f'{{"run": "{run_id}", "i": {seq}}}'
                store.append(run_id, [line], lease=lease, seq=seq)
                acked[run_id].append(line)
                seq += 1
        except StoreUnavailable:
            return

    threads = [threading.Thread(target=client, args=(r,), daemon=True) for r in runs]
    for t in threads:
        t.start()
    started.wait(30)
    deadline = time.monotonic() + 60
    while min(len(a) for a in acked.values()) < 5 and time.monotonic() < deadline:
        time.sleep(0.001)
    service.kill()  # SIGKILL while the clients are appending
    assert min(len(a) for a in acked.values()) >= 5, {r: len(a) for r, a in acked.items()}
    for t in threads:
        t.join(30)
    backing_store = open_store(url)
    try:
        for r in runs:
            lines = backing_store.load(r)
            assert lines[: len(acked[r])] == acked[r]  # every acknowledged append, in order
            assert len(lines) <= len(acked[r]) + 1  # at most the one in flight when the service died
    finally:
        backing_store.close()


def test_service_batch_refuses_its_fenced_and_stale_writers_while_the_others_commit(tmp_path):
    need_module("starlette", "http")
    from caravanserai.stores.http_service import JournalService

    backing = SqliteStore(str(tmp_path / "backing.db"))
    service = JournalService(backing, reap_every=3600)
    try:
        runs = ["lead", "a", "fenced", "c", "stale"]
        tokens = {r: service.acquire(r, {"pid": 1}, 30_000)["token"] for r in runs}
        old = tokens["stale"]  # this client's lease is released, and another client takes the run
        service.release("stale", old)
        service.acquire("stale", {"pid": 2}, 30_000)
        # a writer outside the service took "fenced" over in the backing store
        backing.exec(f"UPDATE {backing.table}_leases SET token = token + 1 WHERE run_id = ?", ("fenced",))
        hold_first_append(backing, queued=3)

        def append(r, token):
            return lambda: service.append(r, token, 0, [f'{{"r": "{r}"}}'], True)

        out = in_threads(*(append(r, tokens[r]) for r in runs[:4]), append("stale", old))
        assert out[0] == out[1] == out[3] == {"next_seq": 1}
        assert isinstance(out[2], LeaseLost) and "backing store refused" in str(out[2])
        assert isinstance(out[4], LeaseLost) and "not the current lease" in str(out[4])
        assert backing.commit_stats["largest"] >= 3  # a, fenced and c were one batch
        assert [backing.load(r) for r in runs] == [['{"r": "lead"}'], ['{"r": "a"}'], [], ['{"r": "c"}'], []]
    finally:
        service.close()
        backing.close()


def test_service_batch_whose_flush_fails_answers_every_member_with_the_error(tmp_path):
    need_module("starlette", "http")
    from caravanserai.stores.http_service import JournalService, _error_for

    backing = SqliteStore(str(tmp_path / "backing.db"))
    service = JournalService(backing, reap_every=3600)
    try:
        runs = ["lead", "a", "big", "c"]
        tokens = {r: service.acquire(r, {"pid": 1}, 30_000)["token"] for r in runs}
        pages = backing.exec("PRAGMA page_count", ())[0][0]
        backing.exec(f"PRAGMA max_page_count = {pages + 20}", ())  # a real SQLITE_FULL for the big member
        hold_first_append(backing, queued=3)
        lines = {"lead": ['{"r": 0}'], "a": ['{"r": 1}'], "big": ["x" * 2_000_000], "c": ['{"r": 2}']}
        out = in_threads(*(lambda r=r: service.append(r, tokens[r], 0, lines[r], True) for r in runs))
        assert out[0] == {"next_seq": 1}
        assert all(isinstance(x, StoreFull) for x in out[1:]), out
        assert {_error_for(x).status_code for x in out[1:]} == {507}  # what each client is answered
        assert [backing.load(r) for r in runs[1:]] == [[], [], []]
        backing.exec(f"PRAGMA max_page_count = {pages + 100_000}", ())
        assert service.append("a", tokens["a"], 0, ['{"r": 1}'], True) == {"next_seq": 1}  # same seq: nothing half-done
    finally:
        service.close()
        backing.close()


def test_an_exec_of_your_own_commits_each_append_alone_unless_group_commit_is_asked(tmp_path):
    from caravanserai.stores.sql import SqlStore, sqlite_exec

    store = SqlStore(sqlite_exec(str(tmp_path / "own.db")), "sqlite", create_schema=True)  # it may be a pool
    runs = ["lead", "a", "b", "c"]
    leases = {r: store.acquire(r) for r in runs}
    log = hold_first_append(store, queued=3)
    assert in_threads(*(appender(store, r, leases[r], [f'{{"r": "{r}"}}']) for r in runs)) == ["ok"] * 4
    assert "BEGIN" not in log and log.count("INSERT") == 4  # queued together, still one autocommit each
    assert [store.load(r) for r in runs] == [[f'{{"r": "{r}"}}'] for r in runs]
    store._exec.connection.close()


@pytest.mark.parametrize("stripes", [256, 1], ids=["own-stripes", "one-shared-stripe"])
def test_service_event_loop_commits_the_appends_of_one_turn_together(tmp_path, stripes):
    need_module("starlette", "http")
    import asyncio

    from caravanserai.stores.http_service import JournalService

    backing = SqliteStore(str(tmp_path / "backing.db"))
    service = JournalService(backing, reap_every=3600)
    service._stripes = service._stripes[:stripes]  # runs sharing a stripe still leave in one batch
    try:
        runs = ["a", "b", "c", "fenced", "stale"]
        tokens = {r: service.acquire(r, {"pid": 1}, 30_000)["token"] for r in runs}
        old = tokens["stale"]
        service.release("stale", old)
        service.acquire("stale", {"pid": 2}, 30_000)
        backing.exec(f"UPDATE {backing.table}_leases SET token = token + 1 WHERE run_id = ?", ("fenced",))
        before = backing.commit_stats["batches"]

        async def main():
            return await asyncio.gather(*(service.append_async(r, tokens[r], 0, [f'{{"r": "{r}"}}'], True)
                                          for r in runs[:4]), service.append_async("stale", old, 0, ['{}'], True),
                                        return_exceptions=True)

        out = asyncio.run(main())
        assert out[:3] == [{"next_seq": 1}] * 3
        assert isinstance(out[3], LeaseLost) and "backing store refused" in str(out[3])
        assert isinstance(out[4], LeaseLost) and "not the current lease" in str(out[4])
        assert backing.commit_stats["batches"] == before + 1  # one flush for the loop's turn: a, b, c and fenced
        assert [backing.load(r) for r in runs] == [['{"r": "a"}'], ['{"r": "b"}'], ['{"r": "c"}'], [], []]
    finally:
        service.close()
        backing.close()
