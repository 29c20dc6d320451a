"""A loopback HTTP proxy in front of a real model server that records every request it forwards.

Tests use it to prove what the *server* saw (e.g. no repeated request for a settled call):
the proxy forwards bytes unchanged and keeps ``(method, path, json body)`` per request.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from email.message import Message

from .loopback import LoopbackHTTP


class CountingProxy(LoopbackHTTP):
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.requests: list[tuple[str, str, object]] = []
        super().__init__(self._forward, methods=("GET", "POST"))

    def _forward(self, method: str, path: str, headers: Message, body: bytes) -> tuple[int, bytes, dict[str, str]]:
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = body
        self.requests.append((method, path, parsed))
        request = urllib.request.Request(self.upstream + path, data=body or None, method=method,
                                         headers={"Content-Type": headers.get("Content-Type", "application/json")})
        try:
            with urllib.request.urlopen(request, timeout=600) as response:
                status, data = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, data = exc.code, exc.read()
        return status, data, {"Content-Type": "application/json"}

    def posts(self, path_suffix: str = "") -> list[object]:
        return [body for method, path, body in self.requests if method == "POST" and path.endswith(path_suffix)]
