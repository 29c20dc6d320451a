"""A loopback HTTP proxy in front of a real model server that records every request it forwards.

Tests use it to prove what the *server* saw (e.g. no repeated request for a settled call):
the proxy forwards bytes unchanged and keeps ``(method, path, json body)`` per request.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class CountingProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.requests: list[tuple[str, str, object]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                try:
                    parsed = json.loads(body) if body else None
                except ValueError:
                    parsed = body
                proxy.requests.append((self.command, self.path, parsed))
                request = urllib.request.Request(proxy.upstream + self.path, data=body or None, method=self.command,
                                                 headers={"Content-Type": self.headers.get("Content-Type", "application/json")})
                try:
                    with urllib.request.urlopen(request, timeout=600) as response:
                        status, data = response.status, response.read()
                except urllib.error.HTTPError as exc:
                    status, data = exc.code, exc.read()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _forward

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def posts(self, path_suffix: str = "") -> list[object]:
        return [body for method, path, body in self.requests if method == "POST" and path.endswith(path_suffix)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
