"""A real, deterministic "counting" model API server for tests: OpenAI and Anthropic formats, stdlib only.

Every answer is a pure function of the request's content (SHA-256 of its canonical JSON picks the words;
the last user message's first words are echoed), so an uninterrupted run and a killed-and-resumed run get
identical answers. It counts and records every model request, can fail the next N with a given status,
and sleeps ``stream_delay`` seconds between SSE events so a test can kill a client mid-stream.

    from servers.model_api import start
    with start() as api:                    # api.url = "http://127.0.0.1:PORT" (no /v1)
        openai.OpenAI(base_url=api.url + "/v1", api_key="x"); anthropic.Anthropic(base_url=api.url, api_key="x")
        api.count("/v1/chat/completions"); api.fail_next(429); api.stream_delay = 0.2

    python tests/servers/model_api.py [--port N] [--stream-delay S]    # prints "URL http://127.0.0.1:PORT"
    GET /_stats, POST /_reset, POST /_config {"stream_delay": 0.2, "fail_next": {"status": 429, "times": 1}}
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import http.client
import json
import re
import socket
import struct
import threading
import time
import urllib.parse
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CREATED = 1_700_000_000  # fixed timestamps: answers must not depend on time
MODEL = "counting-model"
WORDS = ("amber basalt cedar delta ember fjord granite harbor indigo juniper kestrel lantern meadow nectar "
         "orchard pebble quartz river saffron timber umber velvet willow xenon yarrow zephyr anchor beacon "
         "canyon dune estuary falcon glacier heron island jasper kelp lagoon marble nimbus oasis prairie "
         "quiver reef summit tundra upland valley wharf yonder zenith alder birch cobalt dahlia egret flint "
         "garnet hollow ivory jade").split()
OPENAI_ERRORS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error"}
ANTHROPIC_ERRORS = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
                    403: "permission_error", 404: "not_found_error", 429: "rate_limit_error", 504: "timeout_error",
                    529: "overloaded_error"}
CONTENT_KEYS = ("model", "messages", "input", "prompt", "system", "instructions", "tools", "response_format", "text",
                "output_config", "output_format")


# ---- deterministic content -------------------------------------------------------------------------------------------

def canonical(body: dict) -> str:
    """The request content the answer depends on (transport knobs like stream / stream_options left out)."""
    return json.dumps({k: body[k] for k in CONTENT_KEYS if k in body}, sort_keys=True, separators=(",", ":"))


def _num(seed: str, salt: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}|{salt}".encode()).digest()[:4], "big")


def _text_of(content: Any) -> str:
    """Text of a message's content: a string, or the text parts of a list of parts/blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") in
                        ("text", "input_text"))
    return ""


def last_user_text(body: dict) -> str | None:
    """Text of the last message if it is a user message (None otherwise, e.g. a tool result)."""
    items = body.get("messages", body.get("input", body.get("prompt")))
    if isinstance(items, str):
        return items
    if isinstance(items, list) and items and isinstance(items[-1], str):
        return items[-1]
    if not isinstance(items, list) or not items or not isinstance(items[-1], dict):
        return None
    last = items[-1]
    return _text_of(last.get("content")) if last.get("role") == "user" else None


def answer_text(body: dict, seed: str) -> str:
    echo = (last_user_text(body) or "").split()[:3]
    picked = [WORDS[_num(seed, f"w{i}") % len(WORDS)] for i in range(6 + _num(seed, "n") % 7)]
    return " ".join(echo + picked)


def sample(schema: dict, seed: str, root: dict | None = None, path: str = "", depth: int = 0) -> Any:
    """A deterministic value that validates against a (simple) JSON schema."""
    root = root if root is not None else schema
    if "$ref" in schema:
        target: Any = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            target = target[part]
        return sample(target, seed, root, path, depth + 1)
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            options = [s for s in schema[key] if s.get("type") != "null"] or schema[key]
            return sample(options[0], seed, root, path, depth + 1)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if depth > 8 or kind == "null":
        return None
    if kind == "object":
        props = schema.get("properties", {})
        names = schema.get("required", list(props))
        return {n: sample(props.get(n, {}), seed, root, f"{path}.{n}", depth + 1) for n in names}
    if kind == "array":
        return [sample(schema.get("items", {}), seed, root, f"{path}[{i}]", depth + 1)
                for i in range(schema.get("minItems", 0))]
    if kind == "integer":
        return 1 + _num(seed, path) % 9
    if kind == "number":
        return 1 + _num(seed, path) % 9 + 0.5
    if kind == "boolean":
        return True
    return WORDS[_num(seed, path) % len(WORDS)]


def json_schema_of(body: dict) -> dict | None:
    """The JSON schema the answer must follow: chat response_format, Responses text.format, Anthropic output_config."""
    fmt = body.get("response_format") or (body.get("text") or {}).get("format") \
        or (body.get("output_config") or {}).get("format") or body.get("output_format") or {}
    if fmt.get("type") == "json_object":
        return {"type": "object", "properties": {"answer": {"type": "string"}}}
    if fmt.get("type") == "json_schema":
        return (fmt.get("json_schema") or {}).get("schema", fmt.get("schema")) or {"type": "object"}
    return None


def first_tool(body: dict) -> tuple[str, dict] | None:
    """(name, parameters schema) of the first function tool, when the last user message says CALL_TOOL."""
    if "CALL_TOOL" not in (last_user_text(body) or ""):
        return None
    for tool in body.get("tools") or []:
        if "function" in tool:                                   # chat
            return tool["function"]["name"], tool["function"].get("parameters") or {}
        if tool.get("type") == "function":                       # Responses
            return tool["name"], tool.get("parameters") or {}
        if "input_schema" in tool:                               # Anthropic
            return tool["name"], tool["input_schema"]
    return None


def pieces(text: str) -> list[str]:
    """The stream deltas: one word each, with its leading whitespace (they join back to ``text``)."""
    return re.findall(r"\s*\S+", text) or [text]


class Answer:
    """What the "model" says to one request: text or a tool call, and its usage."""

    def __init__(self, body: dict) -> None:
        content = canonical(body)
        self.seed = hashlib.sha256(content.encode()).hexdigest()
        self.model = body.get("model") or MODEL
        self.tool = first_tool(body)
        self.arguments = ""
        schema = json_schema_of(body)
        if self.tool:
            self.arguments = json.dumps(sample(self.tool[1], self.seed) if self.tool[1].get("properties") else {})
            self.text = ""
        elif schema is not None:
            self.text = json.dumps(sample(schema, self.seed))
        else:
            self.text = answer_text(body, self.seed)
        self.deltas = pieces(self.arguments or self.text)
        self.input_tokens = max(1, len(content) // 4)
        self.output_tokens = len(self.deltas)

    def id(self, prefix: str) -> str:
        return prefix + self.seed[:24]


# ---- OpenAI chat / completions ---------------------------------------------------------------------------------------

def _usage(a: Answer) -> dict:
    return {"prompt_tokens": a.input_tokens, "completion_tokens": a.output_tokens,
            "total_tokens": a.input_tokens + a.output_tokens}


def chat(body: dict, a: Answer) -> tuple[dict, list[tuple[str | None, Any]]]:
    """(plain body, stream events) for /v1/chat/completions."""
    base = {"id": a.id("chatcmpl-"), "object": "chat.completion", "created": CREATED, "model": a.model,
            "system_fingerprint": "fp_counting"}
    tool_name = a.tool[0] if a.tool else ""
    call = {"id": a.id("call_"), "type": "function", "function": {"name": tool_name, "arguments": a.arguments}} \
        if a.tool else None
    finish = "tool_calls" if call else "stop"
    message: dict[str, Any] = {"role": "assistant", "content": None if call else a.text, "refusal": None, "annotations": []}
    if call:
        message["tool_calls"] = [call]
    plain = {**base, "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
             "usage": _usage(a)}
    with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    chunk = {**base, "object": "chat.completion.chunk"}

    def event(delta: dict, finish_reason: str | None = None) -> tuple[None, dict]:
        extra = {"usage": None} if with_usage else {}
        return None, {**chunk, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                             "finish_reason": finish_reason}], **extra}

    if call:
        head = {**call, "index": 0, "function": {"name": tool_name, "arguments": ""}}
        events = [event({"role": "assistant", "content": None, "tool_calls": [head], "refusal": None})]
        events += [event({"tool_calls": [{"index": 0, "function": {"arguments": d}}]}) for d in a.deltas]
    else:
        events = [event({"role": "assistant", "content": "", "refusal": None})]
        events += [event({"content": d}) for d in a.deltas]
    events.append(event({}, finish))
    if with_usage:
        events.append((None, {**chunk, "choices": [], "usage": _usage(a)}))
    return plain, [*events, (None, "[DONE]")]


def completions(body: dict, a: Answer) -> tuple[dict, list[tuple[str | None, Any]]]:
    """(plain body, stream events) for /v1/completions."""
    base = {"id": a.id("cmpl-"), "object": "text_completion", "created": CREATED, "model": a.model,
            "system_fingerprint": "fp_counting"}

    def choice(text: str, finish: str | None) -> dict:
        return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}

    plain = {**base, "choices": [choice(a.text, "stop")], "usage": _usage(a)}
    with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    extra = {"usage": None} if with_usage else {}
    events: list[tuple[str | None, Any]] = [(None, {**base, "choices": [choice(d, None)], **extra}) for d in a.deltas]
    events.append((None, {**base, "choices": [choice("", "stop")], **extra}))
    if with_usage:
        events.append((None, {**base, "choices": [], "usage": _usage(a)}))
    return plain, [*events, (None, "[DONE]")]


def embeddings(body: dict) -> dict:
    """/v1/embeddings: one vector per input, each a function of (model, input); base64 when asked (the SDK asks)."""
    inputs = body.get("input", "")
    inputs = [inputs] if isinstance(inputs, str) or (isinstance(inputs, list) and inputs and
                                                     isinstance(inputs[0], int)) else inputs
    dims = int(body.get("dimensions") or 8)
    data, tokens = [], 0
    for i, item in enumerate(inputs):
        seed = hashlib.sha256(json.dumps([body.get("model"), item], sort_keys=True).encode()).hexdigest()
        vector = [(_num(seed, str(d)) % 256 - 128) / 128 for d in range(dims)]  # exact in float32
        tokens += max(1, len(json.dumps(item)) // 4)
        if body.get("encoding_format") == "base64":
            vector = base64.b64encode(struct.pack(f"<{dims}f", *vector)).decode()  # type: ignore[assignment]
        data.append({"object": "embedding", "index": i, "embedding": vector})
    return {"object": "list", "data": data, "model": body.get("model") or MODEL,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


# ---- OpenAI Responses ------------------------------------------------------------------------------------------------

def responses(body: dict, a: Answer) -> tuple[dict, list[tuple[str | None, Any]]]:
    """(plain body, stream events) for /v1/responses: the full event sequence, each with its sequence_number."""
    tools = [{"type": "function", "name": t["name"], "description": t.get("description"),
              "parameters": t.get("parameters"), "strict": t.get("strict", True)}
             for t in body.get("tools") or [] if t.get("type") == "function"]
    usage = {"input_tokens": a.input_tokens, "output_tokens": a.output_tokens,
             "total_tokens": a.input_tokens + a.output_tokens,
             "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
             "output_tokens_details": {"reasoning_tokens": 0}}
    response = {"id": a.id("resp_"), "object": "response", "created_at": CREATED, "status": "completed",
                "background": False, "completed_at": CREATED, "error": None, "incomplete_details": None,
                "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
                "model": a.model, "output": [], "parallel_tool_calls": True, "previous_response_id": None,
                "reasoning": {"effort": None, "summary": None}, "service_tier": "default", "temperature": 1.0,
                "text": body.get("text") or {"format": {"type": "text"}}, "tool_choice": body.get("tool_choice", "auto"),
                "tools": tools, "top_p": 1.0, "truncation": "disabled", "usage": usage, "user": None, "metadata": {}}
    if a.tool:
        item_id = a.id("fc_")
        done_item: dict[str, Any] = {"id": item_id, "type": "function_call", "status": "completed", "arguments": a.arguments,
                     "call_id": a.id("call_"), "name": a.tool[0]}
        middle: list[tuple[str, dict]] = [
            ("response.output_item.added", {"output_index": 0, "item": {**done_item, "status": "in_progress",
                                                                        "arguments": ""}}),
            *[("response.function_call_arguments.delta", {"item_id": item_id, "output_index": 0, "delta": d})
              for d in a.deltas],
            ("response.function_call_arguments.done", {"item_id": item_id, "output_index": 0, "arguments": a.arguments}),
        ]
    else:
        item_id = a.id("msg_")
        part = {"type": "output_text", "text": a.text, "annotations": [], "logprobs": []}
        done_item = {"id": item_id, "type": "message", "status": "completed", "role": "assistant", "content": [part]}
        at = {"item_id": item_id, "output_index": 0, "content_index": 0}
        middle = [
            ("response.output_item.added", {"output_index": 0, "item": {**done_item, "status": "in_progress",
                                                                        "content": []}}),
            ("response.content_part.added", {**at, "part": {**part, "text": ""}}),
            *[("response.output_text.delta", {**at, "delta": d, "logprobs": []}) for d in a.deltas],
            ("response.output_text.done", {**at, "text": a.text, "logprobs": []}),
            ("response.content_part.done", {**at, "part": part}),
        ]
    plain = {**response, "output": [done_item]}
    pending = {**response, "status": "in_progress", "completed_at": None, "usage": None}
    events = [("response.created", {"response": pending}), ("response.in_progress", {"response": pending}), *middle,
              ("response.output_item.done", {"output_index": 0, "item": done_item}),
              ("response.completed", {"response": plain})]
    return plain, [(name, {"type": name, "sequence_number": n, **data}) for n, (name, data) in enumerate(events)]


# ---- Anthropic Messages ----------------------------------------------------------------------------------------------

def messages(body: dict, a: Answer) -> tuple[dict, list[tuple[str | None, Any]]]:
    """(plain body, stream events) for /v1/messages."""
    usage = {"input_tokens": a.input_tokens, "output_tokens": a.output_tokens,
             "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    if a.tool:
        block = {"type": "tool_use", "id": a.id("toolu_"), "name": a.tool[0], "input": json.loads(a.arguments)}
        start_block, delta = {**block, "input": {}}, "input_json_delta"
    else:
        block = {"type": "text", "text": a.text}
        start_block, delta = {**block, "text": ""}, "text_delta"
    stop = "tool_use" if a.tool else "end_turn"
    message = {"id": a.id("msg_"), "type": "message", "role": "assistant", "model": a.model, "content": [block],
               "stop_reason": stop, "stop_sequence": None, "usage": usage}
    key = "partial_json" if a.tool else "text"
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"message": {**message, "content": [], "stop_reason": None,
                                             "usage": {**usage, "output_tokens": 1}}}),
              ("content_block_start", {"index": 0, "content_block": start_block}),
              ("ping", {}),
              *[("content_block_delta", {"index": 0, "delta": {"type": delta, key: d}}) for d in a.deltas],
              ("content_block_stop", {"index": 0}),
              ("message_delta", {"delta": {"stop_reason": stop, "stop_sequence": None},
                                 "usage": {"output_tokens": a.output_tokens}}),
              ("message_stop", {})]
    return message, [(name, {"type": name, **data}) for name, data in events]


def error_body(path: str, status: int, request_id: str) -> dict:
    message = f"counting model API: injected HTTP {status}"
    if path == "/v1/messages":
        kind = ANTHROPIC_ERRORS.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": message}, "request_id": request_id}
    kind = OPENAI_ERRORS.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": kind}}


MODEL_PATHS = {"/v1/chat/completions": chat, "/v1/completions": completions, "/v1/responses": responses,
               "/v1/messages": messages, "/v1/embeddings": None}


# ---- the server ------------------------------------------------------------------------------------------------------

class ModelAPI:
    """The running server: ``url``, ``count()``, ``requests``, ``reset()``, ``fail_next()``, ``stream_delay``, ``stop()``."""

    def __init__(self, port: int = 0, stream_delay: float = 0.0) -> None:
        self.stream_delay = stream_delay
        self.response_delay = 0.0  # seconds before any answer is written (a request in flight)
        self.gzip = False  # compress answers for clients that accept gzip
        self.stream_error = False  # end every stream with an `error` event after three events
        self.truncate_stream = 0  # > 0: streams end (cleanly) after that many events, without their final ones
        self.upstream = ""  # a real server's base URL: answers come from it (counted and paced here)
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        self._fail: tuple[int, int] = (0, 0)           # (status, times left)
        self._served = 0
        self._connections: set[socket.socket] = set()
        self.server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="model-api", daemon=True)
        self._thread.start()

    def count(self, path: str | None = None) -> int:
        with self._lock:
            return sum(1 for r in self.requests if path is None or r["path"] == path)

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self._fail = (0, 0)

    def fail_next(self, status: int, times: int = 1) -> None:
        with self._lock:
            self._fail = (status, times)

    def stats(self) -> dict:
        with self._lock:
            by_path: dict[str, int] = {}
            for r in self.requests:
                by_path[r["path"]] = by_path.get(r["path"], 0) + 1
            return {"count": len(self.requests), "by_path": by_path, "requests": list(self.requests)}

    def _record(self, path: str, body: dict, headers: dict) -> tuple[int | None, str]:
        """Record one model request; (status to fail it with or None, its request id)."""
        with self._lock:
            self._served += 1
            self.requests.append({"path": path, "body": body, "stream": bool(body.get("stream")), "headers": headers})
            status, left = self._fail
            if left > 0:
                self._fail = (status, left - 1)
                return status, f"req_{self._served}"
            return None, f"req_{self._served}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        with self._lock:
            for conn in list(self._connections):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def __enter__(self) -> ModelAPI:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _handler(api: ModelAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out in two writes: no wait for a delayed ACK

        def setup(self) -> None:
            super().setup()
            with api._lock:
                api._connections.add(self.connection)

        def finish(self) -> None:
            with api._lock:
                api._connections.discard(self.connection)
            super().finish()

        def handle(self) -> None:
            try:
                super().handle()
            except ConnectionError:  # a client gone (killed mid-stream, or reset while idle)
                pass

        def log_message(self, *args: object) -> None:
            pass

        def _json(self, status: int, data: Any, headers: dict[str, str] | None = None) -> None:
            raw = json.dumps(data).encode()
            self.send_response(status)
            if api.gzip and "gzip" in self.headers.get("accept-encoding", ""):
                raw = zlib.compress(raw, wbits=31)  # gzip, as a real API behind a CDN answers
                self.send_header("content-encoding", "gzip")
            for name, value in {"content-type": "application/json", **(headers or {})}.items():
                self.send_header(name, value)
            self.send_header("content-length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _sse(self, events: list[tuple[str | None, Any]], headers: dict[str, str]) -> None:
            self.send_response(200)
            for name, value in {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache",
                                "transfer-encoding": "chunked", **headers}.items():
                self.send_header(name, value)
            gzip = api.gzip and "gzip" in self.headers.get("accept-encoding", "")
            if gzip:
                self.send_header("content-encoding", "gzip")
            self.end_headers()
            packer = zlib.compressobj(wbits=31)
            if api.truncate_stream:  # the connection ends cleanly before the stream's final events
                events = events[:api.truncate_stream]
            if api.stream_error:  # the provider gives up mid-stream (Anthropic: an `error` event in a 200 stream)
                events = [*events[:3], ("error", {"type": "error", "error": {"type": "overloaded_error",
                                                                             "message": "Overloaded"}})]
            try:
                for i, (event, data) in enumerate(events):
                    if i and api.stream_delay > 0:
                        time.sleep(api.stream_delay)
                    text = data if isinstance(data, str) else json.dumps(data)
                    raw = ((f"event: {event}\n" if event else "") + f"data: {text}\n\n").encode()
                    if gzip:  # one gzip stream, flushed at every event
                        raw = packer.compress(raw) + packer.flush(zlib.Z_SYNC_FLUSH if i < len(events) - 1 else zlib.Z_FINISH)
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(raw), raw))
                self.wfile.write(b"0\r\n\r\n")
            except ConnectionError:
                self.close_connection = True

        def _relay(self, body: dict) -> None:
            """Counted, then answered by a real upstream server; its SSE events passed on one by one."""
            target = urllib.parse.urlsplit(api.upstream)
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=600)
            conn.request("POST", self.path, json.dumps(body).encode(), {"content-type": "application/json"})
            answer = conn.getresponse()
            stream = answer.getheader("content-type", "").startswith("text/event-stream")
            self.send_response(answer.status)
            self.send_header("content-type", answer.getheader("content-type", "application/json"))
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            try:
                pending = b""
                while True:
                    line = answer.readline() if stream else answer.read()
                    pending += line
                    if stream and line not in (b"\n", b"\r\n", b""):
                        continue
                    if pending:
                        if stream and api.stream_delay > 0:
                            time.sleep(api.stream_delay)
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(pending), pending))
                        self.wfile.flush()
                        pending = b""
                    if not line or not stream:
                        break
                self.wfile.write(b"0\r\n\r\n")
            except ConnectionError:
                self.close_connection = True
            finally:
                conn.close()

        def _body(self) -> Any:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            return json.loads(raw) if raw.strip() else {}

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == "/_stats":
                self._json(200, api.stats())
            elif path == "/v1/models" and "anthropic-version" in self.headers:
                self._json(200, {"data": [{"type": "model", "id": MODEL, "display_name": "Counting model",
                                           "created_at": "2023-11-14T22:13:20Z"}],
                                 "has_more": False, "first_id": MODEL, "last_id": MODEL})
            elif path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "created": CREATED,
                                                             "owned_by": "caravanserai"}]})
            else:
                self._json(404, error_body(path, 404, "req_0"))

        def do_POST(self) -> None:
            path = self.path.split("?")[0]
            try:
                body = self._body()
            except ValueError:
                self._json(400, error_body(path, 400, "req_0"))
                return
            if path == "/_reset":
                api.reset()
                self._json(200, {"ok": True})
                return
            if path == "/_config":
                if "stream_delay" in body:
                    api.stream_delay = float(body["stream_delay"])
                if body.get("fail_next"):
                    api.fail_next(int(body["fail_next"]["status"]), int(body["fail_next"].get("times", 1)))
                self._json(200, {"ok": True, "stream_delay": api.stream_delay})
                return
            if path not in MODEL_PATHS:
                self._json(404, error_body(path, 404, "req_0"))
                return
            fail, request_id = api._record(path, body, {k.lower(): v for k, v in self.headers.items()})
            headers = {"x-request-id": request_id}
            if path == "/v1/messages":
                headers["request-id"] = request_id
            if api.response_delay > 0:  # a test kills its client while this request is in flight
                time.sleep(api.response_delay)
            if fail is not None:
                self._json(fail, error_body(path, fail, request_id),
                           {**headers, "retry-after": "0", "retry-after-ms": "1"})
                return
            if path == "/v1/embeddings":
                self._json(200, embeddings(body), headers)
                return
            if api.upstream:
                self._relay(body)
                return
            plain, events = MODEL_PATHS[path](body, Answer(body))  # type: ignore[misc]
            if body.get("stream"):
                self._sse(events, headers)
            else:
                self._json(200, plain, headers)

    return Handler


def start(port: int = 0, stream_delay: float = 0.0, upstream: str = "") -> ModelAPI:
    """Start the server on 127.0.0.1 (a free port by default), in a daemon thread; with ``upstream``
    (a real server's base URL, no /v1) it counts and paces requests that the real server answers."""
    api = ModelAPI(port, stream_delay)
    api.upstream = upstream
    return api


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--stream-delay", type=float, default=0.0)
    args = parser.parse_args()
    api = start(args.port, args.stream_delay)
    print(f"URL {api.url}", flush=True)
    try:
        api._thread.join()
    except KeyboardInterrupt:
        api.stop()


if __name__ == "__main__":
    main()
