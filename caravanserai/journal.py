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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from .errors import JournalCorruptionError, SerializationError

FORMAT_VERSION = 1
RESERVED_FIELDS = ("v", "seq", "at", "type", "prev")


def utc_now() -> str:
    """The current UTC time as ISO-8601 with microseconds, e.g. ``2026-11-30T16:40:00.123456+00:00``."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dumps(value: Any) -> str:
    """Compact, strict (no NaN) JSON text: the one encoding used for journal lines."""
    return _ENCODER.encode(value)


_CANONICAL: dict[Any, json.JSONEncoder] = {}


def canonical(value: Any, *, default: Callable[[Any], Any] | None = repr) -> str:
    """Canonical JSON (sorted keys, no spaces, UTF-8 text): the one form digests are taken of.

    ``default`` turns a non-JSON value into something JSON (``repr`` for request digests); with
    ``default=None`` non-JSON values and NaN are refused (checkpoint headers).
    """
    encoder = _CANONICAL.get(default)
    if encoder is None:
        encoder = _CANONICAL[default] = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"),
                                                         allow_nan=default is not None, default=default)
    return encoder.encode(value)


def digest(value: Any) -> str:
    """SHA-256 hex of ``value``'s canonical JSON (request, definition and budget digests)."""
    return hashlib.sha256(canonical(value).encode("utf-8")).hexdigest()


def line_digest(line: str) -> str:
    return hashlib.sha256(line.encode("utf-8")).hexdigest()[:32]


class RawJSON:
    """A value already encoded as JSON text: spliced into the line, not encoded twice (big states)."""

    __slots__ = ("text", "value")

    def __init__(self, text: str, value: Any) -> None:
        self.text = text
        self.value = value


def _dumps_record(record: dict[str, Any]) -> str:
    raw = [key for key, value in record.items() if isinstance(value, RawJSON)]
    if not raw:
        return dumps(record)
    # Encode the small fields once, then splice the pre-encoded ones in before `prev`.
    rest = {k: v for k, v in record.items() if k not in raw and k != "prev"}
    spliced = "".join(f",{dumps(key)}:{record[key].text}" for key in raw)
    tail = f',"prev":{dumps(record["prev"])}' if "prev" in record else ""
    return dumps(rest)[:-1] + spliced + tail + "}"


def plain(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with every ``RawJSON`` value replaced by the value it encodes."""
    if not any(isinstance(v, RawJSON) for v in record.values()):
        return record
    return {k: (v.value if isinstance(v, RawJSON) else v) for k, v in record.items()}


@dataclass
class Tail:
    """Where the next event goes: its ``seq`` and the digest of the line before it."""

    seq: int = 0
    prev: str | None = None


def encode(events: Iterable[Mapping[str, Any]], tail: Tail, *, at: str | None = None) -> tuple[list[str], list[dict], Tail]:
    """Number, timestamp and chain ``events`` after ``tail``; return (lines, full events, new tail).

    Full events keep ``RawJSON`` values as given (``plain()`` unwraps them), so a consumer that
    wants the encoded text (the state.json view of a large state) need not encode again.

    ``tail`` is not modified: the caller adopts the new tail only once the store acknowledged
    the append, so a failed append leaves the writer where it was.
    """
    seq, prev = tail.seq, tail.prev
    lines: list[str] = []
    full: list[dict] = []
    stamp = at or utc_now()
    for event in events:
        etype = event.get("type")
        if not isinstance(etype, str) or not etype:
            raise ValueError(f"journal event needs a non-empty str 'type', got {event!r}")
        record: dict[str, Any] = {"v": FORMAT_VERSION, "seq": seq, "at": event.get("at", stamp), "type": etype}
        for key, value in event.items():
            if key not in RESERVED_FIELDS:
                record[key] = value
        if prev is not None:
            record["prev"] = prev
        line = _dumps_record(record)
        check_text(line, f"the {etype} event")
        lines.append(line)
        full.append(record)
        prev = line_digest(line)
        seq += 1
    return lines, full, Tail(seq, prev)


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


_fast_loads: Callable[[str], Any]
try:  # orjson parses ~2x faster; the journal is strict JSON, so both parsers agree
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - orjson is optional
    _fast_loads = json.loads


_DIGITS_AS_ZERO = str.maketrans("123456789", "000000000")
_LONG_RUN = "0" * 19  # 19 digits in a row: maybe an integer beyond 64 bits


def _loads(line: str) -> Any:
    if _LONG_RUN in line.translate(_DIGITS_AS_ZERO):  # ~2.5x quicker than a regex search per line
        return json.loads(line)  # orjson turns integers beyond 64 bits into floats: keep them exact
    try:
        return _fast_loads(line)
    except ValueError:
        return json.loads(line)  # NaN tokens kept verbatim from 0.2.0 states; a real error re-raises


def decode(run_id: str, lines: Sequence[str], *, start: int = 0, tail: Tail | None = None) -> tuple[list[dict], Tail]:
    """Parse and verify journal lines; raise JournalCorruptionError naming the first bad line.

    ``start``/``tail`` let a caller verify only new lines after an already-verified prefix.
    """
    events: list[dict] = []
    append = events.append
    tail = tail or Tail()
    seq, prev = tail.seq, tail.prev
    sha256 = hashlib.sha256
    for index, line in enumerate(lines, start=start):
        try:
            record = _loads(line)
        except (ValueError, TypeError) as exc:
            raise _corrupt(run_id, index,
                           f"journal of run {run_id!r}, line {index + 1} is not JSON ({exc.__class__.__name__})") from None
        if not (type(record) is dict and record.get("seq") == seq and record.get("prev") == prev
                and type(record.get("v")) is int and record["v"] <= FORMAT_VERSION and type(record.get("type")) is str):
            _explain_bad_record(run_id, index, record, seq, prev)
        append(record)
        prev = sha256(line.encode("utf-8")).hexdigest()[:32]
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
        text = dumps(state)
    except (TypeError, ValueError, RecursionError) as exc:
        raise _explain(state, what, exc) from None
    if _has_non_str_key(state):
        raise _explain(state, what, None)
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
