"""``DurableAgent``: a multi-step agent whose whole run state is one portable ``bytes`` checkpoint.

A run is a small graph: one *prompt* node per step (its text) and one *step* node per step
(its generation), where step i depends on prompt i and on step i-1: each step's generation sees
its own prompt plus the previous step's output. A checkpoint holds the graph, every value
computed so far and the KV-cache state, so it can be resumed in any process with nothing else.
Completed steps are never recomputed (resume or fork); a fork replaces one node's value and
invalidates everything downstream of it, so later steps run again on the new value.

Backends: the deterministic ``fake`` backend (default; outputs are token ids; it keeps a real
per-token KV cache that grows with the context) and an OpenAI-compatible ``/v1/completions``
server chosen by ``VLLM_BASE_URL`` (outputs are text; ``cached_tokens`` reported by the server
is counted as ``tokens_saved``).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Sequence

from . import ckpt_format as fmt
from .errors import CaravanseraiError, ModelError
from .models import OpenAICompatibleModel

__all__ = ["DurableAgent", "FakeBackend", "OpenAICompletionsBackend"]

FORMAT = "caravanserai.durable_agent"
DEFAULT_VLLM_MODEL = "vllm/gemma4"


def prompt_id(step: int) -> str:
    return f"prompt-{step}"


def step_id(step: int) -> str:
    return f"step-{step}"


class FakeBackend:
    """Deterministic stand-in for a model: byte tokens, a per-token KV cache, greedy 'generation'.

    Each context token gets a KV entry (``LAYERS`` × K,V × ``DIM`` float32, derived from the token
    and its position); the next token is read from a digest of the KV so far, so the output
    depends on every context token and the cache grows by one entry per token.
    """

    name = "fake"
    LAYERS, DIM, NEW_TOKENS = 2, 4, 8
    ENTRY_BYTES = LAYERS * 2 * DIM * 4

    def __init__(self, model_id: str = "fake") -> None:
        self.model_id = model_id
        self.tokens_computed = 0
        self.tokens_saved = 0

    @staticmethod
    def tokenize(text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def kv_entry(self, token: int, position: int) -> bytes:
        self.tokens_computed += 1
        return hashlib.blake2b(f"{token}:{position}".encode(), digest_size=self.ENTRY_BYTES).digest()

    def generate(self, prompt: str, previous: Any) -> tuple[list[int], bytes]:
        context = self.tokenize(prompt) + list(previous or [])
        kv = b"".join(self.kv_entry(t, i) for i, t in enumerate(context))
        state = hashlib.sha256(kv).digest()
        output: list[int] = []
        for k in range(self.NEW_TOKENS):
            token = state[0]
            output.append(token)
            entry = self.kv_entry(token, len(context) + k)
            kv += entry
            state = hashlib.sha256(state + entry).digest()
        return output, kv


class OpenAICompletionsBackend:
    """Steps sent to an OpenAI-compatible ``/v1/completions`` server (vLLM, Ollama, llama.cpp...).

    Each request carries the full prompt (the step's prompt, then the previous step's output);
    prefix reuse happens server side, and ``usage.prompt_tokens_details.cached_tokens`` is added
    to ``tokens_saved``. The KV cache lives in the server, so checkpoints carry no KV entries.
    """

    name = "vllm"
    MAX_TOKENS = 32

    def __init__(self, model_id: str, base_url: str | None = None) -> None:
        base_url = base_url or os.environ.get("VLLM_BASE_URL")
        if not base_url:
            raise ModelError("this checkpoint runs on an OpenAI-compatible server: set VLLM_BASE_URL", kind="config")
        self.model_id = model_id
        served = model_id.removeprefix("vllm/")
        self.client = OpenAICompatibleModel(base_url, served, api_key=os.environ.get("VLLM_API_KEY"))
        self.tokens_computed = 0
        self.tokens_saved = 0

    def generate(self, prompt: str, previous: Any) -> tuple[str, bytes]:
        full = prompt if not previous else f"{prompt}\n\n{previous}"
        reply = self.client.complete_text(full, max_tokens=self.MAX_TOKENS, temperature=0)
        self.tokens_computed += reply.usage.prompt_tokens + reply.usage.completion_tokens
        self.tokens_saved += reply.usage.cached_tokens
        return reply.text, b""


def _backend(name: str, model_id: str):
    if name == "fake":
        return FakeBackend(model_id)
    if name == "vllm":
        return OpenAICompletionsBackend(model_id)
    raise fmt.CheckpointFormatError(f"checkpoint needs backend {name!r}, which this caravanserai does not have")


def _graph(steps: int) -> list[dict]:
    nodes = []
    for i in range(steps):
        nodes.append({"id": prompt_id(i), "kind": "prompt", "step": i, "deps": []})
        deps = [prompt_id(i)] + ([step_id(i - 1)] if i else [])
        nodes.append({"id": step_id(i), "kind": "step", "step": i, "deps": deps})
    return nodes


def _downstream(graph: list[dict], node_id: str) -> set[str]:
    """Every node that depends, directly or not, on ``node_id`` (one pass over a reverse index)."""
    dependents: dict[str, list[str]] = {}
    for node in graph:
        for dep in node["deps"]:
            dependents.setdefault(dep, []).append(node["id"])
    found: set[str] = set()
    frontier = [node_id]
    while frontier:
        current = frontier.pop()
        for child in dependents.get(current, ()):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return found


class DurableAgent:
    """Run a list of steps; checkpoint as bytes at any step; resume, inspect and fork checkpoints."""

    def __init__(self) -> None:
        self._header: dict[str, Any] | None = None
        self._kv: dict[str, bytes] = {}
        self._backend: Any = None
        self.computed_steps: list[int] = []  # steps this object computed (not restored): proves no recompute

    # ---- building a run ------------------------------------------------------------------
    def begin(self, prompts: Sequence[str], model_id: str | None = None) -> "DurableAgent":
        """Start a run of ``prompts`` (one step each). ``VLLM_BASE_URL`` selects the server backend."""
        if not prompts or not all(isinstance(p, str) for p in prompts):
            raise ValueError("begin() needs a non-empty list of prompt strings")
        use_server = bool(os.environ.get("VLLM_BASE_URL")) or (model_id or "").startswith("vllm/")
        backend = "vllm" if use_server else "fake"
        model_id = model_id or (DEFAULT_VLLM_MODEL if use_server else "fake")
        runtime = _backend(backend, model_id)  # first: a failure leaves this agent as it was
        values: dict[str, Any] = {prompt_id(i): p for i, p in enumerate(prompts)}
        self._header = {"format": FORMAT, "backend": backend, "model_id": model_id, "steps": len(prompts),
                        "graph": _graph(len(prompts)), "values": values}
        self._kv = {}
        self._backend = runtime
        self.computed_steps = []
        return self

    @property
    def backend(self) -> str:
        return self._require()["backend"]

    @property
    def prompt_node_ids(self) -> list[str]:
        return [prompt_id(i) for i in range(self._require()["steps"])]

    @property
    def step_node_ids(self) -> list[str]:
        return [step_id(i) for i in range(self._require()["steps"])]

    @property
    def tokens_saved(self) -> int:
        return getattr(self._backend, "tokens_saved", 0)

    def step_outputs(self) -> list[Any]:
        """Each step's generated output in step order (None for a step that has not run)."""
        values = self._require()["values"]
        return [values.get(sid) for sid in self.step_node_ids]

    def cache_size(self) -> int:
        """Tokens in the KV cache (restored with a checkpoint, grown by each computed step)."""
        return sum(len(blob) for blob in self._kv.values()) // FakeBackend.ENTRY_BYTES

    # ---- running -------------------------------------------------------------------------
    def run_until_step(self, i: int, store: Any = None, key: str | None = None) -> bytes:
        """Execute steps 0..i (those not yet done) and return the checkpoint; also ``store.put(key, ...)``."""
        header = self._require()
        if not 0 <= i < header["steps"]:
            raise IndexError(f"step {i} is out of range: this run has steps 0..{header['steps'] - 1}")
        for step in range(i + 1):
            self._execute(step)
        blob = self.checkpoint()
        if store is not None:
            _objects(store).put(_key(key), blob)
        return blob

    def resume_from(self, ckpt: bytes | None = None, *, store: Any = None, key: str | None = None) -> list[Any]:
        """Load a checkpoint (bytes, or ``store``/``key``) and run it to completion; returns step outputs."""
        if ckpt is None:
            if store is None:
                raise ValueError("resume_from() needs checkpoint bytes, or store= and key=")
            ckpt = _objects(store).get(_key(key))
        self._load(ckpt)
        for step in range(self._header["steps"]):
            self._execute(step)
        return self.step_outputs()

    def checkpoint(self) -> bytes:
        """The current run state as checkpoint bytes (deterministic)."""
        return fmt.encode(fmt.CheckpointData(self._require(), dict(self._kv)))

    # ---- reading and editing checkpoints without a runtime --------------------------------
    @staticmethod
    def inspect(ckpt: bytes) -> dict[str, Any]:
        """What a checkpoint holds, read without building a backend."""
        data = _decode(ckpt)
        header = data.header
        graph = header["graph"]
        executed = [n["id"] for n in graph if n["kind"] == "step" and n["id"] in header["values"]]
        return {
            "executed_nodes": executed,
            "pending_nodes": [n["id"] for n in graph if n["kind"] == "step" and n["id"] not in header["values"]],
            "checkpoint_bytes": len(ckpt),
            "checkpoint_id": fmt.checkpoint_id(bytes(ckpt)),
            "backend": header["backend"],
            "model_id": header["model_id"],
            "steps": header["steps"],
            "kv_tokens": sum(len(b) for b in data.kv.values()) // FakeBackend.ENTRY_BYTES,
            "format_version": fmt.FORMAT_VERSION,
        }

    @staticmethod
    def outputs_of(ckpt: bytes) -> list[Any]:
        """A checkpoint's step outputs (None for steps not run), read without a runtime."""
        header = _decode(ckpt).header
        return [header["values"].get(step_id(i)) for i in range(header["steps"])]

    @staticmethod
    def fork(ckpt: bytes, node_id: str, value: Any) -> bytes:
        """A new checkpoint with ``node_id`` set to ``value`` and everything downstream of it undone."""
        data = _decode(ckpt)
        header = dict(data.header)
        graph = header["graph"]
        node = next((n for n in graph if n["id"] == node_id), None)
        if node is None:
            known = ", ".join(n["id"] for n in graph)
            raise KeyError(f"no node {node_id!r} in this checkpoint (nodes: {known})")
        if node["kind"] == "prompt" and not isinstance(value, str):
            raise ValueError(f"prompt node {node_id!r} takes a str, got {type(value).__name__}")
        values = dict(header["values"])
        kv = dict(data.kv)
        for stale in _downstream(graph, node_id):
            values.pop(stale, None)
            kv.pop(stale, None)
        values[node_id] = value
        kv.pop(node_id, None)
        header["values"] = values
        return fmt.encode(fmt.CheckpointData(header, kv))

    # ---- internals -----------------------------------------------------------------------
    def _require(self) -> dict[str, Any]:
        if self._header is None:
            raise CaravanseraiError("this DurableAgent has no run: call begin(prompts) or resume_from(checkpoint)")
        return self._header

    def _load(self, ckpt: bytes) -> None:
        data = _decode(ckpt)
        runtime = _backend(data.header["backend"], data.header["model_id"])  # first: a failure changes nothing
        self._header = data.header
        self._kv = dict(data.kv)
        self._backend = runtime
        self.computed_steps = []

    def _execute(self, step: int) -> None:
        values = self._header["values"]
        sid = step_id(step)
        if sid in values:
            return  # completed steps are never recomputed
        previous = values.get(step_id(step - 1)) if step else None
        output, kv = self._backend.generate(values[prompt_id(step)], previous)
        values[sid] = output
        if kv:
            self._kv[sid] = kv
        self.computed_steps.append(step)


def _decode(ckpt: Any) -> fmt.CheckpointData:
    data = fmt.decode(ckpt)
    if data.kind != fmt.FULL or data.header.get("format") != FORMAT:
        raise fmt.CheckpointFormatError("these bytes are not a DurableAgent checkpoint (a CheckpointLog delta? use log.load(id))")
    return data


def _objects(store: Any) -> Any:
    """Accept a checkpoint store (object face) or a full Store (use its object face)."""
    return getattr(store, "objects", store) if not hasattr(store, "put_if_absent") else store


def _key(key: str | None) -> str:
    if not key:
        raise ValueError("a store needs a key= to put or get the checkpoint under")
    return key
