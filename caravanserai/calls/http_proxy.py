"""A loopback journaling proxy, for model clients that are not Python on httpx (dspy's sockets, Claude Code).

``run.proxy_url(upstream)`` starts one in the run's own process and returns
``http://127.0.0.1:PORT/<token>``: a request to ``<that>/v1/messages`` is forwarded to
``<upstream>/v1/messages`` through the transport journal, bound to the run, so the same key,
record, replay and stream rules apply and the run's single writer appends. The token (random, in
the path) keeps other local users' processes out. Streams are passed on chunk by chunk.
"""

from __future__ import annotations

import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..errors import CaravanseraiError, MissingExtra, UsageError
from .http_journal import bind, install, unbind
from .journaled import Journal

__all__ = ["HttpProxy", "check_upstream"]

_HOP = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "upgrade", "proxy-connection",
        "accept-encoding", "trailer"}


def check_upstream(upstream: str) -> str:
    """``upstream`` without its trailing slash; UsageError (one line, nothing written) unless http(s)."""
    if not isinstance(upstream, str) or not upstream.startswith(("http://", "https://")):
        raise UsageError(f"proxy upstream must be an http(s) URL such as https://api.openai.com/v1, got {upstream!r}")
    return upstream.rstrip("/")


class HttpProxy:
    """One loopback proxy serving ``run``; ``url_for(upstream)`` gives a base URL per upstream."""

    def __init__(self, run: Journal, host: str = "127.0.0.1", port: int = 0) -> None:
        install()
        try:
            import httpx
        except ImportError:
            raise MissingExtra("the journaling proxy needs httpx: pip install 'caravanserai[openai]'",
                               extra="openai") from None
        self.run = run
        self.client = httpx.Client(timeout=httpx.Timeout(600.0, connect=30.0), follow_redirects=False)
        self.routes: dict[str, str] = {}
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                proxy._forward(self)

            do_GET = do_POST
            do_PUT = do_POST
            do_DELETE = do_POST
            do_PATCH = do_POST
            do_HEAD = do_POST
            do_OPTIONS = do_POST

            def log_message(self, format: str, *args: Any) -> None:  # quiet: the journal is the record
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name=f"caravanserai-proxy-{run.run_id}",
                                       daemon=True)
        self.thread.start()

    def url_for(self, upstream: str) -> str:
        """The base URL standing for ``upstream`` (``https://api.anthropic.com``, ``http://host:8000/v1``)."""
        upstream = check_upstream(upstream)
        token = next((t for t, u in self.routes.items() if u == upstream), None) or secrets.token_urlsafe(12)
        self.routes[token] = upstream
        return f"http://127.0.0.1:{self.server.server_address[1]}/{token}"

    def _forward(self, handler: BaseHTTPRequestHandler) -> None:
        token, _, rest = handler.path.lstrip("/").partition("/")
        upstream = self.routes.get(token)
        if upstream is None:
            handler.send_error(404, "unknown proxy route")
            return
        body = _request_body(handler)
        headers = [(k, v) for k, v in handler.headers.items() if k.lower() not in _HOP]
        request = self.client.build_request(handler.command, upstream + "/" + rest, headers=headers, content=body)
        bound = bind(self.run)  # this handler thread's context: the run's journal
        try:
            response = self.client.send(request, stream=True)
        except CaravanseraiError as exc:  # the journal refused it (over budget, run closed): final, not retried
            unbind(bound)
            _refuse(handler, exc)
            return
        except Exception as exc:
            unbind(bound)
            handler.send_error(502, f"upstream unreachable: {type(exc).__name__}")
            return
        try:
            handler.send_response(response.status_code)
            for key, value in response.headers.items():
                if key.lower() not in _HOP and key.lower() != "content-encoding":
                    handler.send_header(key, value)
            bodiless = handler.command == "HEAD" or response.status_code in (204, 304) or response.status_code < 200
            if not bodiless:
                handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
            for chunk in () if bodiless else response.iter_bytes():  # decoded, one SSE event or body chunk at a time
                if chunk:
                    handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    handler.wfile.flush()
            if not bodiless:
                handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        finally:
            response.close()
            unbind(bound)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.client.close()


def _request_body(handler: BaseHTTPRequestHandler) -> bytes:
    """The request's body, sent with Content-Length or chunked (Transfer-Encoding: chunked)."""
    if "chunked" in (handler.headers.get("transfer-encoding") or "").lower():
        parts: list[bytes] = []
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                    pass
                return b"".join(parts)
            parts.append(handler.rfile.read(size))
            handler.rfile.readline()  # the CRLF after each chunk
    length = int(handler.headers.get("content-length") or 0)
    return handler.rfile.read(length) if length else b""


def _refuse(handler: BaseHTTPRequestHandler, exc: CaravanseraiError) -> None:
    """A journal refusal as a final 400 in both providers' error shapes (SDKs do not retry a 400)."""
    raw = json.dumps({"type": "error", "error": {"type": "invalid_request_error", "code": exc.code,
                                                 "message": exc.message}}).encode()
    handler.send_response(400)
    handler.send_header("content-type", "application/json")
    handler.send_header("x-should-retry", "false")
    handler.send_header("content-length", str(len(raw)))
    handler.end_headers()
    handler.wfile.write(raw)
