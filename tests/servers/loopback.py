"""A threaded HTTP server on 127.0.0.1 whose answers come from a function: fakes and proxies in tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# respond(method, path, request headers, request body) -> (status, response body, response headers);
# Content-Length is added after those headers.
Respond = Callable[[str, str, Message, bytes], tuple[int, bytes, dict[str, str]]]


class LoopbackHTTP:
    """Serves ``respond`` for ``methods`` on a free port, in a daemon thread, until ``close()``; ``.url`` is its base."""

    def __init__(self, respond: Respond, methods: tuple[str, ...] = ("POST",)) -> None:
        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                status, data, headers = respond(self.command, self.path, self.headers, body)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        for method in methods:
            setattr(Handler, f"do_{method}", Handler._answer)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
