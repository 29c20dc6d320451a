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
checkpoint id, SHA-256 of the whole blob, is stable. ``Sections`` holds a checkpoint as its
already-encoded pieces, so an edit (a fork, a new step) costs the size of the change and the id
is one SHA-256 pass over the pieces (the digest and the id share it). ``decode`` checks magic, version, lengths
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
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import accumulate, chain, compress, repeat
from json.encoder import encode_basestring  # the C escaper canonical JSON uses
from typing import Any, NoReturn, cast

from ..errors import CheckpointCorruptionError, CheckpointFormatError
from ..journal import DIGITS_AS_ZERO, ORJSON_LOADS, canonical

_fast_loads: Callable[[bytes], Any] | None = ORJSON_LOADS  # a header parsed in C where it reads as json.loads does

MAGIC = b"CVSRCKPT"
FORMAT_VERSION = 1
FULL, DELTA = 0, 1
_PREFIX = struct.Struct("<8sHHI")
HEADER_AT = _PREFIX.size  # the header's offset in a checkpoint
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
    return Sections(data).to_bytes()


# ---- already-encoded sections -------------------------------------------------------------------
# A shared, never-modified header field (a DurableAgent graph: most of a header's bytes) is encoded
# once per process; the entry keeps the object alive, so its id() cannot be reused while listed.
_ENCODED: OrderedDict[int, tuple[Any, bytes]] = OrderedDict()
Known = Callable[[bytes], Iterable[tuple[str, bytes, Any, int]]]


def remember_encoding(value: Any, encoded: bytes) -> None:
    """Splice ``encoded`` (``value``'s canonical JSON) wherever this very object is a header field.

    The caller promises ``value`` is never modified (a few are kept; the oldest is forgotten)."""
    _ENCODED[id(value)] = (value, encoded)
    while len(_ENCODED) > 8:
        _ENCODED.popitem(last=False)


def _field_json(value: Any) -> bytes:
    hit = _ENCODED.get(id(value))
    return hit[1] if hit is not None and hit[0] is value else canonical_json(value)


def _item(key: str, value: Any, _int: set = {int}) -> bytes:  # noqa: B006 - a constant, never changed
    """``"key":value`` as canonical JSON writes it inside an object, without its first ``"`` (items are
    joined by ``,"``: the text cut at that separator), with fast paths for a str and a token list."""
    kind = type(value)
    if kind is str:
        return f"{encode_basestring(key)[1:]}:{encode_basestring(value)}".encode()
    if kind is list and {*map(type, value)} <= _int:
        return f"{encode_basestring(key)[1:]}:[{','.join(map(str, value))}]".encode()
    return canonical_json(key)[1:] + b":" + canonical_json(value)


def _kv_entry(key: str, blob: bytes) -> bytes:
    """``[key,length]`` of the KV index without its brackets (entries are joined by ``],[``)."""
    return f"{encode_basestring(key)},{len(blob)}".encode()


def _joined(items: list[bytes], opening: bytes, separator: bytes, closing: bytes, empty: bytes) -> bytes:
    return opening + separator.join(items) + closing if items else empty


class Sections:
    """A checkpoint held as its encoded pieces: edited in O(size of the change), hashed in one pass.

    The header's canonical JSON is ``{`` + its sorted top-level fields + ``}``. The ``values``
    object and the ``kv_index`` are kept as one encoded item per key, in sorted key lists (an edit
    is a bisect and a splice), other fields as their canonical JSON (shared by every edit, and a
    field given to ``remember_encoding`` is never encoded again). ``to_bytes()`` is exactly what
    ``encode`` gives for ``data``; ``identify()`` returns the id and size without building them.
    Pieces are built lazily and never change: ``data`` must not be modified.
    """

    __slots__ = ("data", "_fields", "_values", "_kv", "_head", "_digest", "_text", "_decoded")

    def __init__(self, data: CheckpointData, text: bytes | None = None) -> None:
        """``text``: the header bytes ``data`` was decoded from (its pieces are then cut from them, not
        encoded again: these sections are those bytes, canonical or not)."""
        self.data = data
        self._fields: dict[str, bytes] | None = None  # top-level field -> its JSON (not values, kv_index)
        self._values: tuple[list[str], list[bytes]] | None = None  # sorted keys, their "key":value items
        self._kv: tuple[list[str], list[bytes], list[bytes]] | None = None  # sorted keys, index entries, blobs
        self._head: bytes | list[bytes] | None = text  # joined, or still in parts
        self._digest: bytes | None = None
        self._text = text  # until cut
        self._decoded = text is not None  # the head is that text: the KV blobs follow it in the data's order

    def _value_items(self) -> tuple[list[str], list[bytes]] | None:
        if self._values is None and not self._cut():
            values = self.data.header.get("values")
            if not (isinstance(values, dict) and all(type(k) is str for k in values)):
                return None  # not a values object: encoded as a plain field
            keys = sorted(values)
            self._values = keys, [_item(k, values[k]) for k in keys]
        return self._values

    def keys_from(self, prefix: str) -> list[str] | None:
        """The ``values`` keys that start with ``prefix`` (a bisect: O(log n + found)), if the items are built."""
        if self._values is None and not self._cut():
            return None
        assert self._values is not None
        keys = self._values[0]
        start = bisect_left(keys, prefix)
        end = bisect_left(keys, prefix[:-1] + chr(ord(prefix[-1]) + 1), start) if prefix else len(keys)
        return keys[start:end]

    def _kv_items(self) -> tuple[list[str], list[bytes], list[bytes]]:
        if self._kv is None and not self._cut():
            kv = self.data.kv
            keys = sorted(kv)
            self._kv = keys, [_kv_entry(k, kv[k]) for k in keys], [kv[k] for k in keys]
        assert self._kv is not None
        return self._kv

    def _cut(self) -> bool:
        """Cut the value items and KV index entries out of the decoded header text instead of encoding
        them again (a fresh load: thousands of them); False, nothing set, where the text is not laid
        out as ``_head_parts`` writes it (then they are encoded).

        Every field but ``kv_index`` and ``values`` must be the bytes ``_head_parts`` writes, ``values``
        the last one, keys in sorted order (``kv_index`` ends where the next field's label starts: a
        list of ``[str, int]`` pairs holds no ``":``), and the cut must give exactly one piece per
        entry. With no space before any ``"`` and no tab or line break (a string holds neither bare,
        nor a bare ``"``: only a string ending in a space is refused with them), every member
        boundary of ``values`` is a bare ``,"``, so anything else (a string ending in a comma, a nested
        object, a field after ``values``) only adds pieces: equal counts mean each piece is its
        key's member. The pieces are the text as it is: a checkpoint the log committed is canonical,
        so they are what encoding gives; spacing that could end up inside the KV index is refused.
        """
        text, header, kv = self._text, self.data.header, self.data.kv
        self._text = None  # tried once
        values = header.get("values")
        keys = sorted({*header, "kv_index"})
        if (text is None or type(values) is not dict or keys[-1] != "values"
                or not text.startswith(b"{") or not text.endswith(b"}")):
            return False
        at, kv_text = 1, b""
        for i, key in enumerate(keys[:-1]):
            label = (b"," if i else b"") + canonical_json(key) + b":"
            if not text.startswith(label, at):
                return False
            at += len(label)
            if key == "kv_index":
                end = text.find(b"," + canonical_json(keys[i + 1]) + b":", at)
                if end < 0:
                    return False
                kv_text, at = text[at:end], end
            else:
                encoded = _field_json(header[key])
                if not text.startswith(encoded, at):
                    return False
                at += len(encoded)
        if not text.startswith(b',"values":', at):
            return False
        values_text = text[at + len(b',"values":'):-1]
        value_keys, kv_keys = list(values), list(kv)
        if (values_text[:2] != (b'{"' if values else b"{}") or values_text[-1:] != b"}"
                or value_keys != sorted(value_keys) or kv_keys != sorted(kv_keys)
                or not (kv_text.startswith(b"[[") and kv_text.endswith(b"]]") if kv else kv_text == b"[]")
                or any(space in kv_text for space in _SPACES) or b'":' in kv_text  # one list of pairs, unspaced
                or b' "' in values_text or any(space in values_text for space in _SPACES[1:])):  # bare ',"' only
            return False
        items = values_text[2:-1].split(b',"') if values else []
        entries = kv_text[2:-2].split(b"],[") if kv else []
        if len(items) != len(values) or len(entries) != len(kv):
            return False
        self._values = value_keys, items
        self._kv = kv_keys, entries, list(kv.values())
        return True

    def head(self) -> bytes:
        """The header's canonical JSON (with its kv_index)."""
        if not isinstance(self._head, bytes):
            self._head = b"".join(self._head_parts())
        return self._head

    def _head_parts(self) -> list[bytes]:
        """The header's canonical JSON in pieces (hashed as they are: the big graph is not copied)."""
        if self._head is None:
            header = self.data.header
            if not all(type(k) is str for k in header):
                self._head = canonical_json({**header, "kv_index": self._kv_index()})
                return [self._head]
            if self._fields is None:
                self._fields = {k: _field_json(v) for k, v in header.items() if k not in ("values", "kv_index")}
            items = self._values  # per-item once an edit needs them; before that, one C encode of the object
            if items is None and not isinstance(header.get("values"), dict):
                items = self._value_items()
            parts = [b"{"]
            for key in sorted({*header, "kv_index"}):
                if len(parts) > 1:
                    parts.append(b",")
                parts.append(canonical_json(key) + b":")
                if key == "kv_index":
                    parts.append(_joined(self._kv_items()[1], b"[[", b"],[", b"]]", b"[]"))
                elif key == "values" and items is not None:
                    parts.append(_joined(items[1], b'{"', b',"', b"}", b"{}"))
                elif key == "values":
                    parts.append(canonical_json(header[key]))
                else:
                    parts.append(self._fields[key] if key in self._fields else canonical_json(header[key]))
            parts.append(b"}")
            self._head = parts
        return [self._head] if isinstance(self._head, bytes) else self._head

    def _kv_index(self) -> list[list[Any]]:
        return [[k, len(self.data.kv[k])] for k in sorted(self.data.kv)]

    def _pieces(self) -> list[bytes]:
        head = self._head_parts()
        blobs = list(self.data.kv.values()) if self._decoded else self._kv_items()[2]
        return [_PREFIX.pack(MAGIC, FORMAT_VERSION, self.data.kind, sum(map(len, head))), *head, *blobs]

    def identify(self) -> tuple[str, int]:
        """``(checkpoint id, size in bytes)`` from one SHA-256 pass over the pieces (the digest is its midpoint)."""
        pieces = self._pieces()
        hasher = hashlib.sha256()
        for piece in pieces:
            hasher.update(piece)
        whole = hasher.copy()
        self._digest = hasher.digest()
        whole.update(self._digest)
        return whole.hexdigest(), sum(map(len, pieces)) + DIGEST_BYTES

    def to_bytes(self) -> bytes:
        if self._digest is None:
            self.identify()
        assert self._digest is not None
        return b"".join([*self._pieces(), self._digest])

    def edit(self, values_set: Mapping[str, Any] | None = None, values_removed: Iterable[str] = (),
             kv_set: Mapping[str, bytes] | None = None, kv_removed: Iterable[str] = ()) -> Sections:
        """A new checkpoint: these values and KV entries removed, then these set; only they are encoded.

        The caller checks the values first (JSON; ``_item`` raises on anything else)."""
        values_set, kv_set = values_set or {}, kv_set or {}
        items, kv_columns = self._value_items(), self._kv_items()
        if items is None:
            raise TypeError("Sections.edit needs a header with a values object")
        header = dict(self.data.header)
        values = dict(header["values"])
        kv = dict(self.data.kv)
        gone = [k for k in dict.fromkeys(values_removed) if k in values and k not in values_set]
        kv_gone = [k for k in dict.fromkeys(kv_removed) if k in kv and k not in kv_set]
        for key in gone:
            del values[key]
        values.update(values_set)
        for key in kv_gone:
            del kv[key]
        kv.update(kv_set)
        header["values"] = values
        new = Sections(CheckpointData(header, kv, self.data.kind))
        new._fields = self._fields
        new._values = cast("tuple[list[str], list[bytes]]",
                           _splice(items, gone, {k: _item(k, v) for k, v in values_set.items()}))
        if kv_gone or kv_set:
            new._kv = cast("tuple[list[str], list[bytes], list[bytes]]",
                           _splice(kv_columns, kv_gone, {k: (_kv_entry(k, b), b) for k, b in kv_set.items()}))
        else:
            new._kv = kv_columns  # shared: pieces are never changed in place (``_splice`` copies)
        return new


def _splice(columns: tuple[list[Any], ...], removed: list[str], added: Mapping[str, Any]) -> tuple[list[Any], ...]:
    """Copies of sorted, parallel ``columns`` (keys first) without ``removed``, with ``added`` (key -> the
    other columns' entries, one value for a single other column) put in key order."""
    if len(removed) > 64:  # many: one filtering pass instead of a splice per key
        drop = set(removed)
        keep = [i for i, k in enumerate(columns[0]) if k not in drop]
        out = tuple([column[i] for i in keep] for column in columns)
    else:
        out = tuple(list(column) for column in columns)
        keys = out[0]
        for key in removed:
            at = bisect_left(keys, key)
            if at < len(keys) and keys[at] == key:
                for column in out:
                    del column[at]
    keys = out[0]
    for key, entry in added.items():
        entries = entry if len(out) > 2 else (entry,)
        at = bisect_left(keys, key)
        if at < len(keys) and keys[at] == key:
            for column, value in zip(out[1:], entries, strict=True):
                column[at] = value
        else:
            keys.insert(at, key)
            for column, value in zip(out[1:], entries, strict=True):
                column.insert(at, value)
    return out


def corrupt(what: str, problem: str, *, fix: str = "use another copy or an earlier checkpoint",
            **fields: Any) -> NoReturn:
    """Raise the one-line CheckpointCorruptionError every validator uses: what is wrong, and what to do."""
    raise CheckpointCorruptionError(f"{what} is damaged: {problem}; {fix}", what=what, **fields)


def decode(blob: bytes, *, what: str = "checkpoint", known: Known | None = None) -> CheckpointData:
    """Parse and verify ``blob``; CheckpointFormatError or CheckpointCorruptionError on bad bytes.

    ``known(header bytes)`` may name header fields whose encoding the caller already has (see
    ``_parse_header``): they are compared byte for byte instead of parsed.
    """
    return decode_identified(blob, what=what, known=known)[0]


def decode_identified(blob: bytes, *, what: str = "checkpoint",
                      known: Known | None = None) -> tuple[CheckpointData, str]:
    """``decode`` and the checkpoint id of ``blob``: its digest check and its id are one SHA-256 pass."""
    sections, cid = decode_sections(blob, what=what, known=known)
    assert cid is not None
    return sections.data, cid


def decode_sections(blob: bytes, *, what: str = "checkpoint", known: Known | None = None,
                    verify: bool = True) -> tuple[Sections, str | None]:
    """``blob`` decoded as ``Sections`` (its pieces cut from its bytes when an edit needs them) and its id.

    ``verify=False`` skips the SHA-256 pass (no digest check, no id): only for bytes whose result the
    caller verifies against an id anyway (a delta chain rebuilt and hashed once at its end). Every
    structural check still runs, so unverified bytes are never trusted further than a parse.
    """
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise CheckpointFormatError(f"{what} must be bytes, got {type(blob).__name__}")
    blob = bytes(blob)
    if len(blob) < _PREFIX.size + DIGEST_BYTES or blob[:8] != MAGIC:
        raise CheckpointFormatError(f"{what} is not a caravanserai checkpoint (bad magic); "
                                    "pass the bytes run_until_step returned")
    end = len(blob) - DIGEST_BYTES
    cid = None
    if verify:
        hasher = hashlib.sha256(memoryview(blob)[:end])
        whole = hasher.copy()
        whole.update(memoryview(blob)[end:])
        if hasher.digest() != blob[end:]:  # before reading any field: a flipped byte is damage, not a version
            raise CheckpointCorruptionError(f"{what} is damaged: its SHA-256 digest does not match its bytes", what=what)
        cid = whole.hexdigest()
    _, version, kind, hlen = _PREFIX.unpack_from(blob)
    if version > FORMAT_VERSION:
        raise CheckpointFormatError(f"{what} uses checkpoint format v{version}, "
                                    f"newer than this caravanserai (v{FORMAT_VERSION}): upgrade")
    if version < 1:
        corrupt(what, f"format version {version} does not exist")
    if kind not in (FULL, DELTA):
        corrupt(what, f"unknown kind {kind} (0 = full, 1 = delta)")
    start = _PREFIX.size
    if hlen > end - start:  # bound the header before reading it
        corrupt(what, f"its header length {hlen} runs past the end of the data ({end - start} bytes)")
    text = blob[start:start + hlen]
    header = _parse_header(text, what, known)
    kv = _split_kv(header.pop("kv_index"), blob, start + hlen, end, what)
    return Sections(CheckpointData(header, kv, kind), text), cid


def _parse_header(raw: bytes, what: str, known: Known | None = None) -> dict[str, Any]:
    """The header as a dict: strict UTF-8 JSON, no NaN/Infinity, an object, bounded nesting, with a kv_index.

    The nesting is bounded on the text before parsing (so parsing never recurses deep), and the
    write-back check (no lone surrogate, no 1e400) runs only when the text holds what could make one.

    A field ``known`` offers as ``(name, canonical JSON, value, nesting)`` (a DurableAgent graph:
    most of the bytes) is found in the text, compared byte for byte and swapped for an integer
    the text does not hold; the rest is parsed. It is taken only if that integer comes back as the
    top-level field, so the text says exactly what a full parse would (anything else: a full parse).
    """
    for name, encoded, value, depth in known(raw) if known is not None else ():
        header = _parse_without(raw, what, name, encoded, depth)
        if header is not None:
            header[name] = value
            return header
    return _parse_text(raw, what)


def _parse_without(raw: bytes, what: str, name: str, encoded: bytes, depth: int) -> dict[str, Any] | None:
    label = canonical_json(name) + b":"
    at = raw.find(label)
    for _ in range(8):  # a few false starts (the label inside a string), then give up: a full parse
        if at < 0:
            return None
        if raw.startswith(encoded, at + len(label)):
            break
        at = raw.find(label, at + 1)
    else:
        return None
    marker = next((m for m in (b"%d" % (10**18 + i) for i in range(4)) if m not in raw), None)  # exact in orjson too
    if marker is None:
        return None
    after = at + len(label) + len(encoded)
    try:
        header = _parse_text(raw[:at] + label + marker + raw[after:], what, extra_depth=depth)
    except CheckpointCorruptionError:
        return None  # the full parse names the problem
    return header if type(header.get(name)) is int and header[name] == int(marker) else None


def _parse_text(raw: bytes, what: str, extra_depth: int = 0) -> dict[str, Any]:
    header = _parse_fast(raw) if extra_depth <= MAX_JSON_DEPTH else None
    if header is not None:  # strict JSON, UTF-8, no surrogate, no infinity, an object: the rest is checked here
        # kv_index, thousands of entries at a late step, is bounded by ``_split_kv``: [str, int] pairs only
        if too_deep({**header, "kv_index": None}, MAX_JSON_DEPTH + 1):
            corrupt(what, f"its header nests more than {MAX_JSON_DEPTH} levels deep")
        if "kv_index" not in header:
            corrupt(what, "its header has no kv_index")
        return header
    bare = _STRINGS.sub(b'""', raw)  # the JSON text with every string emptied: brackets and numbers only
    if max(_nesting(bare), extra_depth) > MAX_JSON_DEPTH:
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


def _parse_fast(raw: bytes) -> dict[str, Any] | None:
    """The header by orjson when that is exactly what ``json.loads`` gives and the checks below would
    pass; None sends it to them (they name the problem). orjson refuses what they refuse (invalid
    UTF-8, lone surrogates, NaN, numbers that parse to infinity, nesting past 1024) but turns integers
    beyond 64 bits into floats: text that could hold one (20 digits in a row, or a minus and 19) is
    left to ``json.loads``."""
    if _fast_loads is None:
        return None
    digits = raw.translate(DIGITS_AS_ZERO)
    if _TWENTY_DIGITS in digits or _MINUS_NINETEEN in digits:
        return None
    try:
        header = _fast_loads(raw)
    except ValueError:
        return None
    return header if type(header) is dict else None


_TWENTY_DIGITS, _MINUS_NINETEEN = b"0" * 20, b"-" + b"0" * 19
_SPACES = (b" ", b"\t", b"\n", b"\r")  # the whitespace JSON allows between tokens
_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_INNERMOST = re.compile(rb"\[[^\[\]{}]*\]|\{[^\[\]{}]*\}")  # a container with no container inside
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # the only way JSON text can hold a surrogate
_HUGE_NUMBER = re.compile(rb"[eE][+]?\d{3}|\d{300}")  # the only numbers that can parse to inf


def _nesting(bare: bytes) -> int:
    """How deep containers nest in JSON text whose strings were emptied (the top-level object is 1, so
    ``{}`` is 0); exact for valid JSON, found by emptying innermost containers (a pass per level, in C)."""
    level = 0
    while level <= MAX_JSON_DEPTH + 1:
        bare, found = _INNERMOST.subn(b"0", bare)
        if not found:
            break
        level += 1
    return max(level - 1, 0)


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _split_kv(index: Any, blob: bytes, offset: int, end: int, what: str) -> dict[str, bytes]:
    """KV entries from ``kv_index``: ``[str, int >= 0]`` pairs, unique keys, lengths that fill ``blob[offset:end]``.

    Checked column by column in C first (thousands of entries at a late step); the loop below runs
    only to name what is wrong."""
    if not isinstance(index, list):
        corrupt(what, f"its kv_index is a JSON {_json_type(index)}, not a list")
    if index and {*map(type, index)} == {list} and {*map(len, index)} == {2}:
        keys, lengths = zip(*index, strict=True)
        if ({*map(type, keys)} == {str} and {*map(type, lengths)} == {int} and min(lengths) >= 0
                and sum(lengths) == end - offset):
            bounds = [*accumulate(lengths, initial=offset)]
            split = dict(zip(keys, map(blob.__getitem__, map(slice, bounds, bounds[1:])), strict=True))
            if len(split) == len(keys):  # else a key twice: named below
                return split
    kv: dict[str, bytes] = {}
    remaining = end - offset
    for entry in index:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) and is_count(entry[1])):
            corrupt(what, "its kv_index has an entry that is not a [node id, byte length] pair")
        key, length = entry
        if key in kv:
            corrupt(what, f"its kv_index names {short(key)} twice")
        if length > remaining:
            corrupt(what, f"its kv_index claims more bytes than the checkpoint holds ({short(key)})")
        kv[key] = blob[offset:offset + length]
        offset += length
        remaining -= length
    if remaining:
        corrupt(what, f"it has {remaining} unexpected trailing bytes")
    return kv


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether a JSON value nests more than ``limit`` levels (iterative: safe on any depth).

    Level by level in C: the types of all of a level's children first (the last level, thousands
    of token lists, ends there), then its containers (``compress`` over ``map(isinstance, ...)``):
    a header of 20,000 values or KV index entries costs milliseconds, not a Python step per container."""
    level = [value] if isinstance(value, _NESTING) else []
    depth = 0
    while level:
        if depth >= limit:
            return True
        has_dicts = any(issubclass(kind, dict) for kind in {*map(type, level)})
        rows = [item.values() if isinstance(item, dict) else item for item in level] if has_dicts else level
        if not any(issubclass(kind, _NESTING) for kind in {*map(type, chain.from_iterable(rows))}):
            return False
        level = [*compress(chain.from_iterable(rows), map(isinstance, chain.from_iterable(rows), repeat(_NESTING)))]
        depth += 1
    return False


_NESTING = (dict, list)


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
