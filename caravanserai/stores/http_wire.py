"""The journal store's HTTP/1.1 connections: keep-alive ``http.client`` connections, pooled per store.

Why the standard library and not httpx here: an append is one small JSON request on a connection
that stays open, and httpx (with httpcore and h11) spends about four times the CPU of
``http.client`` on it (``benchmarks/bench_fleet.py``'s client CPU per append and floor rows), which
capped a fleet of clients on a small machine. Model requests still go through the user's httpx
clients, journaled by ``calls/http_journal.py``; these requests never pass through it.

What it does: one idle connection pool (any thread may borrow one), a timeout per request, TLS
verified with the system's trust store (``ssl.create_default_context``, which honours
``SSL_CERT_FILE``/``SSL_CERT_DIR``) plus certifi's where installed, ``HTTPS_PROXY`` (a CONNECT tunnel
through an http:// proxy, ``user:password@`` sent as Basic, ``NO_PROXY`` respected), idle connections
the server closed left out, and one immediate resend on a new connection when a kept-alive one turns
out closed anyway (every mutating
request carries an ``Idempotency-Key``, so a resend is applied once). Anything else that fails on
the way is a ``WireError``; retrying is the store's decision.
"""

from __future__ import annotations

import base64
import http.client
import json
import select
import socket
import ssl
import threading
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlencode, urlsplit

from ..errors import StoreUnavailable
from .urls import redact

# (method, url, headers, body) -> (status, headers, body): a stand-in for the network, in tests
Transport = Callable[[str, str, dict[str, str], bytes], tuple[int, Mapping[str, str], bytes]]
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class WireError(Exception):
    """The request did not get an answer (refused, reset, timed out, TLS): one line, retryable."""


@dataclass
class WireResponse:
    """An answer: status, lower-cased headers, the whole body, and what it answered."""

    status_code: int
    reason_phrase: str
    content: bytes
    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        """The body as JSON (``ValueError`` when it is not)."""
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


class Wire:
    """Keep-alive connections to one origin (``scheme://host:port``) with fixed default headers."""

    def __init__(self, base_url: str, headers: Mapping[str, str], timeout: float, *,
                 transport: Transport | None = None) -> None:
        parts = urlsplit(base_url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if self.https else 80)
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.headers = {"Host": parts.netloc, "Accept": "application/json", "Accept-Encoding": "identity",
                        **headers}
        self.timeout = timeout
        self.transport = transport
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._ssl: ssl.SSLContext | None = None
        self._closed = False

    def request(self, method: str, url: str, *, content: bytes | None = None, json_body: Any = None,
                params: Mapping[str, str] | None = None, headers: Mapping[str, str] | None = None) -> WireResponse:
        """Send one request (``url`` absolute, on this origin) and read the whole answer."""
        parts = urlsplit(url)
        target = (parts.path or "/") + ("?" + urlencode(params) if params else "")
        sent = {**self.headers, **(headers or {})}
        body = content if content is not None else b""
        if json_body is not None:
            body = json.dumps(json_body, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
            sent["Content-Type"] = "application/json"
        if body or method not in ("GET", "HEAD", "DELETE"):
            sent["Content-Length"] = str(len(body))
        if self.transport is not None:
            status, answer_headers, data = self.transport(method, self.origin + target, sent, body)
            return WireResponse(status, http.client.responses.get(status, ""), data, method, parts.path,
                                {k.lower(): v for k, v in answer_headers.items()})
        for attempt in (0, 1):
            conn, reused = self._borrow() if attempt == 0 else (self._connect(), False)
            try:
                conn.request(method, target, body=body or None, headers=sent)
                answer = conn.getresponse()
                data = answer.read()
            except _STALE as exc:
                conn.close()
                if reused:  # the server closed idle connections (a restart, its keep-alive timeout): all of them
                    self._drop_idle()
                    continue  # once more, on a new connection
                raise WireError(_describe(exc)) from None
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                raise WireError(_describe(exc)) from None
            except BaseException:
                conn.close()  # interrupted mid-request: never back in the pool
                raise
            response = WireResponse(answer.status, answer.reason, data, method, parts.path,
                                    {k.lower(): v for k, v in answer.getheaders()})
            if answer.will_close:
                conn.close()
            else:
                self._give_back(conn)
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    def _borrow(self) -> tuple[http.client.HTTPConnection, bool]:
        """An idle connection the server has not closed (a readable idle socket is its EOF), else a new one."""
        while True:
            with self._lock:
                if self._closed:
                    raise WireError("the store's connections are closed")
                if not self._idle:
                    break
                conn = self._idle.pop()
            try:
                readable = bool(conn.sock) and bool(select.select([conn.sock], [], [], 0)[0])
            except (OSError, ValueError):
                readable = True
            if not readable:
                return conn, True
            conn.close()
        return self._connect(), False

    def _drop_idle(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < 16:
                self._idle.append(conn)
                return
        conn.close()

    def _connect(self) -> http.client.HTTPConnection:
        proxy = _proxy_for(self.host, self.https)
        if not self.https:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        else:
            if self._ssl is None:
                self._ssl = _tls_context()
            if proxy is None:
                conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=self._ssl)
            else:
                proxy_host, proxy_port, proxy_headers = proxy
                conn = http.client.HTTPSConnection(proxy_host, proxy_port, timeout=self.timeout, context=self._ssl)
                conn.set_tunnel(self.host, self.port, headers=proxy_headers)
        try:
            conn.connect()
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # headers and body leave at once
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise WireError(_describe(exc)) from None
        return conn

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _proxy_for(host: str, https: bool) -> tuple[str, int, dict[str, str]] | None:
    """``HTTPS_PROXY``'s (host, port, CONNECT headers) for an https origin not excluded by ``NO_PROXY``;
    None otherwise (plain http is loopback only, never proxied). Only an ``http://`` proxy is spoken to."""
    if not https:
        return None
    proxy = urllib.request.getproxies().get("https")
    if not proxy or urllib.request.proxy_bypass(host):
        return None
    parts = urlsplit(proxy if "://" in proxy else "http://" + proxy)
    if parts.scheme != "http" or not parts.hostname:
        raise StoreUnavailable(f"HTTPS_PROXY={redact(proxy)} is not an http://host:port proxy, the only kind the journal "
                               "store speaks to; fix it, or add the journal's host to NO_PROXY")
    headers = {}
    if parts.username is not None:
        credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        headers["Proxy-Authorization"] = "Basic " + base64.b64encode(credentials).decode("ascii")
    return parts.hostname, parts.port or 80, headers


def _tls_context() -> ssl.SSLContext:
    """The system's trust store, plus certifi's bundle where certifi is installed (what httpx trusted)."""
    context = ssl.create_default_context()
    try:
        import certifi
    except ImportError:
        return context
    context.load_verify_locations(certifi.where())
    return context


def _describe(exc: BaseException) -> str:
    """``Type: detail`` on one line."""
    return f"{type(exc).__name__}: {str(exc) or 'no detail'}".replace("\n", " ")
