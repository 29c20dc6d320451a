"""The journal service: ``caravanserai serve``, the server side of ``http(s)://`` stores.

A Starlette app (``create_app(store, token)``) that puts any other ``Store`` (a local directory,
SQLite, PostgreSQL, object storage) behind the wire protocol of ``docs/http-protocol.md``; run it
with ``serve(store_url)`` under uvicorn (``pip install 'caravanserai[http]'``).

- **Auth.** Every endpoint but ``GET /health`` needs ``Authorization: Bearer <token>``, compared
  in constant time (``hmac.compare_digest`` over SHA-256 digests, so not even the length leaks).
- **Leases.** The service keeps its own lease table: run → (token, holder, expiry by the
  *service's* monotonic clock). While a client holds a run, the service holds the backing store's
  lease for it and appends through that. When the client's lease expires (it stopped renewing)
  another client may take the run over at once, with a larger token; until then a late renewal or
  append of the holder is still granted (nobody else holds the run), and one more TTL later the
  reaper lets the backing lease go for writers outside the service. Tokens are the backing store's
  fencing tokens where they grow, and never go backwards while the service runs.
- **Fencing.** An append carries the lease token and its seq; a token that is not the current
  one or a wrong seq is refused with 409, whatever the client's clock says.
- **Errors.** Library errors travel with their own ``code`` and the status of ``_ANSWERS``; ``ApiError``
  is only for what the protocol itself refuses (a malformed body, a body too large, an existing object).
- **Retries.** Mutating requests may carry ``Idempotency-Key``; a repeat of a key answered in the last 10
  minutes gets the recorded answer, so a client retrying after a lost response appends and creates once.

Blocking store calls run in Starlette's thread pool; one run's operations are serialised by a lock striped
over run ids. Routes are module functions ``(app, request, body) -> response`` listed in ``_ROUTES``.

**Group commit.** Appends of different runs that arrive together are flushed together: with a SQL
backing store (``append_batch``) they queue on the event loop and one worker-thread ``append_batch``
(one COMMIT) takes each batch (``append_async``); other backing stores append in the thread pool.
Each append is answered once durable; a member refused by its own checks gets its own 409 and the
others commit; a failed flush fails every member. Views are handed off after the answer is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import json
import os
import sys
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import (
    ApiError,
    CaravanseraiError,
    JournalCorruptionError,
    LeaseLost,
    MissingExtra,
    ObjectNotFound,
    ObjectPreconditionFailed,
    RunLocked,
    SequenceMismatch,
    StoreFull,
    StoreUnavailable,
)
from ..ids import validate_run_id
from ..journal import loads
from .base import Lease, Objects, Store, describe_holder, holder_is_dead
from .http import PROTOCOL, TOKEN_ENV, HttpStore, HttpTokenRequired, is_loopback
from .http_replay import REPLAY_MAX_BODY, Replay
from .leases import DEFAULT_TTL_MS, check_lease_ttl

__all__ = ["ApiError", "JournalService", "check_bearer", "create_app", "serve"]

MAX_TTL_MS = 600_000
MAX_BODY_BYTES = 256 * 1024 * 1024
MAX_HOLDER_BYTES = 4096


def check_bearer(header: str | None, expected: bytes) -> bool:
    """True if ``header`` is ``Bearer <expected>``; constant time in the token's content and length."""
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer":
        given = ""
    return hmac.compare_digest(hashlib.sha256(given.strip().encode("utf-8", "surrogateescape")).digest(),
                               hashlib.sha256(expected).digest())


@dataclass
class _Held:
    token: int
    holder: dict
    lease_id: str | None
    ttl: float
    expires_at: float  # the service's monotonic clock
    backing: Lease  # its next_seq is the run's next seq (Store.append checks and advances it)


class JournalService:
    """The protocol's logic, independent of Starlette: a lease table in front of a backing store."""

    def __init__(self, store: Store, *, max_ttl_ms: int = MAX_TTL_MS, reap_every: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(store, HttpStore):
            raise ValueError("the journal service must be backed by a local, SQL or object store, not another http(s):// one")
        self.store = store
        self.max_ttl_ms = max_ttl_ms
        self.clock = clock
        self._held: dict[str, _Held] = {}
        self._last_token: dict[str, int] = {}
        self._token_floor = time.time_ns() // 1000  # above an earlier instance's tokens: a backing may forget them
        self._table = threading.Lock()
        self._stripes = [threading.Lock() for _ in range(256)]  # runs sharing a stripe wait for each other
        self._views = type(store)._committed is not Store._committed
        # a store that commits many runs' appends in one transaction gets them straight from the event loop
        self._batch: Callable[[list], list] | None = (getattr(store, "append_batch", None)
                                                      if getattr(store, "group_commit", False) else None)
        self._pending: list[tuple[str, int, int, list[str], asyncio.Future]] = []
        self._flush_scheduled = False
        self._flushing = False  # a batch is being committed in a worker thread
        self._tasks: set[asyncio.Task] = set()  # appends the loop sent to the thread pool
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, args=(reap_every,), name="caravanserai-serve-reaper",
                                        daemon=True)
        self._reaper.start()

    # ---- lease table -------------------------------------------------------------------------
    def _lock(self, run_id: str) -> threading.Lock:
        # crc32, not hash(): a run maps to the same stripe in every process (str hashes are salted per process)
        return self._stripes[zlib.crc32(run_id.encode("utf-8")) % len(self._stripes)]

    def _drop(self, run_id: str, held: _Held) -> None:
        with self._table:
            if self._held.get(run_id) is held:
                del self._held[run_id]
        try:
            held.backing.release()
        except Exception:
            pass  # the backing lease expires by itself

    def _current(self, run_id: str, token: int | None = None) -> _Held | None:
        """The lease on ``run_id``; dropped if its backing lease is gone or, but for ``token``, expired. Under the run's lock."""
        held = self._held.get(run_id)
        if held is not None and (not held.backing.renewable or (held.expires_at <= self.clock() and held.token != token)):
            self._drop(run_id, held)
            return None
        return held

    def reap(self) -> None:
        """Let go of the backing leases of client leases expired one TTL ago (a late renewal's grace)."""
        with self._table:
            candidates = [(run_id, held) for run_id, held in self._held.items() if self._reapable(held)]
        for run_id, held in candidates:
            with self._lock(run_id):
                if self._held.get(run_id) is held and self._reapable(held):
                    self._drop(run_id, held)

    def _reapable(self, held: _Held) -> bool:
        return held.expires_at + held.ttl <= self.clock()

    def _reap_loop(self, every: float) -> None:
        while not self._stop.wait(every):
            try:
                self.reap()
            except Exception:
                pass

    def close(self) -> None:
        """Stop the reaper and release every backing lease (clients see ``lease_lost`` after a restart)."""
        self._stop.set()
        with self._table:
            held = list(self._held.items())
        for run_id, entry in held:
            self._drop(run_id, entry)

    # ---- journal ------------------------------------------------------------------------------
    def acquire(self, run_id: str, holder: dict, ttl_ms: int) -> dict:
        ttl_ms = min(int(ttl_ms), self.max_ttl_ms)
        lease_id = holder.get("lease") if isinstance(holder.get("lease"), str) else None
        with self._lock(run_id):
            current = self._current(run_id)
            if current is not None and holder_is_dead(current.holder):  # a client killed on the service's machine
                self._drop(run_id, current)
                current = None
            if current is not None:
                if lease_id is not None and current.lease_id == lease_id:  # a retry of an acquire that succeeded
                    current.expires_at = self.clock() + current.ttl
                    return self._grant(current, self.store.load(run_id))
                raise RunLocked(f"run {run_id!r} is being written by {describe_holder(current.holder)} (through the "
                                "journal service); wait for its lease to expire or stop that process",
                                run_id=run_id, holder=current.holder)
            backing = self.store.acquire(run_id)  # RunLocked if a writer outside the service holds it
            try:
                lines = self.store.load_held(backing)
                token = max(int(backing.token), self._last_token.get(run_id, 0) + 1, self._token_floor)
                held = _Held(token, {**holder, "token": token}, lease_id, ttl_ms / 1000, self.clock() + ttl_ms / 1000,
                             backing)
                with self._table:
                    self._held[run_id] = held
                    self._last_token[run_id] = token
            except BaseException:
                backing.release()
                raise
        try:
            self.store.refresh_views(run_id, writer=True)  # finish views a killed writer left (local store)
        except Exception:
            pass
        return self._grant(held, lines)

    @staticmethod
    def _grant(held: _Held, lines: list[str]) -> dict:
        return {"token": held.token, "ttl_ms": int(held.ttl * 1000), "holder": held.holder,
                "next_seq": held.backing.next_seq, "lines": lines}

    def _check(self, run_id: str, token: int, what: str) -> _Held:
        """The holder's lease, also expired while no other client took it (a late request proves it alive); else LeaseLost."""
        held = self._held.get(run_id)
        if held is None or held.token != token:
            now = "no writer holds it now" if held is None else f"it is held with token {held.token} now"
            raise LeaseLost(f"run {run_id!r}: lease token {token} is not the current lease ({now}); {what} refused: "
                            "open the run again", run_id=run_id)
        if self._current(run_id, token) is None:
            raise LeaseLost(f"run {run_id!r}: the service lost its lease on the backing store (token {token}); {what} "
                            "refused: open the run again", run_id=run_id)
        if held.expires_at <= self.clock():
            held.expires_at = self.clock() + held.ttl
        return held

    def renew(self, run_id: str, token: int) -> dict:
        with self._lock(run_id):
            held = self._check(run_id, token, "renewal")
            try:
                self._catch_up(held)
            except LeaseLost as exc:
                raise self._refused(run_id, held, exc) from None
            held.expires_at = self.clock() + held.ttl
            return {"token": held.token, "ttl_ms": int(held.ttl * 1000)}

    @staticmethod
    def _catch_up(held: _Held) -> None:
        """Renew the backing lease where its deadline passed (the service too busy); else its thread does."""
        if not held.backing.held:
            held.backing.renew()

    def _refused(self, run_id: str, held: _Held, exc: LeaseLost) -> Exception:
        """LeaseLost (dropped) if the backing lease is really gone, else StoreUnavailable: not renewed in time, retry."""
        if held.backing.renewable:
            return StoreUnavailable(f"run {run_id!r}: the journal service could not renew its lease on the backing "
                                    f"store in time ({exc}); retry", run_id=run_id)
        self._drop(run_id, held)
        return LeaseLost(f"run {run_id!r}: the backing store refused this lease ({exc}); open the run again",
                         run_id=run_id)

    def release(self, run_id: str, token: int) -> dict:
        with self._lock(run_id):
            held = self._held.get(run_id)
            if held is None or held.token != token:
                return {"released": False}
            self._drop(run_id, held)
            return {"released": True}

    def append(self, run_id: str, token: int, seq: int, lines: list[str], sync: bool, *, views: bool = True) -> dict:
        """Append through the backing lease (a wrong seq: ``SequenceMismatch``); ``views=False``: the
        caller hands the lines to ``views`` itself, after answering."""
        with self._lock(run_id):
            held = self._check(run_id, token, "append")
            try:
                self._catch_up(held)
                self.store.append(run_id, lines, lease=held.backing, seq=seq, sync=sync)
            except LeaseLost as exc:
                raise self._refused(run_id, held, exc) from None
            if views:
                self.views(run_id, lines)
            return {"next_seq": held.backing.next_seq}

    async def append_async(self, run_id: str, token: int, seq: int, lines: list[str], sync: bool) -> dict:
        """``append`` from the event loop. With a batching backing store (SQL), appends queue here and
        one flush at a time commits everything queued (``_flush_pending``): the first waiter starts a
        flush right after the current loop turn (no timer), and what arrives while it runs is the next
        batch. Otherwise, and for a run whose lock a thread holds, ``append`` runs in the thread pool."""
        from starlette.concurrency import run_in_threadpool

        if self._batch is None:
            return await run_in_threadpool(functools.partial(self.append, views=False), run_id, token, seq, lines, sync)
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        self._pending.append((run_id, token, seq, lines, future))
        if not self._flush_scheduled and not self._flushing:
            self._flush_scheduled = True
            loop.call_soon(self._flush_pending)
        return await future

    def _flush_pending(self) -> None:
        """Check the queued appends (on the loop) and commit them as one batch in a worker thread."""
        self._flush_scheduled = False
        pending, self._pending = self._pending, []
        batch, locks, batched = [], [], set()
        try:
            for run_id, token, seq, lines, future in pending:
                lock = self._lock(run_id)
                if run_id in batched or (lock not in locks and not lock.acquire(blocking=False)):
                    self._in_thread(future, run_id, token, seq, lines)  # this run's second append, or a thread has it
                    continue
                if lock not in locks:  # runs sharing a stripe share its lock, held once for the batch
                    locks.append(lock)
                batched.add(run_id)
                try:
                    batch.append((self._check(run_id, token, "append"), run_id, seq, lines, future))
                except CaravanseraiError as exc:
                    future.set_exception(exc)
        except Exception as exc:  # an unexpected failure: no lock stays taken, no append waits forever
            for lock in locks:
                lock.release()
            for *_, future in pending:
                if not future.done():
                    future.set_exception(exc)
            return
        if not batch:
            for lock in locks:
                lock.release()
            return
        self._flushing = True
        loop = asyncio.get_running_loop()
        flush = loop.run_in_executor(None, self._commit, batch, locks)
        flush.add_done_callback(lambda done: self._flushed(done, batch))

    def _commit(self, batch: list, locks: list[threading.Lock]) -> list:
        """(worker thread) The backing store's group commit of ``batch``; per member an answer or an error."""
        assert self._batch is not None  # append_async queues only then
        try:
            outcomes: list[Exception | None] = [None] * len(batch)
            members = []
            for i, (held, run_id, seq, lines, _) in enumerate(batch):
                try:
                    self._catch_up(held)
                except Exception as exc:  # this member's answer; the others commit
                    outcomes[i] = exc
                    continue
                members.append((i, (run_id, lines, held.backing, seq)))
            try:
                committed: list = self._batch([write for _, write in members]) if members else []
            except Exception as exc:  # the batch itself failed: no member is acknowledged
                committed = [exc] * len(members)
            for (i, _), outcome in zip(members, committed, strict=True):
                outcomes[i] = outcome
            answers: list = []
            for (held, run_id, _, _, _), outcome in zip(batch, outcomes, strict=True):
                if isinstance(outcome, LeaseLost):
                    outcome = self._refused(run_id, held, outcome)
                answers.append({"next_seq": held.backing.next_seq} if outcome is None else outcome)
            return answers
        finally:
            for lock in locks:
                lock.release()

    def _flushed(self, done: asyncio.Future, batch: list) -> None:
        """(event loop) Answer the members of a flushed batch; start the next flush if appends queued."""
        self._flushing = False
        try:
            answers = done.result()
        except BaseException as exc:  # the worker itself failed
            answers = [exc] * len(batch)
        for (_, _, _, _, future), answer in zip(batch, answers, strict=True):
            if not future.done():  # (a client that went away cancelled it)
                if isinstance(answer, BaseException):
                    future.set_exception(answer)
                else:
                    future.set_result(answer)
        if self._pending and not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_pending)

    def _in_thread(self, future: asyncio.Future, *args: Any) -> None:
        from starlette.concurrency import run_in_threadpool

        async def run() -> None:
            try:
                result = await run_in_threadpool(functools.partial(self.append, views=False), *args, True)
            except Exception as exc:
                if not future.done():
                    future.set_exception(exc)
                return
            if not future.done():
                future.set_result(result)

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def views(self, run_id: str, lines: list[str]) -> None:
        """Hand acknowledged lines to the backing store's views (the local store renders files)."""
        if self._views:
            try:
                self.store.committed(run_id, [json.loads(line) for line in lines])
            except Exception:
                pass  # views are a convenience; the journal is the truth

    def remove(self, run_id: str) -> dict:
        with self._lock(run_id):
            held = self._current(run_id)
            if held is not None:
                raise RunLocked(f"run {run_id!r} is being written by {describe_holder(held.holder)} (through the journal "
                                "service); stop it before cleaning", run_id=run_id, holder=held.holder)
            return {"removed": bool(self.store.remove(run_id))}


# ---- HTTP layer -----------------------------------------------------------------------------------
def _json_body(body: bytes) -> dict:
    try:
        value = loads(body or b"{}")
    except ValueError:
        raise ApiError(400, "bad_request", "the request body must be a JSON object") from None
    if not isinstance(value, dict):
        raise ApiError(400, "bad_request", "the request body must be a JSON object")
    return value


def _int(body: dict, name: str, default: int | None = None) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, "bad_request", f"field {name!r} must be an integer")
    return value


def _run_id(request: Any, store: Store | None = None) -> str:
    """The path's run id by the one rule (``ids.validate_run_id``); with ``store`` (load, remove) also an
    existing 0.2.0 name the backing store vouches for (``store.is_legacy_name``)."""
    return validate_run_id(request.path_params["run"], legacy=None if store is None else store.is_legacy_name)


def _error(status: int, code: str, message: str, **fields: Any) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse({"error": {"code": code, "message": message, **fields}}, status_code=status)


def _answer(data: Any, status: int = 200) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse(data, status_code=status)


# Library errors -> (HTTP status, the fields the error body carries); the first match wins, so a
# subclass comes before its base. Other bad input (a CaravanseraiError that is a ValueError) is 400.
_ANSWERS: tuple[tuple[type[CaravanseraiError], int, tuple[str, ...]], ...] = (
    (RunLocked, 409, ("run_id", "holder")),
    (LeaseLost, 409, ("run_id",)),
    (SequenceMismatch, 409, ("run_id", "expected")),
    (JournalCorruptionError, 422, ("run_id",)),
    (StoreFull, 507, ()),
    (ObjectNotFound, 404, ("key",)),
    (ObjectPreconditionFailed, 412, ("key",)),
    (StoreUnavailable, 503, ()),
)


def _error_for(exc: BaseException) -> Any:
    """The JSON error answer for ``exc`` (never a traceback; fields only where ``_ANSWERS`` names them)."""
    if isinstance(exc, ApiError):
        return _error(exc.fields["status"], exc.fields["code"], exc.message, **exc.answer_fields())
    if isinstance(exc, CaravanseraiError):
        for kind, status, names in _ANSWERS:
            if isinstance(exc, kind):
                return _error(status, exc.code, exc.message, **{k: exc.fields[k] for k in names if k in exc.fields})
        return _error(400 if isinstance(exc, ValueError) else 500, exc.code, exc.message)
    if isinstance(exc, ValueError):
        return _error(400, "bad_request", " ".join(str(exc).split()))
    return _error(500, "internal_error", f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")


@dataclass
class _App:
    """What every route needs: the backing store, its lease table, the replay cache and the limits."""

    store: Store
    service: JournalService
    replay: Replay
    expected: bytes  # the token
    max_body_bytes: int

    @property
    def objects(self) -> Objects:
        return self.store.objects


Handler = Callable[[_App, Any, bytes], Any]


# ---- routes: (app, request, body) -> response, run in the thread pool -------------------------------
def _list_runs(app: _App, request: Any, body: bytes) -> Any:
    if request.query_params.get("versions") == "1":  # the run index's change tokens, from the backing store
        versions = app.store.journal_versions()
        return _answer({"runs": sorted(versions), "versions": versions})
    return _answer({"runs": sorted(app.store.list())})


def _load(app: _App, request: Any, body: bytes) -> Any:
    lines = app.store.load(_run_id(request, app.store))
    return _answer({"lines": lines, "next_seq": len(lines)})


def _remove(app: _App, request: Any, body: bytes) -> Any:
    return _answer(app.service.remove(_run_id(request, app.store)))


def _acquire(app: _App, request: Any, body: bytes) -> Any:
    data = _json_body(body)
    holder = data.get("holder", {})
    if not isinstance(holder, dict) or len(json.dumps(holder)) > MAX_HOLDER_BYTES:
        raise ApiError(400, "bad_request", f"'holder' must be a JSON object of at most {MAX_HOLDER_BYTES} bytes")
    ttl_ms = check_lease_ttl(_int(data, "ttl_ms", DEFAULT_TTL_MS), option="ttl_ms")
    return _answer(app.service.acquire(_run_id(request), holder, ttl_ms))


def _renew(app: _App, request: Any, body: bytes) -> Any:
    return _answer(app.service.renew(_run_id(request), _int(_json_body(body), "token")))


def _release(app: _App, request: Any, body: bytes) -> Any:
    return _answer(app.service.release(_run_id(request), _int(_json_body(body), "token")))


def _append_request(request: Any, body: bytes) -> tuple[str, int, int, list[str], bool]:
    """(run id, token, seq, lines, sync) of an append request, checked."""
    data = _json_body(body)
    lines = data.get("lines")
    if not isinstance(lines, list) or not lines or not all(isinstance(x, str) and "\n" not in x for x in lines):
        raise ApiError(400, "bad_request", "'lines' must be a non-empty list of strings without newlines")
    sync = data.get("sync", True)
    if not isinstance(sync, bool):
        raise ApiError(400, "bad_request", "'sync' must be true or false")
    return _run_id(request), _int(data, "token"), _int(data, "seq"), lines, sync


def _appended(app: _App, run_id: str, lines: list[str], result: dict) -> Any:
    """The answer to a durable append; the views hand-off runs after it is sent, off the append's latency."""
    from starlette.background import BackgroundTask

    answer = _answer(result)
    if app.service._views:

        async def views() -> None:
            app.service.views(run_id, lines)

        answer.background = BackgroundTask(views)
    return answer


def _append(app: _App, request: Any, body: bytes) -> Any:
    run_id, token, seq, lines, sync = _append_request(request, body)
    return _appended(app, run_id, lines, app.service.append(run_id, token, seq, lines, sync, views=False))


async def _append_async(app: _App, request: Any, body: bytes) -> Any:
    """``_append`` on the event loop: the service gathers concurrent appends into one commit."""
    run_id, token, seq, lines, sync = _append_request(request, body)
    return _appended(app, run_id, lines, await app.service.append_async(run_id, token, seq, lines, sync))


def _list_objects(app: _App, request: Any, body: bytes) -> Any:
    return _answer({"keys": sorted(app.objects.list(request.query_params.get("prefix", "")))})


def _object_key(request: Any) -> str:
    return Objects.check_key(request.path_params["key"])


def _get_object(app: _App, request: Any, body: bytes) -> Any:
    from starlette.responses import Response

    return Response(app.objects.get(_object_key(request)), media_type="application/octet-stream")


def _head_object(app: _App, request: Any, body: bytes) -> Any:
    from starlette.responses import Response

    return Response(b"", status_code=200 if app.objects.exists(_object_key(request)) else 404)


def _delete_object(app: _App, request: Any, body: bytes) -> Any:
    return _answer({"deleted": bool(app.objects.delete(_object_key(request)))})


def _put_object(app: _App, request: Any, body: bytes) -> Any:
    key = _object_key(request)
    if request.headers.get("if-none-match", "").strip() == "*":
        if app.objects.put_if_absent(key, body):
            return _answer({"created": True}, 201)
        return _error(412, "object_exists", f"an object already exists at key {key!r}", key=key)
    app.objects.put(key, body)
    return _answer({"written": True})


async def _health(request: Any) -> Any:
    return _answer({"status": "ok", "service": "caravanserai-journal", "protocol": PROTOCOL})


# path, handler, methods, whether an Idempotency-Key replays it (acquire has its own retry: the holder's lease id).
# Starlette tries routes in order, a regular expression each: the ones a fleet sends over and over come first.
_ROUTES: tuple[tuple[str, Handler, tuple[str, ...], bool], ...] = (
    ("/v1/runs/{run}/append", _append, ("POST",), True),
    ("/v1/runs/{run}/renew", _renew, ("POST",), True),
    ("/v1/runs", _list_runs, ("GET",), True),
    ("/v1/runs/{run}", _load, ("GET",), True),
    ("/v1/runs/{run}", _remove, ("DELETE",), True),
    ("/v1/runs/{run}/acquire", _acquire, ("POST",), False),
    ("/v1/runs/{run}/release", _release, ("POST",), True),
    ("/v1/objects", _list_objects, ("GET",), True),
    ("/v1/objects/{key:path}", _head_object, ("HEAD",), True),  # before GET, which Starlette also answers HEAD with
    ("/v1/objects/{key:path}", _get_object, ("GET",), True),
    ("/v1/objects/{key:path}", _put_object, ("PUT",), True),
    ("/v1/objects/{key:path}", _delete_object, ("DELETE",), True),
)


# routes that have a coroutine twin run on the event loop (blocking work goes to the thread pool only when needed)
_ASYNC_ROUTES: dict[Handler, Callable[[_App, Any, bytes], Any]] = {_append: _append_async}


# ---- plumbing around every route ------------------------------------------------------------------
def _handle(app: _App, fn: Handler, request: Any, body: bytes, key: tuple | None) -> Any:
    """Run ``fn``, or answer a repeated Idempotency-Key with the recorded answer; errors become JSON."""
    from starlette.responses import Response

    if key is not None:
        recorded = app.replay.begin(key)
        if recorded is not None:
            status, content, media = recorded
            return Response(content, status_code=status, media_type=media, headers={"Idempotent-Replay": "true"})
    response = None
    try:
        response = fn(app, request, body)
    except Exception as exc:  # every failure is a JSON error answer
        response = _error_for(exc)
    finally:
        if key is not None:
            app.replay.finish(key, _kept(response))
    return response


def _kept(response: Any) -> tuple[int, bytes, str] | None:
    """What the replay cache keeps of an answer (not a 5xx: a retry may succeed; not a large body)."""
    if response is not None and response.status_code < 500 and len(response.body) <= REPLAY_MAX_BODY:
        return (response.status_code, bytes(response.body), response.media_type)
    return None


async def _handle_async(app: _App, fn: Handler, request: Any, body: bytes, key: tuple | None) -> Any:
    """``_handle`` on the event loop; a key whose first request still runs waits for its answer in a thread."""
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import Response

    if key is not None:
        recorded = app.replay.try_begin(key)
        if recorded is False:
            return await run_in_threadpool(_handle, app, fn, request, body, key)
        if isinstance(recorded, tuple):
            status, content, media = recorded
            return Response(content, status_code=status, media_type=media, headers={"Idempotent-Replay": "true"})
    response = None
    try:
        response = await _ASYNC_ROUTES[fn](app, request, body)
    except Exception as exc:  # every failure is a JSON error answer
        response = _error_for(exc)
    finally:
        if key is not None:
            app.replay.finish(key, _kept(response))
    return response


def _refusal(app: _App, request: Any) -> Any | None:
    """The answer for a request refused before reading it (token, declared size), or None."""
    if not check_bearer(request.headers.get("authorization"), app.expected):
        response = _error(401, "unauthorized", "missing or wrong bearer token")
        response.headers["WWW-Authenticate"] = 'Bearer realm="caravanserai"'
        return response
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > app.max_body_bytes:
        return _error(413, "body_too_large", f"request bodies are limited to {app.max_body_bytes} bytes")
    return None


def _endpoint(app: _App, fn: Handler, replayed: bool) -> Callable[[Any], Any]:
    """The Starlette endpoint for ``fn``: auth, body limits, Idempotency-Key, then the thread pool."""
    from starlette.concurrency import run_in_threadpool

    async def run(request: Any) -> Any:
        refused = _refusal(app, request)
        if refused is not None:
            return refused
        body = await request.body()
        if len(body) > app.max_body_bytes:
            return _error(413, "body_too_large", f"request bodies are limited to {app.max_body_bytes} bytes")
        idem = request.headers.get("idempotency-key")
        key = None
        if idem and replayed and request.method not in ("GET", "HEAD"):
            key = (request.method, request.url.path, idem[:200])
        if fn in _ASYNC_ROUTES:
            return await _handle_async(app, fn, request, body, key)
        return await run_in_threadpool(_handle, app, fn, request, body, key)

    return run


def create_app(store: Store, token: str, *, max_ttl_ms: int = MAX_TTL_MS, max_body_bytes: int = MAX_BODY_BYTES) -> Any:
    """The Starlette app serving ``store`` to clients that present ``token``."""
    try:
        from starlette.applications import Starlette
        from starlette.routing import Route
    except ImportError as exc:
        raise MissingExtra("the journal service needs Starlette and uvicorn: pip install 'caravanserai[http]'",
                           extra="http") from exc
    if not token or not isinstance(token, str) or not token.strip():
        raise HttpTokenRequired(f"the journal service needs a token: pass one or set {TOKEN_ENV}")
    service = JournalService(store, max_ttl_ms=max_ttl_ms)
    app = _App(store, service, Replay(), token.strip().encode("utf-8", "surrogateescape"), max_body_bytes)

    @contextlib.asynccontextmanager
    async def lifespan(_: Any):
        yield
        service.close()

    routes = [Route(path, _endpoint(app, fn, replayed), methods=list(methods)) for path, fn, methods, replayed in _ROUTES]
    routes.append(Route("/health", _health, methods=["GET"]))
    starlette = Starlette(routes=routes, lifespan=lifespan)
    starlette.state.service = service
    return starlette


def serve(store_url: str, host: str = "127.0.0.1", port: int = 8765, token: str | None = None, *,
          ssl_certfile: str | None = None, ssl_keyfile: str | None = None, log_level: str = "warning",
          max_ttl_ms: int = MAX_TTL_MS) -> None:
    """Run the journal service for ``store_url`` under uvicorn until SIGINT/SIGTERM; the token comes from
    ``token`` or ``$CARAVANSERAI_HTTP_TOKEN``, without which it refuses to start (``HttpTokenRequired``)."""
    from caravanserai.stores import open_store  # absolute: this module is also imported as caravanserai.service

    token = token or os.environ.get(TOKEN_ENV)
    if not token or not token.strip():
        raise HttpTokenRequired(f"the journal service needs a token: pass --token or set {TOKEN_ENV}")
    try:
        import uvicorn
    except ImportError as exc:
        raise MissingExtra("the journal service needs Starlette and uvicorn: pip install 'caravanserai[http]'",
                           extra="http") from exc
    store = open_store(store_url)
    try:
        app = create_app(store, token, max_ttl_ms=max_ttl_ms)
        tls = bool(ssl_certfile)
        where = f"{'https' if tls else 'http'}://{f'[{host}]' if ':' in host else host}:{port}"
        print(f"caravanserai: journal service on {where} backed by {store.url} (health: {where}/health)",
              file=sys.stderr, flush=True)
        if not tls and not is_loopback(host):
            print(f"caravanserai: warning: serving plain http on {host}; clients refuse http:// outside localhost, "
                  "so put TLS in front (a proxy, or --ssl-certfile/--ssl-keyfile)", file=sys.stderr, flush=True)
        uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False, ssl_certfile=ssl_certfile,
                    ssl_keyfile=ssl_keyfile, timeout_graceful_shutdown=5)
    finally:
        store.close()
