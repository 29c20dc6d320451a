"""Saving and restoring a namespace's variables with a run's waypoints (notebook state).

Each variable is encoded by the first codec that fits, safest first:

- ``json`` — JSON values (strict; tuples become lists);
- ``parquet`` — pandas DataFrames as Parquet through pyarrow (values, dtypes and index exact);
  without pyarrow, ``dataframe``: the pandas "table" JSON (floats to 10 digits, 64-bit dtypes);
- ``pydantic`` — pydantic models (``model_dump(mode="json")`` + class path, ``model_validate``);
- ``ndarray`` — NumPy arrays in ``.npy`` format with ``allow_pickle=False``;
- ``dataclass`` — dataclass instances as their fields (JSON) plus the class path;
- ``pickle`` — anything else picklable. **Pickle runs code when loaded**, so a pickled value is
  restored only from a store the user marked trusted (``trust_store(url)`` / ``%caravanserai
  trust URL`` / ``CARAVANSERAI_TRUSTED_STORES``) or when it carries an HMAC-SHA256 signature that
  verifies with ``CARAVANSERAI_SIGNING_KEY``; otherwise restoring it raises ``UntrustedPickle``.

Encodings above ``INLINE_LIMIT`` bytes go to the store's object face under their SHA-256, so a
value that did not change is not written again at the next waypoint. No pandas/NumPy import
happens unless such a value is met.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import importlib
import io
import json
import os
import pickle
from typing import Any, Iterable

from .errors import CaravanseraiError, SerializationError
from .serialization import to_json

__all__ = ["Snapshotter", "UntrustedPickle", "decode_value", "encode_value", "trust_store", "trusted"]

INLINE_LIMIT = 16 * 1024
_TEXT_CODECS = ("json", "dataframe", "dataclass", "pydantic")
SIGNING_ENV = "CARAVANSERAI_SIGNING_KEY"
TRUST_ENV = "CARAVANSERAI_TRUSTED_STORES"
_TRUSTED: set[str] = set()


class UntrustedPickle(CaravanseraiError):
    code = "untrusted_pickle"


def trust_store(url: str) -> None:
    """Allow pickled values to be loaded from ``url`` in this process (only for stores you control)."""
    _TRUSTED.add(url)


def trusted(url: str) -> bool:
    return url in _TRUSTED or url in [u.strip() for u in os.environ.get(TRUST_ENV, "").split(",") if u.strip()]


def _module(value: Any) -> str:
    return type(value).__module__ or ""


def _signature(payload: bytes) -> str | None:
    key = os.environ.get(SIGNING_ENV)
    return hmac.new(key.encode(), payload, hashlib.sha256).hexdigest() if key else None


def encode_value(name: str, value: Any) -> tuple[str, bytes, dict]:
    """(codec, payload, extra) for ``value``; SerializationError naming ``name`` if nothing fits."""
    try:
        return "json", to_json(value, what=name).encode("utf-8"), {}
    except SerializationError:
        pass
    module = _module(value)
    if module.startswith("pandas") and type(value).__name__ == "DataFrame":
        try:
            buffer = io.BytesIO()
            value.to_parquet(buffer, engine="pyarrow")
            return "parquet", buffer.getvalue(), {}
        except ImportError:  # no pyarrow: a lossier but safe JSON form
            return "dataframe", value.to_json(orient="table", date_format="iso", date_unit="ns").encode("utf-8"), {}
    if hasattr(type(value), "model_validate") and hasattr(value, "model_dump"):
        try:
            dumped = to_json(value.model_dump(mode="json"), what=name)
            return "pydantic", dumped.encode("utf-8"), {"class": f"{module}:{type(value).__qualname__}"}
        except (SerializationError, TypeError, ValueError):
            pass
    if module == "numpy" and type(value).__name__ == "ndarray" and value.dtype != object:
        import numpy as np

        buffer = io.BytesIO()
        np.save(buffer, value, allow_pickle=False)
        return "ndarray", buffer.getvalue(), {}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        try:
            fields = to_json({f.name: getattr(value, f.name) for f in dataclasses.fields(value)}, what=name)
            return "dataclass", fields.encode("utf-8"), {"class": f"{module}:{type(value).__qualname__}"}
        except SerializationError:
            pass
    try:
        payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise SerializationError(
            f"variable {name!r} ({type(value).__module__}.{type(value).__qualname__}) cannot be saved with the waypoint: "
            f"{type(exc).__name__}: {exc}; leave it out (--state) or re-create it in a setup cell", path=name,
        ) from None
    extra = {"signature": _signature(payload)} if os.environ.get(SIGNING_ENV) else {}
    return "pickle", payload, extra


def decode_value(name: str, codec: str, payload: bytes, extra: dict, *, store_url: str,
                 namespace: dict | None = None) -> Any:
    if codec == "json":
        return json.loads(payload)
    if codec == "dataframe":
        import pandas as pd

        return pd.read_json(io.StringIO(payload.decode("utf-8")), orient="table")
    if codec == "parquet":
        import pandas as pd

        return pd.read_parquet(io.BytesIO(payload), engine="pyarrow")
    if codec == "pydantic":
        return _find_class(extra["class"], namespace or {}).model_validate(json.loads(payload))
    if codec == "ndarray":
        import numpy as np

        return np.load(io.BytesIO(payload), allow_pickle=False)
    if codec == "dataclass":
        cls = _find_class(extra["class"], namespace or {})
        return cls(**json.loads(payload))
    if codec == "pickle":
        signature = extra.get("signature")
        expected = _signature(payload)
        signed = signature is not None and expected is not None and hmac.compare_digest(signature, expected)
        if not (signed or trusted(store_url)):
            raise UntrustedPickle(
                f"variable {name!r} was saved with pickle, and loading a pickle runs code: not loaded from untrusted store "
                f"{store_url}. If you control that store, trust it (%caravanserai trust {store_url} or "
                f"{TRUST_ENV}); or sign pickles with {SIGNING_ENV}", name=name, store=store_url,
            )
        return pickle.loads(payload)  # noqa: S301 - trusted store or verified signature, see above
    raise CaravanseraiError(f"variable {name!r} uses codec {codec!r}, unknown to this caravanserai: upgrade", name=name)


def _find_class(path: str, namespace: dict) -> Any:
    module, _, qualname = path.partition(":")
    if module == "__main__" and qualname in namespace:  # a class defined in the notebook
        return namespace[qualname]
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


class Snapshotter:
    """Encodes chosen names of a namespace into a waypoint's ``names`` field; restores them.

    Payloads over ``INLINE_LIMIT`` are written once to the object face (key = SHA-256) and
    referenced; the encoding of a value already saved under the same digest is not rewritten.
    """

    def __init__(self, namespace: dict, names: Iterable[str], *, objects: Any, run_id: str, store_url: str,
                 strict: Iterable[str] = ()) -> None:
        self.namespace = namespace
        self.names = list(dict.fromkeys(names))
        self.strict = set(strict)
        self.objects = objects
        self.run_id = run_id
        self.store_url = store_url
        self.skipped: dict[str, str] = {}
        self._written: set[str] = set()

    def capture(self) -> dict:
        saved: dict[str, dict] = {}
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
                self.skipped[name] = exc.message
                continue
            entry: dict[str, Any] = {"codec": codec, **{k: v for k, v in extra.items() if v is not None}}
            if len(payload) <= INLINE_LIMIT:
                entry["data"] = payload.decode("utf-8") if codec in _TEXT_CODECS else \
                    base64.b64encode(payload).decode("ascii")
            else:
                digest = hashlib.sha256(payload).hexdigest()
                if digest not in self._written:
                    self.objects.put_if_absent(f"values/{self.run_id}/{digest}", payload)
                    self._written.add(digest)
                entry["object"] = digest
            saved[name] = entry
        return saved

    def restore(self, saved: dict, deferred: dict | None = None) -> list[str]:
        """Put the saved values back into the namespace; returns the names restored.

        A value whose class is not defined yet (a dataclass defined in the very cell being
        resumed) is put in ``deferred`` instead, to be restored once the class exists.
        """
        restored = []
        for name, entry in saved.items():
            if deferred is not None and entry["codec"] in ("dataclass", "pydantic") and not _class_available(
                    entry["class"], self.namespace):
                deferred[name] = entry
                continue
            codec = entry["codec"]
            if "object" in entry:
                payload = self.objects.get(f"values/{self.run_id}/{entry['object']}")
                if hashlib.sha256(payload).hexdigest() != entry["object"]:
                    raise CaravanseraiError(f"saved value of {name!r} is damaged (digest mismatch)", name=name)
            elif codec in _TEXT_CODECS:
                payload = entry["data"].encode("utf-8")
            else:
                payload = base64.b64decode(entry["data"])
            self.namespace[name] = decode_value(name, codec, payload, entry, store_url=self.store_url,
                                                namespace=self.namespace)
            restored.append(name)
        return restored


def _class_available(path: str, namespace: dict) -> bool:
    try:
        _find_class(path, namespace)
    except (ImportError, AttributeError):
        return False
    return True


def _is_code(value: Any) -> bool:
    import types

    return isinstance(value, (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type))
