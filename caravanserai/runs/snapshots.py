"""Saving and restoring a namespace's variables with a run's waypoints (notebook state).

Each variable is encoded by the first codec that fits, safest first:

- ``json`` — plain JSON values;
- ``parquet`` — a pandas DataFrame as Parquet through pyarrow (values, dtypes and index exact);
- ``ndarray`` — a NumPy array in ``.npy`` format with ``allow_pickle=False``;
- ``typed`` — typed JSON (``caravanserai.values``): int/tuple keys, sets, tuples, datetimes,
  Decimal, UUID, bytes, paths, dataclasses, pydantic models (OpenAI responses), Enums, NumPy and
  pandas values, nested in any JSON structure. Class references resolve only to classes the
  namespace defines or that are allowed (``caravanserai.allow_class``): data never picks code;
- ``pickle`` — anything else picklable, **announced by name at save time** (``Snapshotter.pickled``),
  signed with the writer's key and recorded with its type's name. Pickle runs code when loaded, so
  a pickled value is restored only under the trust rule (``runs.trust``): signed by the reader or a
  key the reader trusts, or from a store trusted explicitly; ``UntrustedPickle`` otherwise, and
  ``SignatureInvalid`` for a signature that does not verify.

A value nothing can save (a generator, an open file, a lock) is left out and named in
``Snapshotter.skipped``. Encodings above ``INLINE_LIMIT`` bytes go to the store's object face
under their SHA-256, so a value that did not change is not written again at the next waypoint.
No pandas/NumPy import happens unless such a value is met.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import io
import json
import pickle
import re
import types
from collections.abc import Iterable
from typing import Any

from ..errors import (
    CaravanseraiError,
    ClassNotAllowed,
    JournalCorruptionError,
    ObjectNotFound,
    SerializationError,
    UntrustedPickle,
)
from ..journal import to_json
from . import values
from .trust import Resigned, judge, sign_item
from .trust import trust_store as trust_store  # the old caravanserai.namespace.trust_store keeps importing

__all__ = ["Snapshotter", "UntrustedPickle", "decode_value", "encode_value"]

INLINE_LIMIT = 16 * 1024
_DIGEST = re.compile(r"[0-9a-f]{64}")
_TEXT_CODECS = ("json", "typed", "dataframe", "dataclass", "pydantic")
def _type_name(value: Any) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def encode_value(name: str, value: Any) -> tuple[str, bytes, dict]:
    """(codec, payload, extra) for ``value``; SerializationError naming ``name`` if nothing fits."""
    try:
        return "json", to_json(value, what=name).encode("utf-8"), {}
    except SerializationError:
        pass
    module, kind = type(value).__module__ or "", type(value).__name__
    if module.startswith("pandas") and kind == "DataFrame":
        try:
            buffer = io.BytesIO()
            value.to_parquet(buffer, engine="pyarrow")
            return "parquet", buffer.getvalue(), {}
        except (ImportError, ValueError, TypeError):
            pass  # typed JSON (or pickle) below says why it cannot
    if module == "numpy" and kind == "ndarray" and value.dtype != object:
        import numpy as np

        buffer = io.BytesIO()
        np.save(buffer, value, allow_pickle=False)
        return "ndarray", buffer.getvalue(), {}
    try:
        return "typed", to_json(values.encode(value, name), what=name).encode("utf-8"), {}
    except SerializationError:
        pass
    try:
        payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise SerializationError(
            f"variable {name!r} ({_type_name(value)}) cannot be saved with the waypoint ({type(exc).__name__}); "
            "leave it out (--state) or re-create it in a setup cell", path=name, kind=_type_name(value),
        ) from None
    return "pickle", payload, {"type": _type_name(value), "signed": sign_item("pickle", name, payload)}


def inline_entry(codec: str, payload: bytes, extra: dict) -> dict[str, Any]:
    """A saved variable's entry held in the event itself: JSON and typed JSON as plain nested JSON
    (``value``, readable in the journal and by the read model), other codecs as base64 ``data``."""
    entry: dict[str, Any] = {"codec": codec, **{k: v for k, v in extra.items() if v is not None}}
    if codec in ("json", "typed"):
        entry["value"] = json.loads(payload)
    else:
        entry["data"] = base64.b64encode(payload).decode("ascii")
    return entry


def entry_for(name: str, value: Any) -> dict[str, Any]:
    """The inline entry ``value`` is saved as (a fork's edited variable): typed JSON or plain JSON only,
    never pickle (an edit is data). SerializationError naming ``name`` otherwise."""
    codec, payload, extra = encode_value(name, value)
    if codec not in ("json", "typed"):
        raise SerializationError(f"variable {name!r} ({_type_name(value)}) cannot be edited as data; "
                                 "leave it as it was or change it in the cell", path=name, kind=_type_name(value))
    return inline_entry(codec, payload, extra)


def decode_value(name: str, codec: str, payload: bytes, extra: dict, *, run_id: str, store_url: str,
                 resigned: Resigned | None = None, namespace: dict | None = None, sha256: str | None = None) -> Any:
    """The value ``encode_value`` saved. Pickle only under the trust rule (``runs.trust.judge``);
    ``sha256``: the payload's digest when the caller has just checked it (a stored object's key)."""
    namespace = namespace or {}
    if codec == "json":
        return json.loads(payload)
    if codec == "typed":
        return values.decode(json.loads(payload), namespace)
    if codec == "parquet":
        import pandas as pd

        return pd.read_parquet(io.BytesIO(payload), engine="pyarrow")
    if codec == "ndarray":
        import numpy as np

        return np.load(io.BytesIO(payload), allow_pickle=False)
    if codec in ("dataclass", "pydantic"):  # written by caravanserai before typed JSON: same class rules
        if not isinstance(extra.get("class"), str):
            raise SerializationError(f"saved variable {name!r} has no class reference", path=name)
        return values.decode({values.TAG: codec, "class": extra["class"], "v": json.loads(payload)}, namespace)
    if codec == "dataframe":
        import pandas as pd

        return pd.read_json(io.StringIO(payload.decode("utf-8")), orient="table")
    if codec == "pickle":
        verdict = judge("pickle", name, sha256 or payload, extra.get("signed"), run_id=run_id, store_url=store_url,
                        resigned_items=resigned)
        if not verdict.trusted:
            raise UntrustedPickle(f"{verdict.refusal(run_id, 'pickle', name, store_url)} (loading a pickle runs code: "
                                  "not loaded)", name=name, run_id=run_id, store=store_url, key=verdict.key)
        return pickle.loads(payload)  # noqa: S301 - signed by a trusted key or from a trusted store, see above
    raise SerializationError(f"variable {name!r} uses codec {codec!r}, unknown to this caravanserai: upgrade", path=name)


class Snapshotter:
    """Encodes chosen names of a namespace into a waypoint's ``names`` field; restores them.

    Payloads over ``INLINE_LIMIT`` are written once to the object face (key = SHA-256) and
    referenced; the encoding of a value already saved under the same digest is not rewritten.
    After each ``capture``, ``pickled`` names the values saved with pickle and ``skipped`` those
    that could not be saved at all (name -> type), so the caller can say so at once.
    """

    def __init__(self, namespace: dict, names: Iterable[str], *, objects: Any, run_id: str, store_url: str,
                 strict: Iterable[str] = (), resigned: Resigned | None = None) -> None:
        self.namespace = namespace
        self.names = list(dict.fromkeys(names))
        self.strict = set(strict)
        self.objects = objects
        self.run_id = run_id
        self.store_url = store_url
        self.resigned = resigned  # signatures `caravanserai sign` appended (runs.trust.resigned)
        self.skipped: dict[str, str] = {}
        self.pickled: list[str] = []
        self._written: set[str] = set()

    def capture(self) -> dict:
        saved: dict[str, dict] = {}
        pickled: list[str] = []
        skipped: dict[str, str] = {}
        for name in self.names:
            if name not in self.namespace:
                continue
            value = self.namespace[name]
            if _is_code(value):
                continue  # functions, classes and modules are re-created when the cell runs again
            try:
                codec, payload, extra = encode_value(name, value)
            except SerializationError as exc:
                if name in self.strict:
                    raise
                skipped[name] = exc.fields.get("kind") or _type_name(value)
                continue
            if codec == "pickle":
                pickled.append(name)
            if len(payload) <= INLINE_LIMIT:
                entry = inline_entry(codec, payload, extra)
            else:
                digest = hashlib.sha256(payload).hexdigest()
                if digest not in self._written:
                    self.objects.put_if_absent(f"values/{self.run_id}/{digest}", payload)
                    self._written.add(digest)
                entry = {"codec": codec, **{k: v for k, v in extra.items() if v is not None}, "object": digest}
            saved[name] = entry
        self.pickled, self.skipped = pickled, skipped
        return saved

    def restore(self, saved: Any, deferred: dict | None = None, definable: Iterable[str] = ()) -> list[str]:
        """Put the saved values back into the namespace; returns the names restored.

        A value naming a class the cell itself defines (``definable``: a dataclass defined in the
        very cell being resumed) goes to ``deferred`` when that class does not exist yet, to be
        restored once it does. Any other class the namespace does not hold is ClassNotAllowed.
        """
        if not isinstance(saved, dict):
            raise _damaged("the saved variables are not an object")
        restored = []
        later = set(definable)
        for name, entry in saved.items():
            try:
                value = self.decode(name, entry)
            except ClassNotAllowed:
                if deferred is None or not _waits_for(entry, self.namespace, later):
                    raise
                deferred[name] = entry
                continue
            self.namespace[name] = value
            restored.append(name)
        return restored

    def decode(self, name: str, entry: Any) -> Any:
        """One saved variable's value (ClassNotAllowed, UntrustedPickle, or journal damage)."""
        if not isinstance(entry, dict) or not isinstance(entry.get("codec"), str):
            raise _damaged(f"the saved entry of variable {name!r} is malformed")
        codec = entry["codec"]
        try:
            if "object" in entry:
                digest = entry["object"]
                if not (isinstance(digest, str) and _DIGEST.fullmatch(digest)):
                    raise _damaged(f"the saved entry of variable {name!r} names no valid object")
                try:
                    payload = self.objects.get(f"values/{self.run_id}/{digest}")
                except ObjectNotFound:
                    raise _damaged(f"the stored value of variable {name!r} is missing from the store") from None
                if hashlib.sha256(payload).hexdigest() != digest:
                    raise _damaged(f"the stored value of variable {name!r} does not match its digest")
            elif "value" in entry and codec in ("json", "typed"):
                value = entry["value"]
                return copy.deepcopy(value) if codec == "json" else values.decode(value, self.namespace)
            elif codec in _TEXT_CODECS:  # written before values were held as plain JSON
                payload = entry["data"].encode("utf-8")
            else:
                payload = base64.b64decode(entry["data"], validate=True)
            return decode_value(name, codec, payload, entry, run_id=self.run_id, store_url=self.store_url,
                                resigned=self.resigned, namespace=self.namespace,
                                sha256=entry["object"] if "object" in entry else None)  # checked just above
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            if isinstance(exc, CaravanseraiError):
                raise
            raise _damaged(f"the saved value of variable {name!r} is malformed ({type(exc).__name__})") from None


def _damaged(problem: str) -> JournalCorruptionError:
    return JournalCorruptionError(f"{problem}; re-run the cell with --restart to save it again", line=None)


def _waits_for(entry: Any, namespace: dict, definable: set[str]) -> bool:
    """True if every class the entry names that is missing now is one the cell will define."""
    refs: list[str] = []
    if entry.get("codec") in ("dataclass", "pydantic") and isinstance(entry.get("class"), str):
        refs = [entry["class"]]
    elif entry.get("codec") == "typed" and "value" in entry:
        refs = list(values.class_refs(entry["value"]))
    elif entry.get("codec") == "typed" and isinstance(entry.get("data"), str):
        try:
            refs = list(values.class_refs(json.loads(entry["data"])))
        except ValueError:
            return False
    missing = []
    for ref in refs:
        try:
            values.resolve_class(ref, namespace)
        except ClassNotAllowed:
            missing.append(ref)
    return bool(missing) and all(ref.startswith("__main__:") and ref[9:].split(".")[0] in definable for ref in missing)


def _is_code(value: Any) -> bool:
    return isinstance(value, (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type))
