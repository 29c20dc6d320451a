"""``postgresql://…``: the shared store for a team, an ``SqlDurableStore`` on psycopg 3.

The URL is a libpq URL plus caravanserai's own query options, which are removed before
connecting: ``table`` (default ``caravanserai_durable_journal``), ``lease_ttl_ms`` (30000) and
``create_schema`` (``1`` to run ``SqlDurableStore.schema("postgres")``; otherwise the tables must
exist: ``caravanserai store init URL`` creates them). Needs ``pip install 'caravanserai[postgres]'``.
"""

from __future__ import annotations

import re
from typing import Any, Sequence
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..errors import MissingExtra, StoreUnavailable
from .sql import DEFAULT_TABLE, SqlDurableStore, _options

_OURS = {"table": str, "lease_ttl_ms": int, "create_schema": lambda v: v.lower() in ("1", "true", "yes")}


def psycopg_exec(dsn: str) -> Any:
    """An ``exec`` on one autocommit psycopg connection (every statement durable when it returns)."""
    try:
        import psycopg
    except ImportError as exc:
        raise MissingExtra("postgresql:// stores need psycopg 3: pip install 'caravanserai[postgres]'", extra="postgres") from exc
    try:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(f"cannot connect to PostgreSQL at {_redact(dsn)}: {str(exc).strip().splitlines()[0]}; "
                               "check that the server runs and the URL", url=_redact(dsn)) from None

    converted: dict[str, str] = {}  # $n placeholders -> psycopg's %s, once per statement

    def run(query: str, params: Sequence[Any]) -> list:
        text = converted.get(query)
        if text is None:
            text = converted[query] = re.sub(r"\$\d+", "%s", query)
        cur = conn.execute(text, params)
        return cur.fetchall() if cur.description else []

    run.connection = conn  # type: ignore[attr-defined]
    return run


def _redact(dsn: str) -> str:
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", dsn)


class PostgresStore(SqlDurableStore):
    scheme = "postgresql"

    def __init__(self, dsn: str, *, table: str = DEFAULT_TABLE, lease_ttl_ms: int = 30_000, create_schema: bool = False) -> None:
        super().__init__(psycopg_exec(dsn), "postgres", table, lease_ttl_ms=lease_ttl_ms, url=_redact(dsn),
                         create_schema=create_schema)

    @classmethod
    def from_url(cls, url: str) -> "PostgresStore":
        parts = urlsplit(url)
        query = parse_qsl(parts.query)
        ours = {k: v for k, v in query if k in _OURS}
        theirs = [(k, v) for k, v in query if k not in _OURS]
        dsn = urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(theirs), parts.fragment))
        return cls(dsn, **_options(ours, _OURS, url))

    def close(self) -> None:
        self._exec.connection.close()  # type: ignore[attr-defined]
