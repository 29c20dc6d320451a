"""``postgresql://…``: the shared store for a team, an ``SqlStore`` on psycopg 3.

The URL is a libpq URL plus caravanserai's own query options, which are removed before
connecting: ``table`` (default ``caravanserai_durable_journal``), ``lease_ttl_ms`` (30000) and
``create_schema`` (``1`` to run ``SqlStore.schema("postgres")``; otherwise the tables must
exist: ``caravanserai store init URL`` creates them). Every other option goes to libpq, which
refuses the ones it does not know: that is an ``InvalidStoreUrl`` (one line, password redacted),
and a server that cannot be reached is ``StoreUnavailable``. Needs
``pip install 'caravanserai[postgres]'``.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlunsplit

from ..errors import InvalidStoreUrl, MissingExtra, StoreUnavailable
from .leases import DEFAULT_TTL_MS, check_lease_ttl
from .sql import DEFAULT_TABLE, SqlStore
from .urls import check_options, first_line, parse_bool, redact, split_url

_BAD_OPTION = re.compile(r"connection is bad: invalid|invalid connection option|invalid \w+ value")
_OURS: dict[str, Callable[[str], Any]] = {"table": str, "lease_ttl_ms": int, "create_schema": parse_bool}
_DIRECT = ("append", "append_many", "renew")  # a writer's statements, run through libpq (PsycopgExec._direct)


class PsycopgExec:
    """``exec(query, params)`` on one autocommit psycopg connection (every statement durable when it returns).

    A connection the server dropped (a restart, a failover, an idle timeout) fails its statement with
    ``StoreUnavailable``, once; the next statement opens a new connection, so a writer that starts
    again (a fresh ``durable()``) continues on the same cached store without closing it by hand.
    Statements named in ``direct`` (a writer's: append, renew) go to libpq through ``psycopg.pq``,
    prepared once per connection: without the cursor's Python layers a statement costs the client
    about a quarter of the instructions (counted under valgrind). The store serializes its calls
    (``SqlStore.exec``).
    """

    def __init__(self, dsn: str) -> None:
        try:
            import psycopg
            from psycopg import generators
        except ImportError as exc:
            raise MissingExtra("postgresql:// stores need psycopg 3: pip install 'caravanserai[postgres]'",
                               extra="postgres") from exc
        self._psycopg = psycopg
        status, types = psycopg.pq.ExecStatus, psycopg.postgres.types
        self._rows, self._ok, self._fatal = status.TUPLES_OK, (status.TUPLES_OK, status.COMMAND_OK), status.FATAL_ERROR
        self._sqlstate = psycopg.pq.DiagnosticField.SQLSTATE
        self._execute = generators.execute  # what a cursor's execute waits on
        self._names = itertools.count()
        self._int8 = types["int8"].oid
        self._ints = frozenset(types[name].oid for name in ("int2", "int4", "int8"))
        self._dsn, self._shown = dsn, _redact(dsn)
        self._converted: dict[str, str] = {}  # $n placeholders -> psycopg's %s, once per statement
        self.direct: set[str] = set()  # statements of str/int parameters and int/text columns, run through libpq
        self._prepared: dict[tuple[str, tuple[type, ...]], bytes] = {}  # on self._prepared_on, by query and types
        self._prepared_on: Any = None
        self._encoding = "utf-8"  # the connection's client encoding, read with _prepared_on
        self.closed = False  # the store was closed: no reconnect
        self.retry_at = 0.0
        self.connection = self._connect()

    def _connect(self, timeout: int = 10) -> Any:
        psycopg, shown = self._psycopg, self._shown
        try:
            return psycopg.connect(self._dsn, autocommit=True, connect_timeout=timeout)
        except psycopg.Error as exc:
            reason = redact(first_line(exc))
            if not isinstance(exc, psycopg.ProgrammingError) and not _BAD_OPTION.search(reason):
                raise StoreUnavailable(f"cannot connect to PostgreSQL at {shown}: {reason}; check that the server runs "
                                       "and the URL", url=shown) from None
            # libpq could not parse the DSN, or refused an option's value
            raise InvalidStoreUrl(f"PostgreSQL refused the URL {shown}: {reason}; caravanserai's own "
                                  f"options are {', '.join(sorted(_OURS))}, any other must be a libpq parameter "
                                  "(sslmode, connect_timeout, application_name...)", url=shown) from None

    def __call__(self, query: str, params: Sequence[Any]) -> list:
        conn = self.connection
        if conn.closed:  # dropped under an earlier statement (psycopg marks it broken and closed)
            if self.closed:  # the store was closed: it stays closed
                raise StoreUnavailable(f"the store {self._shown} was closed; open it again with open_store", url=self._shown)
            if time.monotonic() < self.retry_at:  # fail fast between tries
                raise StoreUnavailable(f"PostgreSQL at {self._shown} could not be reached a moment ago (it dropped the "
                                       "connection); try again in a second", url=self._shown)
            self.retry_at = time.monotonic() + 0.5
            conn = self.connection = self._connect(timeout=3)
            self.retry_at = 0.0
        if query in self.direct and all(type(p) is int or (type(p) is str and "\0" not in p) for p in params):
            return self._direct(conn, query, params)  # (libpq ends a text value at a NUL: those get psycopg's error)
        text = self._converted.get(query)
        if text is None:
            text = self._converted[query] = re.sub(r"\$\d+", "%s", query)
        cur = conn.execute(text, params)  # a cursor per statement: none keeps a big result (an object's bytes) alive
        result = cur.pgresult  # its status, not cur.description, which builds a Column per field
        return cur.fetchall() if result is not None and result.status == self._rows else []

    def _direct(self, conn: Any, query: str, params: Sequence[Any]) -> list:
        """``query`` through ``psycopg.pq``: prepared once per connection with its parameters' types (int8 for
        every int: each meets a bigint; unknown for a str, as psycopg sends it), sent with text values and
        awaited by ``Connection.wait``, which cancels it on Ctrl-C as a cursor does. Integer columns come
        back as int, the others as str (``direct`` statements return no other type); an error result raises
        what psycopg raises for it (``errors.error_from_result``: a UniqueViolation stays one)."""
        pgconn = conn.pgconn
        if self._prepared_on is not pgconn:
            encoding = conn.info.encoding
            self._prepared, self._prepared_on = {}, pgconn
            self._encoding = "utf-8" if encoding == "ascii" else encoding  # SQL_ASCII: psycopg sends UTF-8 too
        encoding = self._encoding
        types = tuple(map(type, params))
        values = [b"%d" % p if type(p) is int else p.encode(encoding) for p in params]
        for attempt in (1, 2):
            name = self._prepared.get((query, types))
            if name is None:
                name = b"caravanserai_%d" % next(self._names)  # never reused: a prepare cut short may exist server-side
                pgconn.send_prepare(name, query.encode(encoding), [self._int8 if t is int else 0 for t in types])
                self._check(self._wait(conn), encoding)
                self._prepared[(query, types)] = name
            pgconn.send_query_prepared(name, values)
            result = self._wait(conn)
            if result.status == self._fatal and result.error_field(self._sqlstate) == b"26000" and attempt == 1:
                self._prepared.clear()  # the server forgot them (DEALLOCATE ALL, DISCARD ALL): nothing ran, prepare again
                continue
            break
        self._check(result, encoding)
        if result.status != self._rows:
            return []
        as_int = [result.ftype(column) in self._ints for column in range(result.nfields)]
        get = result.get_value
        return [tuple(None if (value := get(row, column)) is None else int(value) if number else value.decode(encoding)
                      for column, number in enumerate(as_int)) for row in range(result.ntuples)]

    def _wait(self, conn: Any) -> Any:
        """The result of the statement just sent (psycopg's generator and wait loop, as its cursors use)."""
        return conn.wait(self._execute(conn.pgconn))[-1]

    def _check(self, result: Any, encoding: str) -> Any:
        if result.status in self._ok:
            return result
        raise self._psycopg.errors.error_from_result(result, encoding=encoding)


def _redact(dsn: str) -> str:
    return redact(dsn)


class PostgresStore(SqlStore):
    scheme = "postgresql"

    def __init__(self, dsn: str, *, table: str = DEFAULT_TABLE, lease_ttl_ms: int = DEFAULT_TTL_MS,
                 create_schema: bool = False) -> None:
        lease_ttl_ms = check_lease_ttl(lease_ttl_ms)  # before connecting
        exec_ = PsycopgExec(dsn)
        try:
            super().__init__(exec_, "postgres", table, lease_ttl_ms=lease_ttl_ms, url=_redact(dsn),
                             create_schema=create_schema, group_commit=True)  # one connection: batches may share it
        except BaseException:
            exec_.connection.close()
            raise
        exec_.direct.update(self._queries[name] for name in _DIRECT)

    @classmethod
    def from_url(cls, url: str) -> PostgresStore:
        parts = split_url(url, "postgresql://user@host:5432/db?option=value")
        shown = _redact(url)
        try:
            query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
        except ValueError:
            raise InvalidStoreUrl(f"cannot read the options of {shown!r}; write them as ?name=value&name=value",
                                  url=shown) from None
        ours = {k: v for k, v in query if k in _OURS}
        theirs = [(k, v) for k, v in query if k not in _OURS]
        options = check_options(ours, _OURS, shown)
        dsn = urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(theirs), parts.fragment))
        return cls(dsn, **options)

    def _close(self) -> None:
        with self._lock:  # not while a statement (or a reconnect) runs
            self._exec.closed = True
            self._exec.connection.close()
