"""``DurableAgent``: a multi-step agent whose whole run state is one portable ``bytes`` checkpoint.

A run is a small graph: one *prompt* node per step (its text) and one *step* node per step
(its generation), where step i depends on prompt i and on step i-1: each step's generation sees
its own prompt plus the previous step's output. A checkpoint holds the graph, every value
computed so far and the KV-cache state, so it can be resumed in any process with nothing else.
Completed steps are never recomputed (resume or fork); a fork replaces one node's value and
invalidates everything downstream of it, so later steps run again on the new value.

Backends: the deterministic ``fake`` backend (default; outputs are token ids; it keeps a real
per-token KV cache that grows with the context), the deterministic ``text`` backend chosen by
``model_id="text"`` (``text_backend``: offline, no weights; outputs are short English notes
composed from the step's prompt and the previous step's output, with the same per-token KV cache),
an OpenAI-compatible ``/v1/completions`` server chosen by ``VLLM_BASE_URL`` (outputs are text;
``cached_tokens`` reported by the server is counted as ``tokens_saved``), and an in-process
``transformers`` model chosen by ``model_id="local/..."`` or ``CARAVANSERAI_LOCAL_MODEL``
(``local_model``: outputs are text, the real KV cache travels in the checkpoint).
"""

from __future__ import annotations

import functools
import itertools
import os
import re
from collections.abc import Sequence
from typing import Any

from ..calls.models import OpenAICompatibleModel
from ..errors import AgentNotStarted, ModelError, SerializationError, UnknownNode, UsageError
from . import format as fmt
from .fake_backend import FakeBackend
from .format import corrupt, short

__all__ = ["DurableAgent", "FakeBackend", "OpenAICompletionsBackend", "decode_checkpoint", "validate_header"]

FORMAT = "caravanserai.durable_agent"
DEFAULT_VLLM_MODEL = "vllm/gemma4"
BACKENDS = ("fake", "text", "vllm", "local")
KV_ENTRY_BACKENDS = ("fake", "text")  # one fixed-size KV entry per context token (FakeBackend.ENTRY_BYTES)
TEXT_MODEL = "text"  # model_id="text" selects the text backend
MAX_STEPS = 1_000_000  # a hard cap on a checkpoint's step count: bounds every loop over data read from bytes


def prompt_id(step: int) -> str:
    return f"prompt-{step}"


def step_id(step: int) -> str:
    return f"step-{step}"


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
    if name == "text":
        from .text_backend import TextBackend

        return TextBackend(model_id)
    if name == "vllm":
        return OpenAICompletionsBackend(model_id)
    if name == "local":
        from .local_model import LocalModelBackend  # torch is imported only here

        return LocalModelBackend(model_id)
    raise fmt.CheckpointFormatError(f"checkpoint needs backend {name!r}, which this caravanserai does not have")


def _choose_backend(model_id: str | None) -> tuple[str, str]:
    """``(backend, model_id)``: ``"text"``, a ``local/`` or ``vllm/`` model id, else ``VLLM_BASE_URL``, else
    ``CARAVANSERAI_LOCAL_MODEL``, else the fake backend."""
    if model_id == TEXT_MODEL:
        return "text", TEXT_MODEL
    if model_id is not None and model_id.startswith("local/"):
        return "local", model_id
    if os.environ.get("VLLM_BASE_URL") or (model_id or "").startswith("vllm/"):
        return "vllm", model_id or DEFAULT_VLLM_MODEL
    local = os.environ.get("CARAVANSERAI_LOCAL_MODEL")
    if local and model_id is None:
        return "local", "local/" + local.removeprefix("local/")
    return "fake", model_id or "fake"


def _cache_report(header: dict[str, Any], kv: dict[str, bytes]) -> dict[str, Any]:
    """The checkpoint's cache section for ``inspect`` (read without a backend): model, tokens covered, bytes."""
    if header["backend"] == "local":
        from .local_model import cache_section

        return cache_section(header["model_id"], kv)
    size = sum(len(blob) for blob in kv.values())
    return {"model": header["model_id"], "tokens": size // FakeBackend.ENTRY_BYTES, "bytes": size}


def _graph(steps: int) -> list[dict]:
    nodes = []
    for i in range(steps):
        nodes.append({"id": prompt_id(i), "kind": "prompt", "step": i, "deps": []})
        deps = [prompt_id(i)] + ([step_id(i - 1)] if i else [])
        nodes.append({"id": step_id(i), "kind": "step", "step": i, "deps": deps})
    return nodes


class DurableAgent:
    """Run a list of steps; checkpoint as bytes at any step; resume, inspect and fork checkpoints."""

    def __init__(self) -> None:
        self._header: dict[str, Any] | None = None
        self._kv: dict[str, bytes] = {}
        self._backend: Any = None
        self.computed_steps: list[int] = []  # steps this object computed (not restored): proves no recompute

    # ---- building a run ------------------------------------------------------------------
    def begin(self, prompts: Sequence[str], model_id: str | None = None) -> DurableAgent:
        """Start a run of ``prompts`` (one step each). ``model_id="text"`` selects the readable offline text
        backend, ``"local/..."`` an in-process model, ``VLLM_BASE_URL`` the server backend; default: fake."""
        if not prompts or not all(isinstance(p, str) for p in prompts):
            raise UsageError("begin() needs a non-empty list of prompt strings, e.g. begin(['plan', 'act'])")
        if len(prompts) > MAX_STEPS:
            raise UsageError(f"begin() got {len(prompts)} prompts; a run has at most {MAX_STEPS} steps")
        if model_id is not None and not isinstance(model_id, str):
            raise UsageError(f"begin() takes model_id as a str such as 'vllm/gemma4', got {type(model_id).__name__}")
        for i, prompt in enumerate(prompts):
            _check_json_value(prompt_id(i), prompt)  # a checkpoint must be able to hold every prompt
        backend, model_id = _choose_backend(model_id)
        if backend == "local":
            from .local_model import choose_model

            choose_model(model_id)  # chosen by code: checkpoints of this run may load it again
        runtime = _backend(backend, model_id)  # first: a failure leaves this agent as it was
        values: dict[str, Any] = {prompt_id(i): p for i, p in enumerate(prompts)}
        self._header = {"format": FORMAT, "backend": backend, "model_id": model_id, "steps": len(prompts),
                        "graph": _expected_graph(len(prompts)), "values": values}
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
        counter = getattr(self._backend, "cache_tokens", None)
        if counter is not None:
            return counter(self._kv)
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

    def resume_from(self, ckpt: bytes | None = None, *, store: Any = None, key: str | None = None,
                    reprefill: bool = False, model_id: str | None = None) -> list[Any]:
        """Load a checkpoint (bytes, or ``store``/``key``) and run it to completion; returns step outputs.

        On the local backend a KV cache made by another model, revision or dtype raises
        ``ModelFingerprintMismatch``; ``reprefill=True`` drops the cache and recomputes it instead.
        ``model_id="local/<folder>"`` loads that folder (a checkpoint naming a folder this process
        did not choose raises ``ModelNotChosen``: data never picks the files to load).
        """
        if ckpt is None:
            if store is None:
                raise UsageError("resume_from() needs checkpoint bytes, or store= and key=")
            ckpt = _objects(store).get(_key(key))
        self._load(ckpt, reprefill=reprefill, model_id=model_id)
        for step in range(self._require()["steps"]):
            self._execute(step)
        return self.step_outputs()

    def load(self, ckpt: bytes, *, reprefill: bool = False, model_id: str | None = None) -> DurableAgent:
        """Load a checkpoint without running anything (``run_step`` then runs what is pending)."""
        self._load(ckpt, reprefill=reprefill, model_id=model_id)
        return self

    def pending_steps(self) -> list[int]:
        """Indexes (from 0) of the steps not run yet, in order."""
        values = self._require()["values"]
        return [i for i in range(self._require()["steps"]) if step_id(i) not in values]

    def run_step(self, i: int) -> bool:
        """Run step ``i`` (from 0) if it is not done; True if it was computed now. Earlier steps must be done."""
        header = self._require()
        if not 0 <= i < header["steps"]:
            raise IndexError(f"step {i} is out of range: this run has steps 0..{header['steps'] - 1}")
        if i and step_id(i - 1) not in header["values"]:
            raise UsageError(f"step {i} needs step {i - 1}'s output first: run the steps in order")
        before = len(self.computed_steps)
        self._execute(i)
        return len(self.computed_steps) > before

    @property
    def tokens_computed(self) -> int:
        return getattr(self._backend, "tokens_computed", 0)

    def checkpoint(self) -> bytes:
        """The current run state as checkpoint bytes (deterministic)."""
        header = self._require()
        _graph_json(header["steps"])  # its graph is encoded once per process, not at every checkpoint
        return fmt.encode(fmt.CheckpointData(header, dict(self._kv)))

    # ---- reading and editing checkpoints without a runtime --------------------------------
    @staticmethod
    def inspect(ckpt: bytes) -> dict[str, Any]:
        """What a checkpoint holds, read without building a backend (node ids count from 0)."""
        data = _decode(ckpt)
        header = data.header
        steps, values = header["steps"], header["values"]
        cache = _cache_report(header, data.kv)
        return {
            "executed_nodes": [step_id(i) for i in range(steps) if step_id(i) in values],
            "pending_nodes": [step_id(i) for i in range(steps) if step_id(i) not in values],
            "checkpoint_bytes": len(ckpt),
            "checkpoint_id": fmt.checkpoint_id(bytes(ckpt)),
            "backend": header["backend"],
            "model_id": header["model_id"],
            "steps": steps,
            "kv_tokens": cache["tokens"],
            "cache": cache,
            "format_version": fmt.FORMAT_VERSION,
        }

    @staticmethod
    def outputs_of(ckpt: bytes) -> list[Any]:
        """A checkpoint's step outputs (None for steps not run), read without a runtime."""
        header = _decode(ckpt).header
        return [header["values"].get(step_id(i)) for i in range(header["steps"])]

    @staticmethod
    def fork(ckpt: bytes, node_id: str, value: Any) -> bytes:
        """A new checkpoint with ``node_id`` set to ``value`` and everything downstream of it undone.

        ``UnknownNode`` if the checkpoint has no such node; ``UsageError`` for a prompt value that
        is not a str; ``SerializationError`` for a value that is not JSON.
        """
        return fmt.encode(DurableAgent.fork_data(_decode(ckpt), node_id, value))

    @staticmethod
    def fork_data(data: fmt.CheckpointData, node_id: str, value: Any) -> fmt.CheckpointData:
        """``fork`` on a decoded, validated checkpoint (``data`` is not modified)."""
        stale, stale_kv = fork_change(data, node_id, value)
        header = dict(data.header)
        values = dict(header["values"])
        kv = dict(data.kv)
        for key in stale:
            del values[key]
        for key in stale_kv:
            del kv[key]
        values[node_id] = value
        header["values"] = values
        return fmt.CheckpointData(header, kv)

    # ---- internals -----------------------------------------------------------------------
    def _require(self) -> dict[str, Any]:
        if self._header is None:
            raise AgentNotStarted("this DurableAgent has no run: call begin(prompts) or resume_from(checkpoint)")
        return self._header

    def _load(self, ckpt: bytes, reprefill: bool = False, model_id: str | None = None) -> None:
        data = _decode(ckpt)
        backend, model = data.header["backend"], data.header["model_id"]
        if backend == "local":
            from .local_model import check_chosen, choose_model

            if model_id is not None:
                if not isinstance(model_id, str) or not model_id.startswith("local/"):
                    raise UsageError(f"model_id for a local checkpoint is 'local/<name or folder>', got {model_id!r}")
                choose_model(model_id)
                model = model_id  # the caller's copy of the model; the KV fingerprint proves it is the same
            check_chosen(model)
        runtime = _backend(backend, model)  # first: a failure changes nothing
        adopt = getattr(runtime, "adopt", None)  # the local backend checks the cache's model fingerprint
        kv = adopt(dict(data.kv), reprefill=reprefill) if adopt is not None else dict(data.kv)
        self._header = data.header
        self._kv = kv
        self._backend = runtime
        self.computed_steps = []

    def _execute(self, step: int) -> None:
        values = self._require()["values"]
        sid = step_id(step)
        if sid in values:
            return  # completed steps are never recomputed
        previous = values.get(step_id(step - 1)) if step else None
        run_step = getattr(self._backend, "run_step", None)  # the local backend reads the whole transcript
        if run_step is not None:
            output, kv = run_step(step, values, self._kv)
        else:
            output, kv = self._backend.generate(values[prompt_id(step)], previous)
        values[sid] = output
        if kv:
            self._kv[sid] = kv
        self.computed_steps.append(step)


def fork_change(data: fmt.CheckpointData, node_id: str, value: Any,
                steps_held: Sequence[str] | None = None) -> tuple[list[str], list[str]]:
    """Check a fork of ``data`` (decoded, validated) and name what it undoes: the value keys and the KV
    keys (``node_id``'s own entry too) it drops. Downstream of prompt-k / step-k is step-k / step-(k+1)
    onward (the graph is the fixed one ``validate_header`` checks), so the cost is the smaller of
    the steps after the node and the steps held (``steps_held``: the step keys of ``values``, if the
    caller has them): the size of the change, never the whole graph.
    """
    steps = data.header["steps"]
    where = _node_index(node_id, steps)
    if where is None:
        raise UnknownNode(f"no node {short(node_id)} in this checkpoint; its nodes are {_known_nodes(steps)} "
                          "(node ids count from 0: step N's prompt is prompt-<N-1>)", node_id=short(node_id))
    if where[0] == "prompt" and not isinstance(value, str):
        raise UsageError(f"prompt node {node_id} takes a str, got {type(value).__name__}; pass the new prompt text",
                         node_id=node_id)
    _check_json_value(node_id, value)
    first = where[1] + (where[0] == "step")  # the first step downstream of the node
    values, kv = data.header["values"], data.kv

    def held(keys: Any, steps_in_keys: Any) -> list[str]:  # the keys of steps >= first that ``keys`` holds
        if steps - first <= len(steps_in_keys):
            return [key for key in map(step_id, range(first, steps)) if key in keys]
        return sorted(k for k in steps_in_keys if (_node_index(k, steps) or ("", -1)) >= ("step", first))

    # values: every prompt (validated), then the steps done (found in C when the caller has no list)
    stale = held(values, steps_held if steps_held is not None else values.keys() - _prompt_ids(steps))
    stale_kv = held(kv, kv.keys()) + ([node_id] if node_id in kv else [])
    return stale, stale_kv


_STEPS_FIELD = re.compile(rb'"steps":(\d{1,7})[,}]')


def known_fields(raw_header: bytes) -> list[tuple[str, bytes, Any, int]]:
    """The graph a header most likely holds, already encoded (``steps`` is guessed from the text;
    ``format.decode`` compares the bytes and parses everything else): a checkpoint's header is
    mostly its graph, so a decode compares it instead of parsing it."""
    last = raw_header.rfind(b'"steps":')  # the field sorts after the graph: look from the end first
    found = _STEPS_FIELD.match(raw_header, last) if last >= 0 else None
    found = found or _STEPS_FIELD.search(raw_header)
    if found is None or not 1 <= int(found[1]) <= MAX_STEPS:
        return []
    steps = int(found[1])
    return [("graph", _graph_json(steps), _expected_graph(steps), 3)]  # 3: list > node > deps


def decode_checkpoint(ckpt: Any, what: str = "checkpoint") -> fmt.CheckpointData:
    """Decode and validate a full DurableAgent checkpoint (``CheckpointCorruptionError`` if malformed)."""
    data = fmt.decode(ckpt, what=what, known=known_fields)
    if data.kind != fmt.FULL:
        raise fmt.CheckpointFormatError(f"{what} is a CheckpointLog delta, not a DurableAgent checkpoint: "
                                        "use log.load(id) to rebuild the full checkpoint")
    validate_header(data, what)
    return data


_decode = decode_checkpoint


def validate_header(data: fmt.CheckpointData, what: str = "checkpoint") -> None:
    """Check every field a DurableAgent reads from a full checkpoint; ``CheckpointCorruptionError`` if any is wrong.

    Data never chooses code: ``backend`` must be one of ``BACKENDS``; ``steps`` is bounded by
    ``MAX_STEPS`` and by the graph actually present before anything loops over it.
    """
    header = data.header
    if header.get("format") != FORMAT:
        corrupt(what, f"its header format is {short(header.get('format'))}, not {FORMAT!r}")
    if header.get("backend") not in BACKENDS:
        corrupt(what, f"its backend {short(header.get('backend'))} is none of {', '.join(BACKENDS)}")
    if not isinstance(header.get("model_id"), str):
        corrupt(what, "its model_id is not a string")
    steps = header.get("steps")
    if not (type(steps) is int and 1 <= steps <= MAX_STEPS):
        corrupt(what, f"its step count {short(steps)} is not a whole number from 1 to {MAX_STEPS}")
    _check_graph(header.get("graph"), steps, what)
    _check_values(header.get("values"), steps, what)
    _check_kv(data.kv, header["values"], header["backend"], what)


def _check_graph(graph: Any, steps: int, what: str) -> None:
    """The graph must be exactly the one ``begin`` builds for ``steps`` steps (length checked before any loop)."""
    if not isinstance(graph, list) or len(graph) != 2 * steps:
        corrupt(what, f"its graph does not hold the {steps} steps its header names")
    if graph is _expected_graph(steps):
        return  # the decoder compared its bytes with this very graph's
    if graph == _expected_graph(steps) and all(type(node["step"]) is int for node in graph):
        return  # one comparison in C; == cannot tell 1 from True or 1.0, hence the type check
    for position, node in enumerate(graph):
        expected = _graph_node(position)
        if not (isinstance(node, dict) and node.keys() == expected.keys()
                and type(node["step"]) is int and node == expected):
            corrupt(what, f"its graph node {position} is not the {expected['id']} node")


@functools.lru_cache(maxsize=4)
def _expected_graph(steps: int) -> list[dict]:
    """The graph ``begin`` builds for ``steps`` steps (cached: checkpoints of one run share it; never modified)."""
    return _graph(steps)


@functools.lru_cache(maxsize=4)
def _prompt_ids(steps: int) -> frozenset[str]:
    return frozenset(map(prompt_id, range(steps)))


@functools.lru_cache(maxsize=4)
def _graph_json(steps: int) -> bytes:
    """The canonical JSON of ``_expected_graph(steps)``, encoded once (most of a header's bytes)."""
    graph = _expected_graph(steps)
    encoded = fmt.canonical_json(graph)
    fmt.remember_encoding(graph, encoded)
    return encoded


def _graph_node(position: int) -> dict[str, Any]:
    """Node ``position`` of the graph ``_graph`` builds (prompt, step, prompt, step, ...)."""
    step = position // 2
    if position % 2 == 0:
        return {"id": prompt_id(step), "kind": "prompt", "step": step, "deps": []}
    return {"id": step_id(step), "kind": "step", "step": step,
            "deps": [prompt_id(step)] + ([step_id(step - 1)] if step else [])}


def _check_values(values: Any, steps: int, what: str) -> None:
    """Values: a dict keyed by node ids of the graph, with a str for every prompt."""
    if not isinstance(values, dict):
        corrupt(what, "its values are not a JSON object")
    if ([*itertools.islice(values, steps)] == _sorted_prompt_ids(steps)  # a decoded checkpoint: sorted keys
            and {*map(type, itertools.islice(values.values(), steps))} == {str}
            and {*itertools.islice(values, steps, None)} <= _step_ids(steps)):
        return  # every prompt first and a str, then steps: compared in C, without hashing the prompts
    if not values.keys() <= _node_ids(steps):  # a set comparison; the loop below only names the stray key
        for key in values:
            if _node_index(key, steps) is None:
                corrupt(what, f"its values name {short(key)}, which is no node of its graph")
    if {*map(type, map(values.get, _prompt_ids(steps)))} == {str}:
        return  # every prompt a str, checked in C; the loop below names the first that is not
    for i in range(steps):  # bounded: steps == len(graph) / 2, checked first
        if not isinstance(values.get(prompt_id(i)), str):
            corrupt(what, f"its prompt {prompt_id(i)} is missing or not a string")


@functools.lru_cache(maxsize=4)
def _sorted_prompt_ids(steps: int) -> list[str]:
    """The prompt ids in the order a checkpoint's sorted values hold them (never modified)."""
    return sorted(_prompt_ids(steps))


@functools.lru_cache(maxsize=4)
def _step_ids(steps: int) -> frozenset[str]:
    return frozenset(map(step_id, range(steps)))


@functools.lru_cache(maxsize=4)
def _node_ids(steps: int) -> frozenset[str]:
    return frozenset(node["id"] for node in _expected_graph(steps))


def _check_kv(kv: dict[str, bytes], values: dict[str, Any], backend: str, what: str) -> None:
    """KV entries belong to executed steps; on the fake and text backends they are whole cache entries."""
    fixed = backend in KV_ENTRY_BACKENDS
    if (kv.keys() <= values.keys() and all(map(str.startswith, kv, itertools.repeat("step-")))
            and (not fixed or not any(n % FakeBackend.ENTRY_BYTES for n in {*map(len, kv.values())}))):
        return  # checked in C (values' keys are node ids, so str); the loop below names what is wrong
    for key, blob in kv.items():
        if not key.startswith("step-") or key not in values:
            corrupt(what, f"it has a KV entry for {short(key)}, which is no executed step")
        if fixed and len(blob) % FakeBackend.ENTRY_BYTES:
            corrupt(what, f"its KV entry for {key} is not a whole number of cache entries")


def _node_index(node_id: Any, steps: int) -> tuple[str, int] | None:
    """``("prompt", i)`` / ``("step", i)`` for a node id of a ``steps``-step graph, else None."""
    if not isinstance(node_id, str):
        return None
    kind, _, number = node_id.partition("-")
    if kind not in ("prompt", "step") or not number.isdigit() or not number.isascii() or number != str(int(number)):
        return None
    index = int(number)
    return (kind, index) if index < steps else None


def _known_nodes(steps: int) -> str:
    """A short description of a graph's node ids (not thousands of them)."""
    if steps == 1:
        return "prompt-0 and step-0"
    return f"prompt-0 ... prompt-{steps - 1} and step-0 ... step-{steps - 1}"


def _check_json_value(node_id: str, value: Any) -> None:
    """A fork value must be JSON a checkpoint can hold (and read back): SerializationError otherwise."""
    try:
        fmt.canonical_json(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise SerializationError(f"the value for {node_id} is not JSON ({type(exc).__name__}); "
                                 "pass a str, number, bool, None, list or dict", node_id=node_id) from None
    if fmt.too_deep(value):
        raise SerializationError(f"the value for {node_id} nests more than {fmt.MAX_JSON_DEPTH} levels deep; "
                                 "pass a flatter value", node_id=node_id)


def _objects(store: Any) -> Any:
    """Accept a checkpoint store (object face) or a full Store (use its object face)."""
    return getattr(store, "objects", store) if not hasattr(store, "put_if_absent") else store


def _key(key: str | None) -> str:
    if not key:
        raise UsageError("a store needs a key= to put or get the checkpoint under, e.g. key='run-1/step-2'")
    return key
