"""The journal store's HTTP/1.1 connections: keep-alive connections, pooled per store.

Why not httpx here: an append is one small JSON request on a connection that stays open, and httpx
(with httpcore and h11) spends about four times the CPU of ``http.client`` on it, which capped a
fleet of clients on a small machine. ``http.client`` opens the connections (TLS, proxy tunnel); where
httptools is installed (the ``[http]`` extra: uvicorn's binding of llhttp, the C parser of Node.js)
the request is written as one buffer and the answer parsed by it, about a fifth of ``http.client``'s
CPU per request (whose header parsing goes through the ``email`` package); without it,
``http.client`` does both. Model requests still go through the user's httpx clients, journaled by
``calls/http_journal.py``; these requests never pass through it.

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
from ..journal import dumps, loads
from .urls import redact

httptools: Any
try:
    import httptools
    _ParseError: type[Exception] = httptools.HttpParserError
except ImportError:  # pragma: no cover - a test hides it instead
    httptools = None
    _ParseError = http.client.HTTPException

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
        return loads(self.content)

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
        self._fixed_head = _header_lines(self.headers)
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
        extra = dict(headers or {})
        body = content if content is not None else b""
        if json_body is not None:
            body = dumps(json_body).encode("utf-8")
            extra["Content-Type"] = "application/json"
        if body or method not in ("GET", "HEAD", "DELETE"):
            extra["Content-Length"] = str(len(body))
        if self.transport is not None:
            status, answer_headers, data = self.transport(method, self.origin + target, {**self.headers, **extra}, body)
            return WireResponse(status, http.client.responses.get(status, ""), data, method, parts.path,
                                {k.lower(): v for k, v in answer_headers.items()})
        head = None
        if httptools is not None:  # the request's head as one text: the fixed headers were formatted once
            fixed = self._fixed_head if extra.keys().isdisjoint(self.headers) else _header_lines(
                {k: v for k, v in self.headers.items() if k not in extra})
            head = f"{method} {target} HTTP/1.1\r\n{fixed}{_header_lines(extra)}\r\n"
        for attempt in (0, 1):
            conn, reused = self._borrow() if attempt == 0 else (self._connect(), False)
            try:
                if head is not None and conn.sock is not None:
                    status, reason, data, answer_headers, keep = _exchange(conn.sock, head, target, body, method == "HEAD")
                else:
                    conn.request(method, target, body=body or None, headers={**self.headers, **extra})
                    answer = conn.getresponse()
                    data = answer.read()
                    status, reason, keep = answer.status, answer.reason, not answer.will_close
                    answer_headers = {k.lower(): v for k, v in answer.getheaders()}
            except _STALE as exc:
                conn.close()
                if reused:  # the server closed idle connections (a restart, its keep-alive timeout): all of them
                    self._drop_idle()
                    continue  # once more, on a new connection
                raise WireError(_describe(exc)) from None
            except (OSError, http.client.HTTPException, _ParseError) as exc:
                conn.close()
                raise WireError(_describe(exc)) from None
            except BaseException:
                conn.close()  # interrupted mid-request: never back in the pool
                raise
            if keep:
                self._give_back(conn)
            else:
                conn.close()
            return WireResponse(status, reason, data, method, parts.path, answer_headers)
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


class _Answer:
    """One response, as httptools' callbacks hand it over."""

    __slots__ = ("head_only", "reason", "headers", "body", "headed", "done", "parser", "keep")

    def __init__(self, head_only: bool) -> None:
        self.head_only = head_only  # the answer to HEAD: its Content-Length announces a body that never comes
        self.reason = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.headed = self.done = self.keep = False
        self.parser: Any = None

    def on_status(self, reason: bytes) -> None:
        self.reason += reason  # in pieces when it straddles two reads

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.headed = True
        self.keep = self.parser.should_keep_alive()  # llhttp answers it here, not once the message is complete
        self.done = self.head_only and not self._interim()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self._interim():  # 100 Continue and its kind: the answer still comes (http.client skips them too)
            self.reason, self.headers, self.body, self.headed = b"", {}, [], False
            return
        self.done = True

    def _interim(self) -> bool:
        code = self.parser.get_status_code()
        return 100 <= code < 200 and code != 101


def _header_lines(headers: Mapping[str, str]) -> str:
    """``Name: value\\r\\n`` per header; a line break inside one would start a header of its own: refused."""
    text = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    if text.count("\n") != len(headers) or text.count("\r") != len(headers):
        raise ValueError(f"a request header holds a line break: {list(headers)}")  # as http.client's putheader
    return text


def _exchange(sock: socket.socket, head: str, target: str, body: bytes,
              head_only: bool) -> tuple[int, str, bytes, dict[str, str], bool]:
    """One request (``head``: its request line and headers) and its answer on a connected socket, parsed
    by httptools: (status, reason, body, lower-cased headers, whether the connection stays open)."""
    if not target.isascii() or not target.isprintable() or " " in target:
        raise http.client.InvalidURL(f"the request target {target!r} holds spaces or control characters")
    sock.sendall(head.encode("latin-1") + body)
    answer = _Answer(head_only)
    parser = answer.parser = httptools.HttpResponseParser(answer)
    heard = False
    while not answer.done:
        chunk = sock.recv(65536)
        if chunk:
            heard = True
            parser.feed_data(chunk)
            continue
        if not heard:  # a kept-alive connection the server had closed
            raise http.client.RemoteDisconnected("Remote end closed connection without response")
        if answer.headed and "content-length" not in answer.headers and "transfer-encoding" not in answer.headers:
            answer.keep = False  # the body ended with the connection
            answer.done = True
        else:
            raise http.client.IncompleteRead(b"".join(answer.body))
    answer.parser = None
    return parser.get_status_code(), answer.reason.decode("latin-1"), b"".join(answer.body), answer.headers, answer.keep


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
