"""``http(s)://host:port/prefix``: a journal kept by a service you run (``caravanserai serve``).

``HttpStore`` (the seed's ``HttpDurableStore``) implements both faces of ``Store`` over the wire
protocol in ``docs/http-protocol.md``, on keep-alive connections (``http_wire``):

- the URL must be https outside localhost / 127.0.0.1 / ::1 (``HttpInsecure``), and a bearer
  token is required (``HttpTokenRequired``); ``from_url`` reads it from ``?token=`` or
  ``$CARAVANSERAI_HTTP_TOKEN``, and the token never appears in ``store.url`` or messages;
- the run lock is an expiring lease (30 s by default, ``lease_ttl_ms`` like every store; the
  seed's ``lock_ttl_ms`` is still accepted, deprecated) renewed in the background at a third of
  its length (``ExpiringLease``); the service fences appends by the lease token, so a client
  paused past its lease cannot append after another took the run over;
- every request has a timeout (``request_timeout_ms``, 10 s) and is retried with exponential
  backoff on connection errors and 5xx answers (``retries``, 3), never on 4xx; mutating requests
  carry an ``Idempotency-Key`` so a retried append or create is applied once. A service that
  stays unreachable raises ``StoreUnavailable`` (nothing acknowledged is lost), a rejected
  token ``HttpUnauthorized`` at once.
"""

from __future__ import annotations

import ipaddress
import os
import random
import re
import sys
import time
import uuid
import warnings
import weakref
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from ..errors import (
    HttpInsecure,
    HttpTokenRequired,
    HttpUnauthorized,
    InvalidRunId,
    InvalidStoreUrl,
    JournalCorruptionError,
    LeaseLost,
    LeaseTtlInvalid,
    ObjectNotFound,
    RunLocked,
    SequenceMismatch,
    StoreFull,
    StoreRequestRejected,
    StoreRequestTooLarge,
    StoreUnavailable,
)
from .base import Lease, Objects, PutMode, Store, holder_info
from .http_wire import Transport, Wire, WireError, WireResponse
from .leases import DEFAULT_TTL_MS, ExpiringLease, check_lease_ttl
from .urls import parse_options, redact, split_url

__all__ = ["HttpDurableStore", "HttpInsecure", "HttpObjects", "HttpStore", "HttpTokenRequired", "HttpUnauthorized",
           "PROTOCOL", "TOKEN_ENV"]

TOKEN_ENV = "CARAVANSERAI_HTTP_TOKEN"
PROTOCOL = 1  # the /v1 wire protocol (docs/http-protocol.md)
LOOPBACK_NAMES = ("localhost",)
URL_OPTIONS: dict[str, Callable[[str], Any]] = {"token": str, "lease_ttl_ms": int, "lock_ttl_ms": int,
                                                "request_timeout_ms": int, "retries": int, "backoff_ms": int}
_FINAL_CODES = frozenset({"store_full", "journal_corruption"})  # 5xx answers a retry cannot change


def _sleep(seconds: float) -> None:  # a seam for tests that count backoff
    time.sleep(seconds)


def is_loopback(host: str | None) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if not host:
        return False
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HttpLease(ExpiringLease):
    """The service's lease on one run: token, granted TTL, and where the next append goes."""

    store: HttpStore

    def __init__(self, store: HttpStore, run_id: str, token: int, holder: dict, ttl: float, started: float,
                 next_seq: int, snapshot: list[str]) -> None:
        super().__init__(store, run_id, token, holder, ttl, started=started, next_seq=next_seq)
        self.snapshot = snapshot

    def _renew(self) -> None:
        self.store._post(f"runs/{self.store._run(self.run_id)}/renew", {"token": self.token}, run_id=self.run_id)

    def _release_remote(self) -> None:
        # One attempt: a lease that is not released expires by itself.
        self.store._post(f"runs/{self.store._run(self.run_id)}/release", {"token": self.token}, run_id=self.run_id,
                         retries=0)


class HttpObjects(Objects):
    """The service's object face: ``"create"`` puts send ``If-None-Match: *`` (412 when the key exists);
    the protocol has no versions, so no compare-and-swap."""

    parallel_gets = 8  # over the store's connection pool

    def __init__(self, store: HttpStore) -> None:
        self.store = store

    def _path(self, key: str) -> str:
        return "objects/" + quote(self.check_key(key), safe="/")

    def put(self, key: str, data: bytes, *, mode: PutMode = "overwrite") -> None:
        path, mode = self._path(key), self.check_mode(mode)
        if mode == "overwrite":
            self.store._request("PUT", path, content=bytes(data), expect=(200, 201))
            return
        response = self.store._request("PUT", path, content=bytes(data), headers={"If-None-Match": "*"},
                                       expect=(200, 201, 412))
        if response.status_code == 412:
            raise self._exists(key, mode)

    def get(self, key: str) -> bytes:
        response = self.store._request("GET", self._path(key), expect=(200, 404))
        if response.status_code == 404:
            if _error_body(response).get("code") != "object_not_found":
                raise self.store._error(response, "GET", self._path(key), None)
            raise self._missing(key)
        return response.content

    def exists(self, key: str) -> bool:
        return self.store._request("HEAD", self._path(key), expect=(200, 404)).status_code == 200

    def list(self, prefix: str = "") -> list[str]:
        return sorted(self.store._json(self.store._request("GET", "objects", params={"prefix": prefix}))["keys"])

    def delete(self, key: str) -> bool:
        return bool(self.store._json(self.store._request("DELETE", self._path(key))).get("deleted"))

    def __repr__(self) -> str:
        return f"HttpObjects({self.store.url!r})"


class HttpStore(Store):
    """The journal and objects of a ``caravanserai serve`` service, over HTTP(S)."""

    scheme = "http"

    def __init__(self, url: str, token: str | None, *, lease_ttl_ms: int | None = None,
                 request_timeout_ms: int = 10_000, retries: int = 3, backoff_ms: int = 100,
                 transport: Transport | None = None, lock_ttl_ms: int | None = None) -> None:
        """``transport``: ``(method, url, headers, body) -> (status, headers, body)`` in place of the network
        (tests)."""
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError as exc:
            raise InvalidStoreUrl(f"journal URL {redact(url)!r} is not valid ({exc}); use https://host[:port][/prefix]",
                                  url=redact(url)) from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidStoreUrl(f"journal URL must look like https://host[:port][/prefix], got {redact(url)!r}",
                                  url=redact(url))
        if parts.username or parts.password:
            raise InvalidStoreUrl("journal URL must not carry credentials; pass token= or set " + TOKEN_ENV,
                                  url=redact(url))
        base = urlunsplit((parts.scheme, parts.netloc, quote(parts.path.rstrip("/"), safe="/%"), "", ""))
        if parts.scheme != "https" and not is_loopback(parts.hostname):
            raise HttpInsecure(f"journal URL must be https outside localhost: {base} would send the token and the "
                               "journal in clear; use https:// (TLS in front of the service) or a loopback address",
                               url=base)
        if not token or not isinstance(token, str) or not token.strip():
            raise HttpTokenRequired(f"the journal service at {base} needs a token: pass token=, add ?token= to the URL "
                                    f"or set {TOKEN_ENV}", url=base)
        if not token.isascii() or not token.isprintable():
            raise InvalidStoreUrl("the journal token must be printable ASCII on one line", url=base)
        ttl_ms = _lease_ttl(lease_ttl_ms, lock_ttl_ms)
        if request_timeout_ms <= 0 or retries < 0 or backoff_ms < 0:
            raise InvalidStoreUrl("request_timeout_ms must be > 0, retries and backoff_ms >= 0", url=base)
        self.url = base
        self.lease_ttl_ms = ttl_ms
        self.request_timeout_ms = int(request_timeout_ms)
        self.retries = int(retries)
        self.backoff = backoff_ms / 1000
        self._api = base + "/v1/"
        self._wire = Wire(base, {"Authorization": f"Bearer {token}", "User-Agent": "caravanserai-http-store"},
                          request_timeout_ms / 1000, transport=transport)
        self._leases: weakref.WeakSet[HttpLease] = weakref.WeakSet()
        self._objects = HttpObjects(self)
        self._closed = False

    @property
    def lock_ttl_ms(self) -> int:
        """Deprecated name of ``lease_ttl_ms`` (the seed's ``lockTtlMs``)."""
        return self.lease_ttl_ms

    @classmethod
    def from_url(cls, url: str) -> HttpStore:
        """``http(s)://host:port/prefix?token=…&lease_ttl_ms=…&request_timeout_ms=…&retries=…``
        (``lock_ttl_ms`` is the deprecated spelling of ``lease_ttl_ms``)."""
        parts = split_url(url, "https://host[:port][/prefix]")
        options = parse_options(parts.query, URL_OPTIONS, url)
        if "lock_ttl_ms" in options:
            old = options.pop("lock_ttl_ms")
            if options.setdefault("lease_ttl_ms", old) != old:
                raise InvalidStoreUrl(f"{redact(url)!r} sets both lease_ttl_ms and its deprecated spelling lock_ttl_ms; "
                                      "keep lease_ttl_ms", url=redact(url), option="lock_ttl_ms")
            _deprecated("the store URL option lock_ttl_ms is deprecated: use lease_ttl_ms, like every store")
        token = options.pop("token", None) or os.environ.get(TOKEN_ENV)
        return cls(urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")), token, **options)

    # ---- plumbing ------------------------------------------------------------------------
    @staticmethod
    def _run(run_id: str) -> str:
        """The run id as one URL path segment (the Store base has already checked it)."""
        return quote(run_id, safe="")

    def _request(self, method: str, path: str, *, json: Any = None, content: bytes | None = None,
                 params: dict | None = None, headers: dict | None = None, expect: Sequence[int] = (200,),
                 retries: int | None = None, run_id: str | None = None) -> WireResponse:
        """Send one logical request, retrying transport errors and 5xx; map error answers to our errors."""
        if self._closed:
            raise StoreUnavailable(f"the journal store {self.url} is closed; open it again", url=self.url)
        headers = dict(headers or {})
        if method not in ("GET", "HEAD"):
            headers["Idempotency-Key"] = os.urandom(16).hex()  # one key for every retry of this call
        attempts = 1 + (self.retries if retries is None else retries)
        problem = ""
        for attempt in range(attempts):
            if attempt:
                _sleep(self.backoff * (2 ** (attempt - 1)) * (0.5 + random.random() / 2))
            try:
                response = self._wire.request(method, self.url + path if path.startswith("/") else self._api + path,
                                              json_body=json, content=content, params=params, headers=headers)
            except WireError as exc:
                problem = str(exc)
                continue
            if response.status_code >= 500:
                if _error_body(response).get("code") in _FINAL_CODES:  # retrying cannot help: say why now
                    raise self._error(response, method, path, run_id)
                problem = f"HTTP {response.status_code}: {_message(response)}"
                continue
            if response.status_code in expect:
                return response
            raise self._error(response, method, path, run_id)
        raise StoreUnavailable(
            f"the journal service at {self.url} is unavailable after {attempts} attempt{'s' * (attempts > 1)} ({problem}); "
            "nothing acknowledged was lost: check that `caravanserai serve` runs there and can reach its store, then "
            "resume the run",
            url=self.url, attempts=attempts,
        )

    def _post(self, path: str, body: dict, **kw: Any) -> Any:
        return self._json(self._request("POST", path, json=body, **kw))

    def _json(self, response: Any) -> Any:
        try:
            value = response.json()
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise StoreUnavailable(f"the journal service at {self.url} answered {response.method} "
                                   f"{response.path} with something that is not a JSON object; is the URL that of "
                                   "`caravanserai serve`?", url=self.url)
        return value

    def _error(self, response: Any, method: str, path: str, run_id: str | None) -> Exception:
        status = response.status_code
        if status in (401, 403):
            return HttpUnauthorized(f"the journal service at {self.url} refused the token (HTTP {status}): check "
                                    f"{TOKEN_ENV} or the token= given to the store; the request was not retried",
                                    url=self.url, status=status)
        body = _error_body(response)
        code, message = body.get("code", ""), body.get("message") or _message(response)
        if code == "run_locked":
            return RunLocked(message, run_id=body.get("run_id", run_id), holder=body.get("holder"))
        if code == "lease_lost":
            return LeaseLost(message, run_id=body.get("run_id", run_id))
        if code == "seq_mismatch":
            return SequenceMismatch(message, run_id=body.get("run_id", run_id), expected=body.get("expected"))
        if code == "invalid_run_id":
            return InvalidRunId(message, run_id=run_id)
        if code == "lease_ttl_invalid":
            return LeaseTtlInvalid(message, option="ttl_ms")
        if code == "journal_corruption":
            return JournalCorruptionError(message, run_id=body.get("run_id", run_id))
        if code == "store_full":
            return StoreFull(message, url=self.url)
        if code == "object_not_found":
            return ObjectNotFound(message, key=body.get("key"))
        if status == 413 or code == "body_too_large":
            limit = re.search(r"(\d+) bytes", message)
            return StoreRequestTooLarge(
                f"the journal service at {self.url} refused {method} /v1/{path} as too large (HTTP 413: {message}); "
                "nothing was written: save smaller values per commit, or serve with a larger limit "
                "(create_app(..., max_body_bytes=N))",
                url=self.url, status=status, limit=int(limit.group(1)) if limit else None)
        if status in (404, 405) and not code:  # not the protocol's answer: the URL points elsewhere
            return InvalidStoreUrl(
                f"{self.url} is not a caravanserai journal service: {method} /v1/{path} answered HTTP {status} "
                f"({message}); use the URL `caravanserai serve` printed (scheme, host and port, no extra path)",
                url=self.url, status=status)
        if status in (400, 404, 405, 422):
            return StoreRequestRejected(
                f"the journal service at {self.url} rejected {method} /v1/{path} (HTTP {status}"
                f"{', ' + code if code else ''}): {message}; nothing was written",
                url=self.url, status=status, service_code=code)
        return StoreUnavailable(f"the journal service at {self.url} answered HTTP {status} to {method} /v1/{path}: "
                                f"{message}", url=self.url, status=status)

    def health(self) -> dict:
        """``GET /health`` (no token needed): ``{"status": "ok", "protocol": 1, ...}``."""
        return self._json(self._request("GET", "/health"))

    # ---- journal face --------------------------------------------------------------------
    def _load(self, run_id: str) -> list[str]:
        return list(self._json(self._request("GET", f"runs/{self._run(run_id)}", run_id=run_id))["lines"])

    def _acquire(self, run_id: str) -> HttpLease:
        started = time.monotonic()
        holder = {**holder_info(), "lease": uuid.uuid4().hex}
        granted = self._post(f"runs/{self._run(run_id)}/acquire", {"holder": holder, "ttl_ms": self.lease_ttl_ms},
                             run_id=run_id)
        lease = HttpLease(self, run_id, int(granted["token"]), granted.get("holder") or {**holder, "token": granted["token"]},
                          int(granted["ttl_ms"]) / 1000, started, int(granted["next_seq"]), list(granted["lines"]))
        self._leases.add(lease)
        return lease

    def _append(self, run_id: str, lines: Sequence[str], *, lease: Lease, seq: int, sync: bool = True) -> None:
        try:
            self._post(f"runs/{self._run(run_id)}/append",
                       {"token": lease.token, "seq": seq, "lines": list(lines), "sync": bool(sync)}, run_id=run_id)
        except LeaseLost as exc:
            lease._lost = "the journal service refused the append (fenced)"  # type: ignore[attr-defined]
            raise LeaseLost(f"run {run_id!r}: the journal service refused this append: {exc.message}", run_id=run_id) from None

    def list(self) -> list[str]:
        return sorted(self._json(self._request("GET", "runs"))["runs"])

    def _journal_versions(self, run_ids: Sequence[str] | None) -> dict[str, str]:
        answer = self._json(self._request("GET", "runs", params={"versions": "1"}))
        versions = answer.get("versions")
        if not isinstance(versions, dict):  # a service from before the run index
            return super()._journal_versions(run_ids)
        versions = {str(k): str(v) for k, v in versions.items()}
        return versions if run_ids is None else {r: versions[r] for r in run_ids if r in versions}

    def _remove(self, run_id: str) -> bool:
        return bool(self._json(self._request("DELETE", f"runs/{self._run(run_id)}", run_id=run_id))["removed"])

    def _close(self) -> None:
        """Release this store's leases (best effort) and its connections."""
        if self._closed:
            return
        for lease in list(self._leases):
            try:
                lease.release()
            except Exception:
                pass
        self._closed = True
        self._wire.close()

    @property
    def objects(self) -> Objects:
        return self._objects


HttpDurableStore = HttpStore  # the seed's name


def _lease_ttl(lease_ttl_ms: int | None, lock_ttl_ms: int | None) -> int:
    """The lease TTL from ``lease_ttl_ms`` or its deprecated spelling ``lock_ttl_ms`` (not both)."""
    if lock_ttl_ms is not None:
        if lease_ttl_ms is not None and lease_ttl_ms != lock_ttl_ms:
            raise LeaseTtlInvalid(f"pass lease_ttl_ms only (got lease_ttl_ms={lease_ttl_ms} and its deprecated "
                                  f"spelling lock_ttl_ms={lock_ttl_ms})", lease_ttl_ms=lease_ttl_ms, option="lock_ttl_ms")
        _deprecated("HttpStore(lock_ttl_ms=...) is deprecated: use lease_ttl_ms=, like every store")
        return check_lease_ttl(lock_ttl_ms, option="lock_ttl_ms")
    return check_lease_ttl(DEFAULT_TTL_MS if lease_ttl_ms is None else lease_ttl_ms)


def _deprecated(message: str) -> None:
    """A DeprecationWarning attributed to the first caller outside caravanserai (the user's line)."""
    frame: FrameType | None = sys._getframe(1)
    level = 2
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == "caravanserai":
        frame, level = frame.f_back, level + 1
    warnings.warn(message, DeprecationWarning, stacklevel=level)


def _error_body(response: Any) -> dict:
    """The ``{"error": {...}}`` object of an error answer ({} if there is none)."""
    try:
        body = response.json()
    except ValueError:
        return {}
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else {}


def _message(response: Any) -> str:
    message = _error_body(response).get("message")
    if not message:
        message = (response.text or response.reason_phrase or "").strip()[:200]
    return " ".join(str(message).split())
