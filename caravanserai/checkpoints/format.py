"""The DurableAgent checkpoint format: one self-contained, deterministic ``bytes`` blob.

Layout (all integers little-endian; see ``docs/checkpoint-format.md``)::

    magic    8 bytes   b"CVSRCKPT"
    version  u16       FORMAT_VERSION (1)
    kind     u16       0 = full checkpoint, 1 = delta (CheckpointLog objects)
    hlen     u32       length of the header
    header   hlen      canonical JSON (UTF-8, sorted keys, no spaces): graph, values, KV index
    blobs    ...       the KV entries' bytes, concatenated in the header's index order
    digest   32 bytes  SHA-256 of everything before it

The same run always produces the same bytes (canonical JSON, sorted keys, no clocks), so the
checkpoint id, SHA-256 of the whole blob, is stable. ``decode`` checks magic, version, lengths
and digest and raises ``CheckpointFormatError`` / ``CheckpointCorruptionError``; no pickle.

Everything ``decode`` reads from the bytes is checked before it is used: the header must be a
JSON object of bounded nesting, ``kv_index`` a list of ``[str, int >= 0]`` pairs that account for
exactly the bytes present. A checkpoint is a trust boundary (it may come from a shared store or
a file someone edited), so malformed data is ``CheckpointCorruptionError``, never a crash.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from ..errors import CheckpointCorruptionError, CheckpointFormatError
from ..journal import canonical

MAGIC = b"CVSRCKPT"
FORMAT_VERSION = 1
FULL, DELTA = 0, 1
_PREFIX = struct.Struct("<8sHHI")
DIGEST_BYTES = 32
MAX_JSON_DEPTH = 64  # nesting allowed inside a header value: far above any real value, far below the recursion limit


@dataclass
class CheckpointData:
    """A decoded checkpoint: JSON header fields plus KV entries (node id -> bytes)."""

    header: dict[str, Any]
    kv: dict[str, bytes] = field(default_factory=dict)
    kind: int = FULL


def canonical_json(value: Any) -> bytes:
    """The header's bytes: canonical JSON, strict (no NaN, nothing but JSON), UTF-8."""
    return canonical(value, default=None).encode("utf-8")


def encode(data: CheckpointData) -> bytes:
    """Deterministic bytes for ``data`` (KV entries in sorted key order)."""
    keys = sorted(data.kv)
    header = dict(data.header)
    header["kv_index"] = [[key, len(data.kv[key])] for key in keys]
    head = canonical_json(header)
    body = _PREFIX.pack(MAGIC, FORMAT_VERSION, data.kind, len(head)) + head + b"".join(data.kv[k] for k in keys)
    return body + hashlib.sha256(body).digest()


def corrupt(what: str, problem: str, *, fix: str = "use another copy or an earlier checkpoint",
            **fields: Any) -> NoReturn:
    """Raise the one-line CheckpointCorruptionError every validator uses: what is wrong, and what to do."""
    raise CheckpointCorruptionError(f"{what} is damaged: {problem}; {fix}", what=what, **fields)


def decode(blob: bytes, *, what: str = "checkpoint") -> CheckpointData:
    """Parse and verify ``blob``; CheckpointFormatError or CheckpointCorruptionError on bad bytes."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise CheckpointFormatError(f"{what} must be bytes, got {type(blob).__name__}")
    blob = bytes(blob)
    if len(blob) < _PREFIX.size + DIGEST_BYTES or blob[:8] != MAGIC:
        raise CheckpointFormatError(f"{what} is not a caravanserai checkpoint (bad magic); "
                                    "pass the bytes run_until_step returned")
    body, digest = blob[:-DIGEST_BYTES], blob[-DIGEST_BYTES:]
    if hashlib.sha256(body).digest() != digest:  # before reading any field: a flipped byte is damage, not a version
        raise CheckpointCorruptionError(f"{what} is damaged: its SHA-256 digest does not match its bytes", what=what)
    _, version, kind, hlen = _PREFIX.unpack_from(blob)
    if version > FORMAT_VERSION:
        raise CheckpointFormatError(f"{what} uses checkpoint format v{version}, "
                                    f"newer than this caravanserai (v{FORMAT_VERSION}): upgrade")
    if version < 1:
        corrupt(what, f"format version {version} does not exist")
    if kind not in (FULL, DELTA):
        corrupt(what, f"unknown kind {kind} (0 = full, 1 = delta)")
    start = _PREFIX.size
    if hlen > len(body) - start:  # bound the header before reading it
        corrupt(what, f"its header length {hlen} runs past the end of the data ({len(body) - start} bytes)")
    header = _parse_header(body[start:start + hlen], what)
    kv = _split_kv(header.pop("kv_index"), body, start + hlen, what)
    return CheckpointData(header, kv, kind)


def _parse_header(raw: bytes, what: str) -> dict[str, Any]:
    """The header as a dict: strict UTF-8 JSON, no NaN/Infinity, an object, bounded nesting, with a kv_index.

    The nesting is bounded on the text before parsing (so parsing never recurses deep), and the
    write-back check (no lone surrogate, no 1e400) runs only when the text holds what could make one.
    """
    bare = _STRINGS.sub(b'""', raw)  # the JSON text with every string emptied: brackets and numbers only
    if _nesting(bare) > MAX_JSON_DEPTH:
        corrupt(what, f"its header nests more than {MAX_JSON_DEPTH} levels deep")
    try:
        header = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        corrupt(what, f"its header is not valid JSON ({type(exc).__name__})")
    if not isinstance(header, dict):
        corrupt(what, f"its header is a JSON {_json_type(header)}, not an object")
    if _SURROGATE_ESCAPE.search(raw) or _HUGE_NUMBER.search(bare):
        try:  # what a reader reads, a writer must be able to write back: no lone surrogates, no 1e400 (inf)
            canonical_json(header)
        except (ValueError, RecursionError) as exc:
            corrupt(what, f"its header holds a value JSON cannot write back ({type(exc).__name__})")
    if "kv_index" not in header:
        corrupt(what, "its header has no kv_index")
    return header


_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(rb"[\[\]{}]")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # the only way JSON text can hold a surrogate
_HUGE_NUMBER = re.compile(rb"[eE][+]?\d{3,}|\d{300,}")  # the only numbers that can parse to inf


def _nesting(bare: bytes) -> int:
    """How deep containers nest in JSON text whose strings were emptied (the top-level object is 1)."""
    level = deepest = 0
    for mark in _BRACKETS.findall(bare):
        level += 1 if mark in (b"[", b"{") else -1
        deepest = max(deepest, level)
    return deepest - 1 if deepest else 0


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _split_kv(index: Any, body: bytes, offset: int, what: str) -> dict[str, bytes]:
    """KV entries from ``kv_index``: ``[str, int >= 0]`` pairs, unique keys, lengths that fill the body exactly."""
    if not isinstance(index, list):
        corrupt(what, f"its kv_index is a JSON {_json_type(index)}, not a list")
    kv: dict[str, bytes] = {}
    remaining = len(body) - offset
    for entry in index:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) and is_count(entry[1])):
            corrupt(what, "its kv_index has an entry that is not a [node id, byte length] pair")
        key, length = entry
        if key in kv:
            corrupt(what, f"its kv_index names {short(key)} twice")
        if length > remaining:
            corrupt(what, f"its kv_index claims more bytes than the checkpoint holds ({short(key)})")
        kv[key] = body[offset:offset + length]
        offset += length
        remaining -= length
    if remaining:
        corrupt(what, f"it has {remaining} unexpected trailing bytes")
    return kv


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether a JSON value nests more than ``limit`` levels (iterative: safe on any depth)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth >= limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def is_count(value: Any) -> bool:
    """A JSON integer >= 0 (bool is not a number here)."""
    return type(value) is int and value >= 0


def short(value: Any, width: int = 40) -> str:
    """``repr(value)`` cut to ``width`` characters: data in a message stays one short line."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def checkpoint_id(blob: bytes) -> str:
    """A checkpoint's id: SHA-256 hex of its full bytes."""
    return hashlib.sha256(blob).hexdigest()
