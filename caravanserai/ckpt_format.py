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
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from typing import Any

from .errors import CheckpointCorruptionError, CheckpointFormatError

MAGIC = b"CVSRCKPT"
FORMAT_VERSION = 1
FULL, DELTA = 0, 1
_PREFIX = struct.Struct("<8sHHI")
DIGEST_BYTES = 32


@dataclass
class CheckpointData:
    """A decoded checkpoint: JSON header fields plus KV entries (node id -> bytes)."""

    header: dict[str, Any]
    kv: dict[str, bytes] = field(default_factory=dict)
    kind: int = FULL


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def encode(data: CheckpointData) -> bytes:
    """Deterministic bytes for ``data`` (KV entries in sorted key order)."""
    keys = sorted(data.kv)
    header = dict(data.header)
    header["kv_index"] = [[key, len(data.kv[key])] for key in keys]
    head = canonical_json(header)
    body = _PREFIX.pack(MAGIC, FORMAT_VERSION, data.kind, len(head)) + head + b"".join(data.kv[k] for k in keys)
    return body + hashlib.sha256(body).digest()


def decode(blob: bytes, *, what: str = "checkpoint") -> CheckpointData:
    """Parse and verify ``blob``; CheckpointFormatError or CheckpointCorruptionError on bad bytes."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise CheckpointFormatError(f"{what} must be bytes, got {type(blob).__name__}")
    blob = bytes(blob)
    if len(blob) < _PREFIX.size + DIGEST_BYTES or blob[:8] != MAGIC:
        raise CheckpointFormatError(f"{what} is not a caravanserai checkpoint (bad magic); pass the bytes run_until_step returned")
    body, digest = blob[:-DIGEST_BYTES], blob[-DIGEST_BYTES:]
    if hashlib.sha256(body).digest() != digest:  # before reading any field: a flipped byte is damage, not a version
        raise CheckpointCorruptionError(f"{what} is damaged: its SHA-256 digest does not match its bytes", what=what)
    _, version, kind, hlen = _PREFIX.unpack_from(blob)
    if version > FORMAT_VERSION:
        raise CheckpointFormatError(f"{what} uses checkpoint format v{version}, newer than this caravanserai (v{FORMAT_VERSION}): upgrade")
    start = _PREFIX.size
    try:
        header = json.loads(body[start:start + hlen])
    except ValueError:
        raise CheckpointCorruptionError(f"{what} has an unreadable header", what=what) from None
    kv: dict[str, bytes] = {}
    offset = start + hlen
    for key, length in header.pop("kv_index", []):
        kv[key] = body[offset:offset + length]
        offset += length
    if offset != len(body):
        raise CheckpointCorruptionError(f"{what} has {len(body) - offset} unexpected trailing bytes", what=what)
    return CheckpointData(header, kv, kind)


def checkpoint_id(blob: bytes) -> str:
    """A checkpoint's id: SHA-256 hex of its full bytes."""
    return hashlib.sha256(blob).hexdigest()
