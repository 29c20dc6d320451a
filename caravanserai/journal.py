"""The journal format: one JSON object per line, numbered, timestamped and hash-chained.

Every event carries ``v`` (format version), ``seq`` (0, 1, 2... no gaps), ``at`` (UTC ISO-8601
with microseconds) and ``type``, then its own fields, then ``prev``: the first 32 hex digits of
the SHA-256 of the previous line (absent on ``seq`` 0). The chain makes a changed, dropped or
reordered line detectable, because a store is a trust boundary. Stores move whole lines; this
module is the only place that builds or checks them. See ``docs/journal-format.md``.

It is also the one JSON encoder of the package: ``dumps`` (compact, strict), ``canonical`` and
``digest`` (sorted keys, for digests), and ``to_json`` — state must be JSON, encoded strictly, with
an error that says exactly which value is not and what to do. Accepted: dict (str keys), list,
tuple (stored as a list), str, int, finite float, bool, None. Refused with ``SerializationError``
before anything is written: sets, bytes, objects, NaN/Infinity (0.2.0 wrote them as invalid
tokens), non-str keys (0.2.0 silently turned ``{1: "a"}`` into ``{"1": "a"}``), circular
references, text UTF-8 cannot hold.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from .errors import JournalCorruptionError, SerializationError, UndigestableValue

FORMAT_VERSION = 1
RESERVED_FIELDS = ("v", "seq", "at", "type", "prev", "sig")  # "sig": a signed journal's line signature, per line
_RESERVED = frozenset(RESERVED_FIELDS)


_SECOND: tuple[int, str] = (-1, "")  # (POSIX second, its "YYYY-MM-DDTHH:MM:SS"): formatted once a second


def utc_now() -> str:
    """The current UTC time as ISO-8601 with microseconds, e.g. ``2026-11-30T16:40:00.123456+00:00``."""
    global _SECOND
    second, nanos = divmod(time.time_ns(), 1_000_000_000)
    cached = _SECOND
    if cached[0] != second:  # the date part changes once a second: format it then (one tuple: thread-safe)
        cached = _SECOND = (second, datetime.fromtimestamp(second, timezone.utc).isoformat()[:19])
    return f"{cached[1]}.{str(nanos // 1000).zfill(6)}+00:00"  # floored to the microsecond, as datetime.now()


def _one_shot(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """``encoder.encode`` without its per-call Python wrappers: the same C encoder, the same text.

    ``JSONEncoder.encode`` rebuilds its C encoder through two Python frames on every call, which
    costs more than encoding a small event; a Python without the C encoder keeps ``encode``.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None or encoder.indent is not None or encoder.ensure_ascii:
        return encoder.encode
    options = (encoder.default, json.encoder.encode_basestring, None, encoder.key_separator,
               encoder.item_separator, encoder.sort_keys, encoder.skipkeys, encoder.allow_nan)
    circular = encoder.check_circular
    join = "".join

    def encode(value: Any) -> str:
        return join(make({} if circular else None, *options)(value, 0))

    try:
        sample = {"b": [1, 2.5, None, True, "\u00e9\n"], "a": {"x": "y"}}
        if encode(sample) == encoder.encode(sample):
            return encode
    except Exception:  # pragma: no cover - a json module whose C encoder takes other arguments
        pass
    return encoder.encode  # pragma: no cover


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_encode = _one_shot(_ENCODER)
_encode_str: Callable[[str], str] = json.encoder.encode_basestring


def dumps(value: Any) -> str:
    """Compact, strict (no NaN) JSON text: the one encoding used for journal lines."""
    return _encode(value)


_CANONICAL: dict[Any, Callable[[Any], str]] = {}


def canonical(value: Any, *, default: Callable[[Any], Any] | None = repr) -> str:
    """Canonical JSON (sorted keys, no spaces, UTF-8 text): the one form digests are taken of.

    ``default`` turns a non-JSON value into something JSON (``repr``, for size estimates only: ``digest``
    refuses non-JSON values); with ``default=None`` non-JSON values and NaN are refused (checkpoint headers).
    """
    encode = _CANONICAL.get(default)
    if encode is None:
        encode = _CANONICAL[default] = _one_shot(json.JSONEncoder(
            sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=default is not None, default=default))
    return encode(value)


def digest(value: Any) -> str:
    """SHA-256 hex of ``value``'s canonical JSON (request, definition and budget digests).

    A value JSON cannot hold is refused (``UndigestableValue``), never digested by its ``repr``: an
    SDK sentinel such as openai's ``omit`` has a memory address there, so no resume would match.
    """
    return hashlib.sha256(canonical(value, default=_undigestable).encode("utf-8")).hexdigest()


def _undigestable(value: Any) -> Any:
    raise UndigestableValue(
        f"cannot digest a {type(value).__module__}.{type(value).__qualname__} ({_short_repr(value)}): digests are taken "
        "over JSON only; pass plain JSON values (drop SDK sentinels such as openai.omit / NOT_GIVEN)",
        type=f"{type(value).__module__}.{type(value).__qualname__}")


def _short_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        text = "?"
    return text if len(text) <= 60 else text[:57] + "..."


def line_digest(line: str) -> str:
    return hashlib.sha256(line.encode("utf-8")).hexdigest()[:32]


class RawJSON:
    """A value already encoded as JSON text: spliced into the line, not encoded twice (big states)."""

    __slots__ = ("text", "value")

    def __init__(self, text: str, value: Any) -> None:
        self.text = text
        self.value = value


_KEY_TEXT: dict[str, str] = {}  # '"key":' for the field names events use


def _key_text(key: str) -> str:
    text = _encode_str(key) + ":"
    if len(_KEY_TEXT) < 4096:  # event field names are a small set; a stray caller cannot grow this without end
        _KEY_TEXT[key] = text
    return text


def _dumps_record(record: dict[str, Any]) -> str:
    """The line of ``record`` by the generic encoder (a record with a non-str key): its fields in
    order, ``RawJSON`` ones spliced in after the others, ``prev`` last."""
    raw = [key for key, value in record.items() if isinstance(value, RawJSON)]
    if not raw:
        return dumps(record)
    rest = {k: v for k, v in record.items() if k not in raw and k != "prev"}
    spliced = "".join(f",{dumps(key)}:{record[key].text}" for key in raw)
    tail = f',"prev":{dumps(record["prev"])}' if "prev" in record else ""
    return dumps(rest)[:-1] + spliced + tail + "}"


def plain(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with every ``RawJSON`` value replaced by the value it encodes."""
    out = None
    for key, value in record.items():
        if isinstance(value, RawJSON):
            if out is None:
                out = record.copy()
            out[key] = value.value
    return record if out is None else out


@dataclass
class Tail:
    """Where the next event goes: its ``seq`` and the digest of the line before it."""

    seq: int = 0
    prev: str | None = None


Signer = Callable[[bytes], str]


def encode(events: Iterable[Mapping[str, Any]], tail: Tail, *, at: str | None = None,
           sign: Signer | None = None) -> tuple[list[str], list[dict], Tail]:
    """Number, timestamp and chain ``events`` after ``tail``; return (lines, full events, new tail).

    Full events keep ``RawJSON`` values as given (``plain()`` unwraps them), so a consumer that
    wants the encoded text (the state.json view of a large state) need not encode again.

    ``tail`` is not modified: the caller adopts the new tail only once the store acknowledged
    the append, so a failed append leaves the writer where it was. ``sign`` (a signed journal, see
    ``signing.line_signer``) adds ``"sig"`` as each line's last field, over the line before it.
    """
    lines, full, _, new_tail = _encode_events(events, tail, at, None, sign)
    return lines, full, new_tail


def encode_stored(events: Iterable[Mapping[str, Any]], tail: Tail, *, at: str | None = None,
                  sign: Signer | None = None) -> tuple[list[str], list[dict], list[dict], Tail]:
    """``encode``, plus the events as a reader decodes them (``plain`` of each full event), made in
    the same pass: a writer's append needs both."""
    stored: list[dict] = []
    lines, full, _, new_tail = _encode_events(events, tail, at, stored, sign)
    return lines, full, stored, new_tail


def _encode_events(events: Iterable[Mapping[str, Any]], tail: Tail, at: str | None, stored: list[dict] | None,
                   sign: Signer | None = None) -> tuple[list[str], list[dict], list[dict] | None, Tail]:
    seq, prev = tail.seq, tail.prev
    lines: list[str] = []
    full: list[dict] = []
    stamp = at or utc_now()
    reserved, sha256, key_text, encode_str = _RESERVED, hashlib.sha256, _KEY_TEXT, _encode_str
    for event in events:
        etype = event.get("type")
        if not isinstance(etype, str) or not etype:
            raise ValueError(f"journal event needs a non-empty str 'type', got {event!r}")
        when = event.get("at", stamp)
        record: dict[str, Any] = {"v": FORMAT_VERSION, "seq": seq, "at": when, "type": etype}
        # The line is built with the record: the fields in order, RawJSON ones after the others, prev last.
        when_text = encode_str(when) if type(when) is str else dumps(when)
        parts: list[str] | None = [f'{{"v":{FORMAT_VERSION},"seq":{seq},"at":{when_text},"type":{encode_str(etype)}']
        raw: list[str] | None = None  # the keys of RawJSON values: spliced in after the other fields
        for key, value in event.items():
            if key in reserved:
                continue
            record[key] = value
            if type(key) is not str:
                parts = None  # JSON turns 1/True/None keys into strings: left to _dumps_record
            kind = type(value)
            if kind is RawJSON:
                (raw if raw is not None else (raw := [])).append(key)
                continue
            if parts is None:
                continue
            head = key_text.get(key) or _key_text(key)
            if kind is str:
                parts.append(head + encode_str(value))
            elif kind is int:
                parts.append(head + int.__repr__(value))
            else:
                parts.append(head + dumps(value))
        if prev is not None:
            record["prev"] = prev
        if parts is None:
            line = _dumps_record(record)
        else:
            if raw:
                for key in raw:
                    parts.append((key_text.get(key) or _key_text(key)) + record[key].text)
            if prev is not None:
                parts.append('"prev":' + (encode_str(prev) if type(prev) is str else dumps(prev)))
            line = ",".join(parts) + "}"
        if not line.isascii():
            check_text(line, f"the {etype} event")
        if sign is not None:
            record["sig"] = sign(line.encode("utf-8"))
            line = f'{line[:-1]},"sig":"{record["sig"]}"}}'
        lines.append(line)
        full.append(record)
        if stored is not None:
            if raw:
                unwrapped = record.copy()
                for key in raw:
                    unwrapped[key] = record[key].value
                stored.append(unwrapped)
            else:
                stored.append(record)
        prev = sha256(line.encode("utf-8")).hexdigest()[:32]  # line_digest, inlined: once per event
        seq += 1
    return lines, full, stored, Tail(seq, prev)


def check_text(text: str, what: str) -> None:
    """Refuse text UTF-8 cannot hold (a lone surrogate such as '\\ud800') before anything is written."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start:exc.end].encode("unicode_escape").decode("ascii")
        raise SerializationError(
            f"{what} holds text with {bad!r} (a lone surrogate), which UTF-8 cannot store; clean the string "
            "(e.g. text.encode('utf-8', 'replace').decode()) - nothing was written", path=what,
        ) from None


ORJSON_LOADS: Callable[[bytes], Any] | None  # the one import of orjson's parser (None without it)
try:  # orjson parses ~2x faster; the journal is strict JSON, so both parsers agree
    from orjson import loads as ORJSON_LOADS
except ImportError:  # pragma: no cover - orjson is a core dependency, optional at import time
    ORJSON_LOADS = None
_fast_loads: Callable[[bytes], Any] = ORJSON_LOADS or json.loads


DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")  # bytes.translate: every digit a 0, to find long runs
_LONG_RUN = b"0" * 19  # 19 digits in a row: maybe an integer beyond 64 bits


def loads(data: bytes, text: str | None = None) -> Any:
    """Strict JSON of the UTF-8 ``data`` (``text``: the same as str, when the caller has it): orjson where
    it is exact, the standard parser for integers beyond 64 bits (orjson makes them floats) and NaN tokens."""
    # bytes.translate: ~8x quicker than str.translate and ~7x than a regex search on a journal line
    if _LONG_RUN in data.translate(DIGITS_AS_ZERO):
        return json.loads(data if text is None else text)
    try:
        return _fast_loads(data)
    except ValueError:
        return json.loads(data if text is None else text)  # NaN tokens kept verbatim from 0.2.0 states; a real error re-raises


def decode(run_id: str, lines: Sequence[str], *, start: int = 0, tail: Tail | None = None) -> tuple[list[dict], Tail]:
    """Parse and verify journal lines; raise JournalCorruptionError naming the first bad line.

    ``start``/``tail`` let a caller verify only new lines after an already-verified prefix.
    """
    events: list[dict] = []
    append = events.append
    tail = tail or Tail()
    seq, prev = tail.seq, tail.prev
    sha256, fast_loads, digits_as_zero, long_run = hashlib.sha256, _fast_loads, DIGITS_AS_ZERO, _LONG_RUN
    for index, line in enumerate(lines, start=start):
        try:
            data = line.encode("utf-8")
            if long_run in data.translate(digits_as_zero):  # loads, inlined: once per line of every read
                record = loads(data, line)
            else:
                try:
                    record = fast_loads(data)
                except ValueError:
                    record = json.loads(line)  # NaN tokens kept verbatim from 0.2.0 states; a real error re-raises
        except (ValueError, TypeError, AttributeError) as exc:  # a lone surrogate: UnicodeEncodeError, a ValueError
            raise _corrupt(run_id, index,
                           f"journal of run {run_id!r}, line {index + 1} is not JSON ({exc.__class__.__name__})") from None
        if not (type(record) is dict and record.get("seq") == seq and record.get("prev") == prev
                and type(record.get("v")) is int and record["v"] <= FORMAT_VERSION and type(record.get("type")) is str):
            _explain_bad_record(run_id, index, record, seq, prev)
        append(record)
        prev = sha256(data).hexdigest()[:32]
        seq += 1
    return events, Tail(seq, prev)


def _explain_bad_record(run_id: str, index: int, record: Any, seq: int, prev: str | None) -> None:
    where = f"journal of run {run_id!r}, line {index + 1}"
    if not isinstance(record, dict) or not isinstance(record.get("type"), str):
        raise _corrupt(run_id, index, f"{where} is not a caravanserai event (no 'type')")
    version = record.get("v")
    if not isinstance(version, int) or isinstance(version, bool):
        raise _corrupt(run_id, index, f"{where} has no format version 'v' (a foreign journal?)")
    if version > FORMAT_VERSION:
        raise _corrupt(run_id, index,
                       f"{where} uses journal format v{version}, "
                       f"newer than this caravanserai (v{FORMAT_VERSION}): upgrade caravanserai")
    if record.get("seq") != seq:
        raise _corrupt(run_id, index, f"{where} has seq {record.get('seq')!r}, expected {seq} (a line is missing or reordered)")
    raise _corrupt(run_id, index, f"{where} does not chain to the line before it (edited, reordered or spliced)")


def _corrupt(run_id: str, index: int, message: str) -> JournalCorruptionError:
    return JournalCorruptionError(
        f"{message}; the journal is left untouched: restore it from a backup or move the run directory aside",
        run_id=run_id,
        line=index + 1,
    )


# ---- state must be JSON ------------------------------------------------------------------------
def to_json(state: Any, *, what: str = "state") -> str:
    """Compact JSON text for ``state``, or SerializationError naming the offending path."""
    try:
        text = _encode(state)
    except (TypeError, ValueError, RecursionError) as exc:
        raise _explain(state, what, exc) from None
    if _has_non_str_key(state):
        raise _explain(state, what, None)
    if not text.isascii():
        check_text(text, what)
    return text


_CONTAINERS = (dict, list, tuple)


def _has_non_str_key(value: Any) -> bool:
    # json.dumps silently turns {1: "a"} into {"1": "a"}; find such keys (iteratively: cheap per MB).
    stack = [value]
    pop, push = stack.pop, stack.append
    while stack:
        node = pop()
        if isinstance(node, dict):
            for key, item in node.items():
                if not isinstance(key, str):
                    return True
                if isinstance(item, _CONTAINERS):
                    push(item)
        elif isinstance(node, _CONTAINERS):
            for item in node:
                if isinstance(item, _CONTAINERS):
                    push(item)
    return False


def _explain(state: Any, what: str, exc: BaseException | None) -> SerializationError:
    try:
        found = _find_problem(state, what, set())
    except RecursionError:
        found = (what, "is nested too deeply to encode (hundreds of levels)")
    if found is None:
        path, problem = what, f"cannot be encoded as JSON ({exc})"
    else:
        path, problem = found
    return SerializationError(
        f"{path} {problem}; checkpoint state must be JSON (dict with str keys, list, str, int, float, bool, None): "
        "convert it (e.g. list(a_set), str(obj), None for NaN) before checkpointing - nothing was written",
        path=path,
    )


def _find_problem(value: Any, path: str, seen: set[int]) -> tuple[str, str] | None:
    if value is None or isinstance(value, (str, bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, f"is {value!r}, which JSON cannot represent")
    if isinstance(value, (dict, list, tuple)):
        if id(value) in seen:
            return (path, "refers back to itself (a circular reference)")
        seen = seen | {id(value)}
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(value, dict) and not isinstance(key, str):
                return (f"{path}[{key!r}]", f"has a {type(key).__name__} key; JSON keys are strings (use str(key))")
            found = _find_problem(item, f"{path}[{key!r}]", seen)
            if found:
                return found
        return None
    return (path, f"is a {type(value).__module__}.{type(value).__qualname__}, which is not JSON")
