"""SQL stores: ``SqlStore`` (the seed's ``SqlDurableStore``) over one ``exec(sql, params)`` callable,
for SQLite and PostgreSQL.

The whole database dependency is ``exec(query, params)`` returning rows (sync or async), the
shape every driver already has; ``dialect`` picks the placeholders (``?`` for sqlite, ``$1..$n``
for postgres) and the clock expression. Three tables (``SqlStore.schema(dialect)`` returns
the DDL; the store never creates or drops tables unless asked with ``create_schema=True``):

- ``<table>`` — journal chunks: one row per append, primary key (run_id, chunk);
- ``<table>_leases`` — one lease row per run: holder, fencing token, expiry (database clock, ms);
- ``<table>_objects`` — the object face (``SqlObjects``): key, bytes; ``"create"`` puts are
  ``INSERT … ON CONFLICT DO NOTHING``; no versions, so no compare-and-swap.

Appends are fenced in the statement itself: the chunk is inserted only ``WHERE EXISTS`` a lease
row with this writer's token that has not expired by the database's clock, so a writer paused past
its lease (or cut off) cannot append, whatever its own clock says, until a renewal has found its token
still current (nobody took the run over: every takeover, and a removal, grows the token).

Group commit (``group_commit=True``; ``SqliteStore`` and ``PostgresStore`` turn it on, since they
own their one connection, while an ``exec`` of your own may spread statements over a pool): appends
of different runs made at the same time through one store (threads of one process, the journal
service's requests) share one transaction. The first writer that finds no commit running leads
(``group_commit.GroupCommit``): alone, it sends its one autocommit ``INSERT`` as before; with others
queued behind it, it sends ``BEGIN``, their fenced ``INSERT``s and one ``COMMIT`` (one WAL flush
for all). On PostgreSQL the whole batch is one fenced autocommit ``INSERT … SELECT FROM
json_to_recordset(…)`` instead: one round trip and one commit, where a transaction of N appends takes
N + 2 round trips, each a few hundred microseconds of a Python driver's CPU; the batch travels as one
JSON text (a text array would have the driver escape every quote of every line). A member
whose fence refuses it gets its own ``LeaseLost`` and the others commit; a statement or ``COMMIT``
that fails rolls the whole batch back and every member gets that error, so nothing is acknowledged
that is not durable.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import (
    CaravanseraiError,
    ForeignLease,
    InvalidStoreUrl,
    LeaseLost,
    RunLocked,
    SequenceMismatch,
    StoreFull,
    StoreUnavailable,
)
from ..journal import dumps
from .base import (
    Lease,
    Objects,
    PutMode,
    Store,
    describe_holder,
    holder_info,
    holder_is_dead,
    os_failure,
    removal_refused,
)
from .group_commit import GroupCommit, Member
from .leases import DEFAULT_TTL_MS, ExpiringLease, check_lease_ttl
from .urls import first_line, parse_options, split_url

__all__ = ["SqlDurableStore", "SqlObjects", "SqlStore", "SqliteStore", "sqlite_exec"]

DEFAULT_TABLE = "caravanserai_durable_journal"
_NOW = {
    "sqlite": "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)",
    "postgres": "(extract(epoch from clock_timestamp()) * 1000)::bigint",
}
_BLOB = {"sqlite": "BLOB", "postgres": "BYTEA"}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


class _AsyncRunner:
    """Runs an async ``exec`` to completion from synchronous code (one private event loop thread)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="caravanserai-sql-async", daemon=True).start()

    def run(self, awaitable: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(_await(awaitable), self.loop).result()


async def _await(awaitable: Any) -> Any:
    return await awaitable


class SqlLease(ExpiringLease):
    store: SqlStore

    def __init__(self, store: SqlStore, run_id: str, token: int, holder: dict, ttl: float, started: float,
                 next_chunk: int, next_seq: int, snapshot: list[str] | None = None) -> None:
        self.next_chunk = next_chunk
        super().__init__(store, run_id, token, holder, ttl, started=started, next_seq=next_seq)
        self.snapshot = snapshot

    def _renew(self) -> None:
        rows = self.store._q("renew", (self.store.ttl_ms, self.run_id, self.token))
        if not rows:
            raise LeaseLost(f"run {self.run_id!r}: the lease row no longer carries token {self.token} (taken over or expired)",
                            run_id=self.run_id)

    def _release_remote(self) -> None:
        self.store._q("release", (self.run_id, self.token))


class SqlObjects(Objects):
    """The object face in ``<table>_objects`` (create-only puts by the primary key; no versions)."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store

    def put(self, key: str, data: bytes, *, mode: PutMode = "overwrite") -> None:
        key, mode = self.check_key(key), self.check_mode(mode)
        if mode == "create":
            if not self.store._q("put_if_absent", (key, bytes(data))):
                raise self._exists(key, mode)
            return
        self.store._q("put", (key, bytes(data)))

    def get(self, key: str) -> bytes:
        rows = self.store._q("get", (key,))
        if not rows:
            raise self._missing(key)
        return bytes(rows[0][0])

    def exists(self, key: str) -> bool:
        return bool(self.store._q("exists", (key,)))

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        """Many keys in one query over their common prefix (the run index reads thousands)."""
        if len(keys) < 8:
            return super().get_many(keys)
        wanted = set(keys)
        prefix = os.path.commonprefix(list(keys))
        rows = self.store._q("get_prefix", (prefix, prefix + "\U0010ffff"))
        return {key: bytes(data) for key, data in rows if key in wanted}

    def list(self, prefix: str = "") -> list[str]:
        rows = self.store._q("list_prefix", (prefix, prefix + "\U0010ffff")) if prefix else self.store._q("list_objects", ())
        return sorted(r[0] for r in rows if r[0].startswith(prefix))

    def delete(self, key: str) -> bool:
        return bool(self.store._q("delete", (key,)))

    def __repr__(self) -> str:
        return f"SqlObjects({self.store.url})"


class SqlStore(Store):
    """A journal and objects in SQL tables reached through one ``exec(sql, params)``."""

    scheme = "sql"

    def __init__(self, sql: Any, dialect: str = "sqlite", table: str = DEFAULT_TABLE, *,
                 lease_ttl_ms: int = DEFAULT_TTL_MS, url: str | None = None, create_schema: bool = False,
                 background_renew: bool = True, group_commit: bool = False) -> None:
        if dialect not in _NOW:
            raise ValueError(f"dialect must be 'sqlite' or 'postgres', got {dialect!r}")
        if not isinstance(table, str) or not _IDENT.fullmatch(table):
            raise ValueError(f"table name {table!r} must be a plain SQL identifier")
        lease_ttl_ms = check_lease_ttl(lease_ttl_ms)
        fn = sql if callable(sql) else getattr(sql, "exec", None) or (sql.get("exec") if isinstance(sql, dict) else None)
        if not callable(fn):
            raise TypeError("sql must be exec(query, params) -> rows, or an object/dict with such an 'exec'")
        self._exec = fn
        self.dialect = dialect
        self.table = table
        self.ttl_ms = int(lease_ttl_ms)
        self.url = url or f"sql+{dialect}://{table}"
        self.background_renew = background_renew
        self.group_commit = group_commit  # batches share a transaction: exec must keep one connection
        self._lock = threading.RLock()
        self._async: _AsyncRunner | None = None
        self._queries = _queries(dialect, table)
        self._objects = SqlObjects(self)
        self._commits: GroupCommit[_Write] = GroupCommit(self._commit, key=lambda write: write[0])
        if create_schema:
            self.create_schema()

    @staticmethod
    def schema(dialect: str = "sqlite", table: str = DEFAULT_TABLE) -> str:
        """The DDL to run once (the store never creates or drops tables unless asked)."""
        if dialect not in _NOW or not _IDENT.fullmatch(table):
            raise ValueError("schema(dialect in {'sqlite', 'postgres'}, table=<identifier>)")
        blob = _BLOB[dialect]
        return (
            f"CREATE TABLE IF NOT EXISTS {table} (run_id TEXT NOT NULL, chunk BIGINT NOT NULL, seq BIGINT NOT NULL, "
            f"token BIGINT NOT NULL, lines TEXT NOT NULL, PRIMARY KEY (run_id, chunk));\n"
            f"CREATE TABLE IF NOT EXISTS {table}_leases (run_id TEXT PRIMARY KEY, holder TEXT NOT NULL, "
            f"token BIGINT NOT NULL, expires_at BIGINT NOT NULL);\n"
            f"CREATE TABLE IF NOT EXISTS {table}_objects (key TEXT PRIMARY KEY, data {blob} NOT NULL);\n"
        )

    def create_schema(self) -> None:
        """Run the DDL. Writers starting together race on it: PostgreSQL's ``CREATE TABLE IF NOT EXISTS``
        fails with a duplicate key for the loser once the winner commits, and the same statement again
        then finds the table."""
        for statement in self.schema(self.dialect, self.table).split(";\n"):
            if statement.strip():
                for attempt in range(3):
                    try:
                        self.exec(statement, ())
                        break
                    except _Conflict:
                        if attempt == 2:
                            raise

    # ---- plumbing ------------------------------------------------------------------------
    def exec(self, query: str, params: Sequence[Any]) -> list:
        with self._lock:
            try:
                rows = self._exec(query, tuple(params))
                if type(rows) is list:  # psycopg's and sqlite3's answer: nothing to await or copy
                    return rows
                if inspect.isawaitable(rows):
                    self._async = self._async or _AsyncRunner()
                    rows = self._async.run(rows)
            except CaravanseraiError:
                raise
            except Exception as exc:
                if _is_conflict(exc):
                    raise _Conflict(str(exc)) from exc
                raise self._db_failure(exc) from exc
        return list(rows or [])

    def _db_failure(self, exc: Exception) -> StoreUnavailable:
        """One line for a database error: StoreFull for a full disk, else StoreUnavailable."""
        reason = first_line(exc)
        if _is_full(exc):
            return StoreFull(f"the SQL store {self.url} is full ({type(exc).__name__}: {reason}): free disk space on "
                             "the database server or raise its quota, then retry; nothing was written", url=self.url)
        return StoreUnavailable(f"SQL store {self.url} failed: {type(exc).__name__}: {reason}; check the database "
                                "connection and that the schema exists (SqlStore.schema)", url=self.url)

    def _q(self, name: str, params: Sequence[Any]) -> list:
        return self.exec(self._queries[name], params)

    # ---- journal face --------------------------------------------------------------------
    def _load(self, run_id: str) -> list[str]:
        lines: list[str] = []
        for (text,) in self._q("load", (run_id,)):
            if text:
                lines.extend(text.split("\n"))
        return lines

    def _acquire(self, run_id: str, *, read: bool = True) -> SqlLease:
        """The lease, with the journal read once (its length is the next seq; ``load_held`` reuses it);
        ``read=False`` (a removal, which never appends) reads nothing."""
        started = time.monotonic()
        holder = {**holder_info(), "lease": uuid.uuid4().hex}
        for _ in range(2):  # a holder gone between taking and reading: try once more
            rows = self._q("acquire", (run_id, _json(holder), self.ttl_ms)) or self._take_from_the_dead(run_id, holder)
            if rows:
                break
            live = self._q("live_holder", (run_id,))
            current = _parse(live[0][0]) if live else None
            if current:
                raise RunLocked(f"run {run_id!r} is being written by {describe_holder(current)}; wait for its lease to "
                                "expire or stop that process", run_id=run_id, holder=current)
        else:
            last = self._q("holder", (run_id,))  # the holder of the lease that refused us, even if it ended since
            current = _parse(last[0][0]) if last else None
            if current:
                raise RunLocked(f"run {run_id!r} was being written by {describe_holder(current)} (its lease ended just "
                                "after refusing this writer); retry", run_id=run_id, holder=current)
            raise RunLocked(f"run {run_id!r} is locked, but its lease row vanished or named no holder when read, on two "
                            "tries (the run was removed or its lease rewritten meanwhile); retry", run_id=run_id, holder=None)
        token = int(rows[0][0])
        holder["token"] = token
        tail = self._q("tail", (run_id,))
        next_chunk = int(tail[0][0]) if tail and tail[0][0] is not None else 0
        lines = self._load(run_id) if read else None
        lease = SqlLease(self, run_id, token, holder, self.ttl_ms / 1000, started, next_chunk,
                         len(lines) if lines is not None else 0, lines)
        if not self.background_renew:
            lease._stop.set()
        return lease

    def _take_from_the_dead(self, run_id: str, holder: dict) -> list:
        """The live-looking lease of a holder whose process died on this machine: take it over now (CAS on its token)."""
        current = self._q("holder_token", (run_id,))
        if not current or not holder_is_dead(_parse(current[0][0])):
            return []
        return self._q("takeover", (_json(holder), self.ttl_ms, run_id, int(current[0][1])))

    def _append(self, run_id: str, lines: Sequence[str], *, lease: Any, seq: int, sync: bool = True) -> None:
        self._commits.submit((run_id, "\n".join(lines), lease, seq))  # every commit is durable: sync is moot

    def append_batch(self, writes: Sequence[tuple[str, Sequence[str], Lease, int]]) -> builtins_list[Exception | None]:
        """``append(run_id, lines, lease=lease, seq=seq)`` for each of ``writes`` (different runs) at once,
        as one group commit; per write, None once durable or the error ``append`` would have raised.

        The journal service calls it with the appends its event loop has gathered.
        """
        outcomes: builtins_list[Exception | None] = [None] * len(writes)
        queued: builtins_list[tuple[int, _Write]] = []
        for i, (run_id, lines, lease, seq) in enumerate(writes):
            if not isinstance(lease, SqlLease) or lease.store is not self or lease.run_id != run_id:
                outcomes[i] = ForeignLease(f"append to run {run_id!r} needs a lease on that run from {self._describe()}",
                                           run_id=run_id)
                continue
            try:
                lease.check()
            except LeaseLost as exc:
                outcomes[i] = exc
                continue
            if seq != lease.next_seq:
                outcomes[i] = SequenceMismatch(f"append to run {run_id!r} at seq {seq}, but the journal's next seq is "
                                               f"{lease.next_seq}", run_id=run_id, expected=lease.next_seq)
            elif lines:
                queued.append((i, (run_id, "\n".join(lines), lease, seq)))
        members = self._commits.submit_all([write for _, write in queued])
        for (i, (_, _, lease, seq)), member, (_, lines, _, _) in zip(queued, members, (writes[i] for i, _ in queued),
                                                                    strict=True):
            if member.error is None:
                lease.next_seq = seq + len(lines)
            else:
                outcomes[i] = member.error if isinstance(member.error, Exception) else StoreUnavailable(
                    f"SQL store {self.url}: the append was interrupted; retry", url=self.url)
        return outcomes

    def _commit(self, batch: builtins_list[Member[_Write]]) -> None:
        """Write a batch of appends (one per run): one autocommit INSERT alone; else one statement (PostgreSQL)
        or one transaction (SQLite)."""
        if len(batch) == 1 or not self.group_commit:  # each INSERT its own (auto)commit
            for member in batch:
                try:
                    self._settle(member, bool(self._q("append", _append_params(member.item))))
                except _Conflict:  # another writer's chunk at this position: fenced
                    self._settle(member, False)
                except Exception as exc:
                    member.fail(exc)
            return
        if self.dialect == "postgres":  # one statement, one round trip, one commit; a batch has one write per run
            rows = [{"run_id": run_id, "chunk": lease.next_chunk, "seq": seq, "token": lease.token, "lines": text}
                     for run_id, text, lease, seq in (member.item for member in batch)]
            runs = {row[0] for row in self._q("append_many", (dumps(rows),))}
            for member in batch:
                self._settle(member, member.item[0] in runs)
            return
        with self._lock:  # the connection is ours until COMMIT: no other thread's statement lands inside
            self._q("begin", ())
            try:
                written = [bool(self._q("append_batched", _append_params(m.item))) for m in batch]
                self._q("commit", ())
            except BaseException:
                try:
                    self._q("rollback", ())
                except Exception:
                    pass  # the connection failed: the server rolls the transaction back
                raise
        for member, ok in zip(batch, written, strict=True):
            self._settle(member, ok)

    @staticmethod
    def _settle(member: Member[_Write], written: bool) -> None:
        run_id, _, lease, _ = member.item
        if written:
            lease.next_chunk += 1
            member.done()
            return
        lease._lost = "the database refused the append (fenced)"
        member.fail(LeaseLost(f"run {run_id!r}: the store refused this append: the lease (token {lease.token}) expired "
                              "or was taken over by another writer; open the run again", run_id=run_id))

    @property
    def commit_stats(self) -> dict[str, int]:
        """Group commit so far: ``batches`` flushed and the ``largest`` one's number of appends."""
        return {"batches": self._commits.batches, "largest": self._commits.largest}

    def list(self) -> list[str]:
        return sorted(r[0] for r in self._q("list", ()))

    def _journal_versions(self, run_ids: Sequence[str] | None) -> dict[str, str]:
        if run_ids is not None and len(run_ids) < 8:
            rows = [row for r in run_ids for row in self._q("version", (r,))]
        else:  # one grouped scan of the primary key: cheaper than a query per run
            rows = self._q("versions", ())
        versions = {r[0]: f"{r[1]}:{r[2]}:{r[3]}" for r in rows}
        return versions if run_ids is None else {r: versions[r] for r in run_ids if r in versions}

    def _remove(self, run_id: str) -> bool:
        """Take the lease first (a holder whose lease expired is fenced off: its token no longer matches),
        delete the journal, then release the lease, keeping its row and token: tokens never start over
        for a run id, so a late renewal can never match a later writer's lease."""
        try:
            lease = self._acquire(run_id, read=False)
        except RunLocked as exc:
            raise removal_refused(run_id, exc) from None
        try:
            return bool(self._q("remove", (run_id,)))
        finally:
            lease.release()

    @property
    def objects(self) -> Objects:
        return self._objects


SqlDurableStore = SqlStore  # the seed's name
_Write = tuple  # (run_id, the lines joined by "\n", lease, seq): one queued append
builtins_list = list  # ``list`` is a method name inside SqlStore


def _append_params(write: _Write) -> tuple:
    run_id, text, lease, seq = write
    return (run_id, lease.next_chunk, seq, lease.token, text, run_id, lease.token)


class _Conflict(Exception):
    """A unique-key violation (another writer's chunk, an existing object)."""


def _is_conflict(exc: Exception) -> bool:
    name = type(exc).__name__
    return name in ("IntegrityError", "UniqueViolation") or "UNIQUE constraint" in str(exc)


def _is_full(exc: Exception) -> bool:
    # SQLite: SQLITE_FULL ("database or disk is full"); PostgreSQL: SQLSTATE 53100 disk_full / 54000 limits.
    return (getattr(exc, "sqlite_errorname", "") == "SQLITE_FULL" or "database or disk is full" in str(exc)
            or getattr(exc, "sqlstate", None) == "53100" or type(exc).__name__ == "DiskFull")


def _json(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True)


def _parse(text: str) -> dict | None:
    import json

    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _queries(dialect: str, t: str) -> dict[str, str]:
    now = _NOW[dialect]
    queries = {
        "load": f"SELECT lines FROM {t} WHERE run_id = ? ORDER BY chunk",
        "tail": f"SELECT MAX(chunk) + 1 FROM {t} WHERE run_id = ?",
        "acquire": (f"INSERT INTO {t}_leases AS l (run_id, holder, token, expires_at) VALUES (?, ?, 1, {now} + ?) "
                    f"ON CONFLICT (run_id) DO UPDATE SET holder = excluded.holder, token = l.token + 1, "
                    f"expires_at = excluded.expires_at WHERE l.expires_at < {now} RETURNING token"),
        "holder": f"SELECT holder FROM {t}_leases WHERE run_id = ?",
        "holder_token": f"SELECT holder, token FROM {t}_leases WHERE run_id = ?",
        "takeover": (f"UPDATE {t}_leases SET holder = ?, token = token + 1, expires_at = {now} + ? "
                     "WHERE run_id = ? AND token = ? RETURNING token"),
        "live_holder": f"SELECT holder FROM {t}_leases WHERE run_id = ? AND expires_at > {now}",
        # late too: a lease nobody took over (its token unchanged) is still this holder's
        "renew": f"UPDATE {t}_leases SET expires_at = {now} + ? WHERE run_id = ? AND token = ? RETURNING token",
        "release": f"UPDATE {t}_leases SET expires_at = 0 WHERE run_id = ? AND token = ? RETURNING token",
        "append": (f"INSERT INTO {t} (run_id, chunk, seq, token, lines) SELECT ?, ?, ?, ?, ? WHERE EXISTS "
                   f"(SELECT 1 FROM {t}_leases WHERE run_id = ? AND token = ? AND expires_at > {now}) RETURNING chunk"),
        # in a batch's transaction a chunk another writer took is no row, not an error that aborts the batch
        "append_batched": (f"INSERT INTO {t} (run_id, chunk, seq, token, lines) SELECT ?, ?, ?, ?, ? WHERE EXISTS "
                           f"(SELECT 1 FROM {t}_leases WHERE run_id = ? AND token = ? AND expires_at > {now}) "
                           "ON CONFLICT (run_id, chunk) DO NOTHING RETURNING chunk"),
        "begin": "BEGIN IMMEDIATE" if dialect == "sqlite" else "BEGIN",  # sqlite: take the write lock now
        "commit": "COMMIT",
        "rollback": "ROLLBACK",
        "list": f"SELECT DISTINCT run_id FROM {t} ORDER BY run_id",
        "remove": f"DELETE FROM {t} WHERE run_id = ? RETURNING chunk",
        "put": (f"INSERT INTO {t}_objects (key, data) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET data = excluded.data "
                "RETURNING key"),
        "put_if_absent": f"INSERT INTO {t}_objects (key, data) VALUES (?, ?) ON CONFLICT (key) DO NOTHING RETURNING key",
        "get": f"SELECT data FROM {t}_objects WHERE key = ?",
        "exists": f"SELECT 1 FROM {t}_objects WHERE key = ?",
        "list_objects": f"SELECT key FROM {t}_objects",
        "list_prefix": f"SELECT key FROM {t}_objects WHERE key >= ? AND key < ?",
        "get_prefix": f"SELECT key, data FROM {t}_objects WHERE key >= ? AND key < ?",
        "versions": f"SELECT run_id, COUNT(*), MAX(chunk), MAX(seq) FROM {t} GROUP BY run_id",
        "version": f"SELECT run_id, COUNT(*), MAX(chunk), MAX(seq) FROM {t} WHERE run_id = ? GROUP BY run_id",
        "delete": f"DELETE FROM {t}_objects WHERE key = ? RETURNING key",
    }
    if dialect == "postgres":
        # a batch in one statement (PostgreSQL): each row fenced by its own lease, a taken chunk no row
        queries["append_many"] = (
            f"INSERT INTO {t} (run_id, chunk, seq, token, lines) SELECT b.run_id, b.chunk, b.seq, b.token, b.lines "
            "FROM json_to_recordset(?::json) AS b(run_id text, chunk bigint, seq bigint, token bigint, lines text) "
            f"WHERE EXISTS (SELECT 1 FROM {t}_leases l WHERE l.run_id = b.run_id AND l.token = b.token AND "
            f"l.expires_at > {now}) ON CONFLICT (run_id, chunk) DO NOTHING RETURNING run_id")
        queries = {name: _dollar(q) for name, q in queries.items()}
    return queries


def _dollar(query: str) -> str:
    counter = iter(range(1, 1000))
    return re.sub(r"\?", lambda _: f"${next(counter)}", query)


def sqlite_exec(path: str) -> Callable[[str, Sequence[Any]], list]:
    """An ``exec`` on a SQLite file in WAL mode with ``synchronous=FULL`` (a commit is durable on return).

    The file is created 0o600 before SQLite opens it; SQLite gives ``-wal`` and ``-shm`` the
    database file's mode, so all three stay private like the local store's files.
    """
    import sqlite3

    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    try:
        conn.execute("PRAGMA journal_mode=WAL")  # readers never block the writer; several processes share the file
        conn.execute("PRAGMA synchronous=FULL")  # fsync the WAL at every commit: durable when append returns
        conn.execute("PRAGMA busy_timeout=30000")  # wait for another process's transaction instead of failing
    except BaseException:
        conn.close()
        raise

    def run(query: str, params: Sequence[Any]) -> list:
        return conn.execute(query, params).fetchall()

    run.connection = conn  # type: ignore[attr-defined]
    return run


SQLITE_OPTIONS: dict[str, Callable[[str], Any]] = {"table": str, "lease_ttl_ms": int}
_SQLITE_FORMS = ("use sqlite:///runs.db for a path relative to the current directory or sqlite:////abs/path/runs.db "
                 "for an absolute one")


class SqliteStore(SqlStore):
    """``sqlite:///path.db``: an embedded store several local processes and kernels can share."""

    scheme = "sqlite"

    def __init__(self, path: str, *, table: str = DEFAULT_TABLE, lease_ttl_ms: int = DEFAULT_TTL_MS) -> None:
        import sqlite3

        lease_ttl_ms = check_lease_ttl(lease_ttl_ms)  # before creating the file

        path = os.path.abspath(os.path.expanduser(path))
        url = f"sqlite:///{path}"
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            exec_ = sqlite_exec(path)
        except OSError as exc:
            raise os_failure(exc, f"SQLite store {path!r}", "opening the database") from exc
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open the SQLite store {path!r}: {first_line(exc)}; check that the path is a "
                                   "SQLite database file this user can write", url=url) from exc
        try:
            super().__init__(exec_, "sqlite", table, lease_ttl_ms=lease_ttl_ms, url=url, create_schema=True,
                             group_commit=True)
        except BaseException:
            exec_.connection.close()  # type: ignore[attr-defined]
            raise
        self.path = path

    @classmethod
    def from_url(cls, url: str) -> SqliteStore:
        from urllib.parse import unquote

        parts = split_url(url, "sqlite:///runs.db")
        # As SQLAlchemy: sqlite:///relative.db, sqlite:////absolute/path.db
        if parts.netloc not in ("", "localhost"):
            raise InvalidStoreUrl(f"{url!r} puts {parts.netloc!r} where a host goes; {_SQLITE_FORMS}", url=url)
        path = unquote(parts.path[1:])
        if not path or path.endswith("/") or parts.fragment:
            raise InvalidStoreUrl(f"{url!r} names no database file; {_SQLITE_FORMS}", url=url)
        options = parse_options(parts.query, SQLITE_OPTIONS, url)
        return cls(path, **options)

    def _close(self) -> None:
        self._exec.connection.close()
