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


def psycopg_exec(dsn: str) -> Any:
    """An ``exec`` on one autocommit psycopg connection (every statement durable when it returns).

    A connection the server dropped (a restart, a failover, an idle timeout) fails its statement with
    ``StoreUnavailable``, once; the next statement opens a new connection, so a writer that starts
    again (a fresh ``durable()``) continues on the same cached store without closing it by hand.
    """
    try:
        import psycopg
    except ImportError as exc:
        raise MissingExtra("postgresql:// stores need psycopg 3: pip install 'caravanserai[postgres]'", extra="postgres") from exc
    shown = _redact(dsn)

    def connect(timeout: int = 10) -> Any:
        try:
            return psycopg.connect(dsn, autocommit=True, connect_timeout=timeout)
        except psycopg.Error as exc:
            reason = redact(first_line(exc))
            if not isinstance(exc, psycopg.ProgrammingError) and not _BAD_OPTION.search(reason):
                raise StoreUnavailable(f"cannot connect to PostgreSQL at {shown}: {reason}; check that the server runs "
                                       "and the URL", url=shown) from None
            # libpq could not parse the DSN, or refused an option's value
            raise InvalidStoreUrl(f"PostgreSQL refused the URL {shown}: {reason}; caravanserai's own "
                                  f"options are {', '.join(sorted(_OURS))}, any other must be a libpq parameter "
                                  "(sslmode, connect_timeout, application_name...)", url=shown) from None

    converted: dict[str, str] = {}  # $n placeholders -> psycopg's %s, once per statement

    def run(query: str, params: Sequence[Any]) -> list:  # the store serializes its calls (SqlStore.exec)
        conn = run.connection  # type: ignore[attr-defined]
        if conn.closed:  # dropped under an earlier statement (psycopg marks it broken and closed)
            if run.closed:  # type: ignore[attr-defined]  # the store was closed: it stays closed
                raise StoreUnavailable(f"the store {shown} was closed; open it again with open_store", url=shown)
            if time.monotonic() < run.retry_at:  # type: ignore[attr-defined]  # fail fast between tries
                raise StoreUnavailable(f"PostgreSQL at {shown} could not be reached a moment ago (it dropped the "
                                       "connection); try again in a second", url=shown)
            run.retry_at = time.monotonic() + 0.5  # type: ignore[attr-defined]
            conn = run.connection = connect(timeout=3)  # type: ignore[attr-defined]
            run.retry_at = 0.0  # type: ignore[attr-defined]
        text = converted.get(query)
        if text is None:
            text = converted[query] = re.sub(r"\$\d+", "%s", query)
        cur = conn.execute(text, params)
        return cur.fetchall() if cur.description else []

    run.connection = connect()  # type: ignore[attr-defined]
    run.closed = False  # type: ignore[attr-defined]
    run.retry_at = 0.0  # type: ignore[attr-defined]
    return run


def _redact(dsn: str) -> str:
    return redact(dsn)


class PostgresStore(SqlStore):
    scheme = "postgresql"

    def __init__(self, dsn: str, *, table: str = DEFAULT_TABLE, lease_ttl_ms: int = DEFAULT_TTL_MS,
                 create_schema: bool = False) -> None:
        lease_ttl_ms = check_lease_ttl(lease_ttl_ms)  # before connecting
        exec_ = psycopg_exec(dsn)
        try:
            super().__init__(exec_, "postgres", table, lease_ttl_ms=lease_ttl_ms, url=_redact(dsn),
                             create_schema=create_schema, group_commit=True)  # one connection: batches may share it
        except BaseException:
            exec_.connection.close()
            raise

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
