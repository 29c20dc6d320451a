"""What the HTTP transport journal keys, records and meters: pure functions over bytes, no httpx.

A model request is journaled when it is a ``POST`` to one of ``ENDPOINTS`` (matched on the end of
the URL path, so ``/v1/chat/completions`` on any OpenAI-compatible server counts). Its **key** is
the SHA-256 of the method, the path, the request's JSON body with identity-only fields left out,
and the few headers that change meaning; host, port, auth and SDK telemetry headers are not part
of it, so the same request to a server on a new port still replays. Its **record** is the status,
content type, request id and the full response bytes (a stream as its SSE events, one string
each), from which usage and inferred USD are read for the chat, Responses and Anthropic formats.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .models import Usage

__all__ = ["ENDPOINTS", "IDENTITY_FIELDS", "MEANING_HEADERS", "Rules", "SseSplitter", "decode_body", "looks_like_model_call",
           "record", "replay_chunks", "request_key", "rules", "usage_of"]

ENDPOINTS = ("/chat/completions", "/completions", "/responses", "/embeddings", "/messages")
IDENTITY_FIELDS = ("metadata", "user", "safety_identifier", "prompt_cache_key")
MEANING_HEADERS = ("anthropic-version", "anthropic-beta", "openai-beta")
REPLAY_HEADERS = ("content-type", "x-request-id", "request-id")
# a POST whose path holds one of these words is probably a model call we were not told about
_MODEL_WORDS = ("completion", "generate", "chat", "messages", "responses", "embed", "predict", "infer", "invoke")
_FREE_ENDPOINTS = ("/count_tokens", "/input_tokens", "/models")
_TERMINAL_EVENTS = ("response.completed", "response.incomplete", "message_stop")
_ERROR_EVENTS = ("error", "response.failed")


@dataclass
class Rules:
    """What the journal treats as a model request and leaves out of its key (``caravanserai.http_journal.configure``)."""

    endpoints: tuple[str, ...] = ENDPOINTS
    identity_fields: tuple[str, ...] = IDENTITY_FIELDS
    meaning_headers: tuple[str, ...] = MEANING_HEADERS
    enabled: bool = True

    def journaled(self, method: str, path: str) -> bool:
        return method == "POST" and path.rstrip("/").endswith(self.endpoints)


rules = Rules()


def looks_like_model_call(method: str, path: str) -> bool:
    """A POST outside the endpoint list whose path reads like a model call (warned about, not journaled);
    free bookkeeping endpoints (token counting, batch status) are not."""
    lowered = path.lower().rstrip("/")
    return (method == "POST" and any(word in lowered for word in _MODEL_WORDS)
            and not lowered.endswith(_FREE_ENDPOINTS) and "/batches" not in lowered)


class NotJournalable(ValueError):
    """The request cannot be keyed (its body is not a JSON object); it is sent unjournaled and named."""


def request_key(method: str, path: str, body: bytes, headers: Mapping[str, str]) -> tuple[dict, dict]:
    """(the request as keyed, its parsed JSON body). Raises NotJournalable for a non-JSON body."""
    try:
        parsed = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError) as exc:
        raise NotJournalable(f"its body is not JSON ({exc.__class__.__name__})") from None
    if not isinstance(parsed, dict):
        raise NotJournalable("its body is not a JSON object")
    kept = {k: v for k, v in parsed.items() if k not in rules.identity_fields}
    meaning = {name: headers[name] for name in rules.meaning_headers if name in headers}
    return {"method": method, "path": path, "body": kept, "headers": meaning}, parsed


def provider_of(path: str) -> str:
    return "anthropic" if path.rstrip("/").endswith("/messages") else "openai"


def prompt_estimate(body: bytes) -> int:
    """Tokens the request may cost before any answer, for budgets: about 4 bytes of its JSON body a token
    (an overestimate by the body's keys and settings, which a budget check can afford)."""
    return len(body) // 4


def max_output_tokens(body: dict) -> int | None:
    for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


class SseSplitter:
    """Splits a decoded byte stream into complete SSE events (each with its blank-line end)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        events: list[bytes] = []
        while True:
            cut = _event_end(self._buffer)
            if cut < 0:
                return events
            events.append(self._buffer[:cut])
            self._buffer = self._buffer[cut:]

    def rest(self) -> bytes:
        return self._buffer


def _event_end(buffer: bytes) -> int:
    ends = [i + len(sep) for sep in (b"\n\n", b"\r\n\r\n", b"\r\r") if (i := buffer.find(sep)) >= 0]
    return min(ends) if ends else -1


def _fields(event: bytes) -> tuple[str, str]:
    """(event name, data) of one SSE event."""
    name, data = "", []
    for line in event.decode("utf-8", "replace").splitlines():
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
    return name, "\n".join(data)


def stream_end(event: bytes) -> str | None:
    """"done" for the event that ends a stream normally, "error" for one that ends it in error, else None."""
    name, data = _fields(event)
    if data.strip() == "[DONE]" or name in _TERMINAL_EVENTS:
        return "done"
    if name in _ERROR_EVENTS:
        return "error"
    if not name and data.startswith('{"error"'):  # an OpenAI-style error in the stream
        return "error"
    if not name and data.startswith('{"type"'):  # unnamed Responses/Anthropic events: the type leads the data
        kind = _json(data).get("type")
        if kind in _TERMINAL_EVENTS:
            return "done"
        if kind in _ERROR_EVENTS:
            return "error"
    return None


def says_finished(event: bytes) -> bool:
    """A chat or completions chunk with a finish reason: the answer is whole even if ``[DONE]`` never comes."""
    return b'"finish_reason":"' in event or b'"finish_reason": "' in event


def replay_status_and_headers(stored: dict) -> tuple[int, list[tuple[str, str]]]:
    """What a replayed answer may carry, whatever the store says: a 2xx status and the replay headers only
    (a tampered record cannot turn a replay into a redirect that re-sends the prompt elsewhere)."""
    status = stored.get("status")
    status = status if isinstance(status, int) and not isinstance(status, bool) and 200 <= status < 300 else 200
    headers = stored.get("headers")
    headers = headers if isinstance(headers, dict) else {}
    return status, [(k, v) for k, v in headers.items() if k in REPLAY_HEADERS and isinstance(v, str)]


def _json(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _text(data: bytes) -> tuple[str, bool]:
    """(text, is_base64): response bytes as a journal string, byte-exact either way."""
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), True


def record(status: int, headers: Mapping[str, str], *, body: bytes | None = None,
           events: Iterable[bytes] = ()) -> tuple[dict, Usage]:
    """The journal record of a settled response (replayable bytes plus what a person reads) and its usage."""
    kept = {name: headers[name] for name in REPLAY_HEADERS if name in headers}
    out: dict[str, Any] = {"http": 1, "status": status, "content_type": headers.get("content-type", ""),
                           "request_id": headers.get("x-request-id") or headers.get("request-id") or "", "headers": kept}
    if body is None:
        chunks = list(events)
        texts = [_text(c) for c in chunks]
        if any(b64 for _, b64 in texts):
            out["events_b64"] = [base64.b64encode(c).decode("ascii") for c in chunks]
        else:
            out["events"] = [t for t, _ in texts]
        joined = b"".join(chunks)
    else:
        text, b64 = _text(body)
        out["body_b64" if b64 else "body"] = text
        joined = body
    out["sha256"] = hashlib.sha256(joined).hexdigest()
    objects = decode_body(out)  # decoded once, for the words and the usage
    said = answer_text(objects)
    if said:
        out["text"] = said[:2000]
    return out, usage_of(objects)


def replay_chunks(stored: dict) -> list[bytes]:
    """The recorded bytes, one chunk per SSE event (or one chunk for a whole body)."""
    if "events" in stored:
        return [str(e).encode("utf-8") for e in stored["events"]]
    if "events_b64" in stored:
        return [base64.b64decode(e) for e in stored["events_b64"]]
    if "body_b64" in stored:
        return [base64.b64decode(stored["body_b64"])]
    return [str(stored.get("body", "")).encode("utf-8")]


def decode_body(stored: dict) -> list[dict]:
    """The JSON objects of a record: the body, or each SSE event's data."""
    if "body" in stored or "body_b64" in stored:
        value = _json(replay_chunks(stored)[0].decode("utf-8", "replace"))
        return [value] if value else []
    out = []
    for event in replay_chunks(stored):
        _, data = _fields(event)
        value = _json(data) if data.startswith("{") else {}
        if value:
            out.append(value)
    return out


def usage_of(objects: list[dict]) -> Usage:
    """Token usage of a response's JSON objects (``decode_body``): chat/completions/embeddings, Responses,
    Anthropic; plain or streamed."""
    prompt = completion = cached = 0
    for obj in objects:
        kind = obj.get("type")
        usage = obj.get("usage")
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            usage = (obj.get("response") or {}).get("usage")
        elif kind == "message_start":
            usage = (obj.get("message") or {}).get("usage")
        if not isinstance(usage, dict):
            continue
        if "prompt_tokens" in usage:  # chat, completions, embeddings
            details = usage.get("prompt_tokens_details") or {}
            prompt = _int(usage.get("prompt_tokens"))
            completion = _int(usage.get("completion_tokens"))
            cached = _int(details.get("cached_tokens") if isinstance(details, dict) else 0)
        elif "input_tokens" in usage and ("cache_read_input_tokens" in usage or kind in ("message", "message_start")):
            read = _int(usage.get("cache_read_input_tokens"))
            prompt = _int(usage.get("input_tokens")) + read + _int(usage.get("cache_creation_input_tokens"))
            cached = read
            completion = max(completion, _int(usage.get("output_tokens")))
        elif "input_tokens" in usage:  # Responses
            details = usage.get("input_tokens_details") or {}
            prompt = _int(usage.get("input_tokens"))
            completion = _int(usage.get("output_tokens"))
            cached = _int(details.get("cached_tokens") if isinstance(details, dict) else 0)
        elif "output_tokens" in usage:  # Anthropic message_delta: the running output count
            completion = max(completion, _int(usage.get("output_tokens")))
    return Usage(prompt, completion, min(cached, prompt))


def answer_text(objects: list[dict]) -> str:
    """The model's words in a response's JSON objects (for the trail a person reads); empty for embeddings."""
    parts: list[str] = []
    for obj in objects:
        kind = obj.get("type")
        for choice in obj.get("choices") or ():
            if isinstance(choice, dict):
                message = choice.get("message") or choice.get("delta") or {}
                content = message.get("content") if isinstance(message, dict) else None
                parts.append(content if isinstance(content, str) else str(choice.get("text") or ""))
        if kind == "response.output_text.delta" or kind == "content_block_delta":
            delta = obj.get("delta")
            parts.append(delta if isinstance(delta, str) else str((delta or {}).get("text") or ""))
        elif obj.get("object") == "response":
            for item in obj.get("output") or ():
                for piece in (item or {}).get("content") or ():
                    parts.append(str((piece or {}).get("text") or ""))
        elif kind == "message":
            parts.extend(str((block or {}).get("text") or "") for block in obj.get("content") or ())
    return "".join(parts)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
