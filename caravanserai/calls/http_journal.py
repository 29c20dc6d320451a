"""The journal at the HTTP transport: every model request made inside a run, by any SDK or framework.

When a run opens, ``install()`` patches ``HTTPTransport.handle_request`` and
``AsyncHTTPTransport.handle_async_request`` of httpx and httpx2 (whichever are installed), once per
process. That reaches the clients frameworks build privately (LangChain's, litellm's, CrewAI's)
and transport subclasses. Outside a run, and for requests that are not model calls
(``http_record.Rules.journaled``; caravanserai's own HTTP store included), the patch only passes
the request on. Inside a run a model request is:

- **keyed** (``http_record.request_key``) and, if the run's journal holds a settled call with the
  same key in its replay window, answered from the journal: the recorded bytes go back to the SDK,
  which parses them itself (an SSE stream one event per chunk), so the caller gets its own types;
- otherwise budget-checked (``max_tokens`` / ``max_completion_tokens`` / ``max_output_tokens``),
  its intent appended durably (``call_started``), sent, and its answer recorded: a JSON body is
  read and settled (``call_settled``) before the SDK sees it; a stream passes through chunk by
  chunk as it arrives and settles when its final event arrives, before the consumer sees the end;
  a non-2xx status is journaled as ``call_failed`` (an SDK's retry loop carries on).

Opt out for a process with ``CARAVANSERAI_HTTP_JOURNAL=off`` or ``configure(enabled=False)``, for a
run with ``durable(..., http_journal=False)``, for a block with ``with paused():``.
"""

from __future__ import annotations

import contextvars
import importlib.abc
import os
import sys
import threading
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import nullcontext
from typing import Any

from ..errors import UsageError
from . import http_record
from .http_record import NotJournalable, Rules, SseSplitter, rules
from .journaled import Journal, fail_call, failed_call, settle_call, start_call
from .models import Usage
from .scope import PAUSED, RUN, paused

__all__ = ["UnjournaledCallWarning", "bind", "configure", "install", "paused", "rules", "unbind", "wrap_transport"]

_INSTALL_LOCK = threading.Lock()
_PATCHED: dict[str, Any] = {}  # module name -> the module, once its transports are patched
_LOOKED_FOR: set[str] = set()  # modules install() has looked for (found or not): looked for once


class UnjournaledCallWarning(UserWarning):
    """A model request inside a run went out unjournaled (named once per run; a resume pays it again)."""


def configure(*, enabled: bool | None = None, endpoints: tuple[str, ...] | list[str] | None = None,
              identity_fields: tuple[str, ...] | list[str] | None = None,
              meaning_headers: tuple[str, ...] | list[str] | None = None) -> Rules:
    """Change what the transport journal treats as a model request, for this process.

    ``endpoints``: URL path endings journaled (default ``ENDPOINTS``); ``identity_fields``: top-level
    body fields left out of the key (default ``metadata``, ``user``, ``safety_identifier``,
    ``prompt_cache_key``); ``meaning_headers``: headers kept in the key. Returns the rules now in force.
    """
    for name, value in (("endpoints", endpoints), ("identity_fields", identity_fields),
                        ("meaning_headers", meaning_headers)):
        if value is not None and (isinstance(value, str) or not all(isinstance(v, str) and v for v in value)):
            raise UsageError(f"http_journal.configure({name}=...) takes a list of non-empty strings, got {value!r}")
    if endpoints is not None and not all(e.startswith("/") for e in endpoints):
        raise UsageError(f"http_journal.configure(endpoints=...) takes URL path endings starting with '/', got {endpoints!r}")
    if enabled is not None:
        rules.enabled = bool(enabled)
    if endpoints is not None:
        rules.endpoints = tuple(endpoints)
    if identity_fields is not None:
        rules.identity_fields = tuple(identity_fields)
    if meaning_headers is not None:
        rules.meaning_headers = tuple(h.lower() for h in meaning_headers)
    return rules


_OPEN: dict[int, list] = {}  # id(run) -> [run, how many contexts bind it]: the runs open in this process


def bind(run: Journal) -> contextvars.Token:
    """Make ``run`` the journal of model requests in this context (the run lifecycle calls this)."""
    install()
    with _INSTALL_LOCK:
        _OPEN.setdefault(id(run), [run, 0])[1] += 1
    return RUN.set(run)


def unbind(token: contextvars.Token) -> None:
    run = RUN.get()
    RUN.reset(token)
    with _INSTALL_LOCK:
        entry = _OPEN.get(id(run))
        if entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                del _OPEN[id(run)]


def _active() -> Journal | None:
    """The run this request belongs to: the context's, else (a thread that did not copy the context,
    e.g. a ThreadPoolExecutor inside ``durable()``) the only run open in the process."""
    run = RUN.get()
    if run is None and len(_OPEN) == 1:
        run = next(iter(_OPEN.values()))[0]
    if run is None or PAUSED.get() or not rules.enabled or not getattr(run, "http_journal", True):
        return None
    return run


def install() -> list[str]:
    """Patch the transports of httpx and httpx2, once; returns the modules patched so far.

    One already imported is patched now; one not yet imported is patched right after its import
    (``_PatchOnImport``), so opening a run never imports an HTTP library the program does not use
    (httpx and httpx2 cost ~300 ms to import: most of a resume's time, before)."""
    if os.environ.get("CARAVANSERAI_HTTP_JOURNAL", "").strip().lower() in ("0", "off", "false", "no"):
        rules.enabled = False
    if len(_LOOKED_FOR) == 2:
        return sorted(_PATCHED)
    with _INSTALL_LOCK:
        for name in ("httpx", "httpx2"):
            if name in _LOOKED_FOR:
                continue
            module = sys.modules.get(name)
            if module is not None:
                _patched(name, module)
            elif not any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
                sys.meta_path.insert(0, _PatchOnImport())
            _LOOKED_FOR.add(name)
    return sorted(_PATCHED)


def _patched(name: str, module: Any) -> None:
    if name not in _PATCHED:
        _patch(module)
        _PATCHED[name] = module


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches httpx / httpx2 as soon as the program imports them (a post-import hook): finds the
    module with the other finders and runs ``_patch`` after its loader has executed it."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in ("httpx", "httpx2") or fullname in _PATCHED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run_module = loader.exec_module

        def exec_module(module: Any) -> None:
            run_module(module)
            with _INSTALL_LOCK:
                _patched(fullname, module)

        loader.exec_module = exec_module  # type: ignore[method-assign]  # this spec's own loader instance
        return spec


def _patch(module: Any) -> None:
    sync_send = module.HTTPTransport.handle_request
    async_send = module.AsyncHTTPTransport.handle_async_request

    def handle_request(self: Any, request: Any) -> Any:
        return journal_sync(module, request, lambda: sync_send(self, request))

    async def handle_async_request(self: Any, request: Any) -> Any:
        return await journal_async(module, request, lambda: async_send(self, request))

    handle_request.__wrapped__ = sync_send  # type: ignore[attr-defined]
    handle_async_request.__wrapped__ = async_send  # type: ignore[attr-defined]
    module.HTTPTransport.handle_request = handle_request
    module.AsyncHTTPTransport.handle_async_request = handle_async_request


def wrap_transport(transport: Any, module: Any) -> Any:
    """A transport that journals around ``transport`` (for a client whose transport is not httpx's own)."""
    if isinstance(transport, module.AsyncBaseTransport):
        class AsyncJournaling(module.AsyncBaseTransport):
            async def handle_async_request(self, request: Any) -> Any:
                return await journal_async(module, request, lambda: transport.handle_async_request(request))

            async def aclose(self) -> None:
                await transport.aclose()
        return AsyncJournaling()

    class Journaling(module.BaseTransport):
        def handle_request(self, request: Any) -> Any:
            return journal_sync(module, request, lambda: transport.handle_request(request))

        def close(self) -> None:
            transport.close()
    return Journaling()


# ---- one request ----------------------------------------------------------------------------------


class _Call:
    """One journaled model request: its key, then its intent, its answer and how it ended."""

    def __init__(self, run: Journal, request: Any, body: bytes) -> None:
        self.run = run
        self.path = request.url.path
        self.method = request.method
        self.keyed, self.body = http_record.request_key(self.method, self.path, body, request.headers)
        self.prompt_estimate = http_record.prompt_estimate(body)
        self.model = str(self.body.get("model") or "")
        self.pending: dict | None = None
        self.splitter = SseSplitter()
        self.events: list[bytes] = []
        self.status = 0
        self.headers: dict[str, str] = {}
        self.ended = False
        self.finished = False  # a chat chunk said finish_reason: whole even if [DONE] never comes
        self.decoders: list[Any] = []

    def begin(self) -> dict | None:
        """The recorded answer to replay, or None once the intent is durable (the request may go out)."""
        with getattr(self.run, "lock", nullcontext()):
            replayed, self.pending = start_call(
                self.run, path=f"{self.method} {self.path}", kind="model", provider=http_record.provider_of(self.path),
                model=self.model, request=self.keyed, prompt_estimate=self.prompt_estimate,
                max_tokens=http_record.max_output_tokens(self.body))
        return replayed

    def answered(self, response: Any, module: Any) -> bool:
        """Note the status and headers; True when the answer is an SSE stream to record as it passes."""
        self.status = response.status_code
        self.headers = {k.lower(): v for k, v in response.headers.items()}
        streamed = 200 <= self.status < 300 and self.headers.get("content-type", "").startswith("text/event-stream")
        encodings = [e.strip() for e in self.headers.get("content-encoding", "").lower().split(",") if e.strip()]
        encodings = [e for e in encodings if e != "identity"]
        decoders = getattr(getattr(module, "_decoders", None), "SUPPORTED_DECODERS", {})
        if streamed and any(e not in decoders for e in encodings):  # bytes we could not read back: not journaled
            self.ended = True
            _unjournaled(self.run, f"{self.method} {self.path}", f"its stream is encoded as {', '.join(encodings)}")
            return False
        self.decoders = [decoders[e]() for e in reversed(encodings)]  # undone in the reverse order of applying
        return streamed

    def settle_body(self, body: bytes) -> None:
        """Journal a whole answer before the SDK sees it; a failure to journal it is named, not raised
        (an SDK would take the error for a network fault and pay for the call again)."""
        try:
            if not 200 <= self.status < 300:
                self.fail_status(body)
            else:
                self._settle(*http_record.record(self.status, self.headers, body=body))
        except Exception as exc:
            _unjournaled(self.run, f"{self.method} {self.path}", f"its answer could not be journaled ({exc})")

    def feed(self, chunk: bytes) -> None:
        """A stream chunk as it passes: settle before the chunk holding the final event is handed on."""
        if self.ended:
            return
        for decoder in self.decoders:
            chunk = _joined(decoder.decode(chunk))
        for event in self.splitter.feed(chunk):
            self.events.append(event)
            self.finished = self.finished or http_record.says_finished(event)
            end = http_record.stream_end(event)
            if end == "done":
                self._settle_stream()
                return
            if end == "error":  # the stream itself says the call failed (an `error` event in a 200 stream)
                self.fail_status(event, code="stream_error")
                return

    def finish(self) -> None:
        """The stream ended without its final event: settled if a chunk said the answer was finished,
        else left unsettled like a stream cut midway (sent again on resume)."""
        if self.ended:
            return
        for decoder in self.decoders:
            self.events.extend(self.splitter.feed(_joined(decoder.flush())))
        rest = self.splitter.rest()
        if rest:
            self.events.append(rest)
        self.finished = self.finished or any(http_record.says_finished(e) for e in self.events[-2:])
        if self.finished:
            self._settle_stream()
        else:
            self.ended = True

    def _settle_stream(self) -> None:
        """Settle a stream as it passes: a failure to journal it (the run closed, the store down) is named,
        never raised into the consumer, which holds an answer already paid for."""
        try:
            self._settle(*http_record.record(self.status, self.headers, events=self.events))
        except Exception as exc:
            _unjournaled(self.run, f"{self.method} {self.path}", f"its answer could not be journaled ({exc})")

    def _settle(self, stored: dict, usage: Usage) -> None:
        self.ended = True
        assert self.pending is not None
        with getattr(self.run, "lock", nullcontext()):
            settle_call(self.run, self.pending, stored, usage)

    def fail_status(self, body: bytes, code: str | None = None) -> None:
        self.ended = True
        assert self.pending is not None
        failed_call(self.run, self.pending, {"code": code or f"http_{self.status}",
                                             "message": body[:500].decode("utf-8", "replace")})

    def fail(self, exc: BaseException, module: Any) -> None:
        """The request failed. Journaled as failed (nothing spent) only when it never reached the server;
        a timeout, a cancellation or a cut connection may have been billed: left unsettled (counted in
        ``possible_double_count_calls`` on resume)."""
        if self.ended or self.pending is None:
            return
        self.ended = True
        if isinstance(exc, (module.ConnectError, module.ConnectTimeout)):
            fail_call(self.run, self.pending, exc)


def _joined(data: Any) -> bytes:
    """A decoder's output as bytes (httpx's decoders return bytes, httpx2's an iterator of them)."""
    return data if isinstance(data, bytes) else b"".join(data)


def _model_request(run: Journal, request: Any) -> bool:
    """Whether the transport journal takes ``request`` (a model request; one that looks like a
    model call but is not on the endpoint list is named once). Decided before the body is read."""
    method, path = request.method, request.url.path
    if rules.journaled(method, path):
        return True
    if http_record.looks_like_model_call(method, path):
        _unjournaled(run, f"{method} {path}", "its path is not in the journaled endpoint list "
                     "(caravanserai.http_journal.configure(endpoints=...) adds it)")
    return False


def _keyed(run: Journal, request: Any, body: bytes) -> _Call | None:
    """The call to journal, or None for a body the journal cannot key (named once)."""
    try:
        return _Call(run, request, body)
    except NotJournalable as exc:
        _unjournaled(run, f"{request.method} {request.url.path}", str(exc))
        return None


def _unjournaled(run: Journal, what: str, why: str) -> None:
    """Name, once per run, a model request that went out unjournaled (it is paid again on resume)."""
    ledger = run.ledger
    seen = getattr(ledger, "unjournaled", None)
    if seen is None or what in seen:
        return
    seen.append(what)
    warnings.warn(f"run {run.run_id!r}: the model request {what} was sent unjournaled: {why}; "
                  "a resume will send and pay for it again", UnjournaledCallWarning, stacklevel=4)


def _replayed_response(module: Any, request: Any, stored: dict, is_async: bool) -> Any:
    chunks = http_record.replay_chunks(stored)
    status, headers = http_record.replay_status_and_headers(stored)
    stream = _streams(module)[1 if is_async else 0](chunks)
    return module.Response(status, headers=headers, stream=stream, request=request)


def journal_sync(module: Any, request: Any, send: Callable[[], Any]) -> Any:
    """Send ``request`` through the run's journal (outside a run, or not a model request: just send it)."""
    run = _active()
    call = _keyed(run, request, request.read()) if run is not None and _model_request(run, request) else None
    if call is None:
        return send()
    stored = call.begin()
    if stored is not None:
        return _replayed_response(module, request, stored, is_async=False)
    try:
        response = send()
        if call.answered(response, module):
            response.stream = _streams(module)[2](response.stream, call)
            return response
        body = response.read()
    except BaseException as exc:
        call.fail(exc, module)
        raise
    call.settle_body(body)
    return response  # read (and decoded) already: the SDK gets its content as it would have


async def journal_async(module: Any, request: Any, send: Callable[[], Awaitable[Any]]) -> Any:
    run = _active()
    call = _keyed(run, request, await request.aread()) if run is not None and _model_request(run, request) else None
    if call is None:
        return await send()
    stored = call.begin()
    if stored is not None:
        return _replayed_response(module, request, stored, is_async=True)
    try:
        response = await send()
        if call.answered(response, module):
            response.stream = _streams(module)[3](response.stream, call)
            return response
        body = await response.aread()
    except BaseException as exc:
        call.fail(exc, module)
        raise
    call.settle_body(body)
    return response  # read (and decoded) already: the SDK gets its content as it would have


_STREAMS: dict[str, tuple[Any, Any, Any, Any]] = {}


def _streams(module: Any) -> tuple[Any, Any, Any, Any]:
    """(replay sync, replay async, recording sync, recording async) byte streams of ``module``'s types."""
    made = _STREAMS.get(module.__name__)
    if made is not None:
        return made

    class Replay(module.SyncByteStream):
        def __init__(self, chunks: list[bytes]) -> None:
            self.chunks = chunks

        def __iter__(self) -> Iterator[bytes]:
            yield from self.chunks

    class AsyncReplay(module.AsyncByteStream):
        def __init__(self, chunks: list[bytes]) -> None:
            self.chunks = chunks

        async def __aiter__(self) -> AsyncIterator[bytes]:
            for chunk in self.chunks:
                yield chunk

    class Recording(module.SyncByteStream):
        def __init__(self, inner: Any, call: _Call) -> None:
            self.inner, self.call = inner, call

        def __iter__(self) -> Iterator[bytes]:
            for chunk in self.inner:  # an error or an abandoned stream leaves the call unsettled: sent again
                self.call.feed(chunk)
                yield chunk
            self.call.finish()

        def close(self) -> None:
            self.inner.close()  # abandoned midway: the call stays unsettled, sent again on resume

    class AsyncRecording(module.AsyncByteStream):
        def __init__(self, inner: Any, call: _Call) -> None:
            self.inner, self.call = inner, call

        async def __aiter__(self) -> AsyncIterator[bytes]:
            async for chunk in self.inner:
                self.call.feed(chunk)
                yield chunk
            self.call.finish()

        async def aclose(self) -> None:
            await self.inner.aclose()

    made = _STREAMS[module.__name__] = (Replay, AsyncReplay, Recording, AsyncRecording)
    return made
