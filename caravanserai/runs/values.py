"""Typed JSON for the Python values a notebook holds, and the one place a saved value names a class.

``encode(value)`` turns common non-JSON values into JSON with tagged objects, so saving a
notebook's variables rarely needs pickle:

==========================================  ======================================================
value                                       stored as
==========================================  ======================================================
JSON (str keys, finite floats)              itself
dict with non-str keys (or a ``"$t"`` key)  ``{"$t": "dict", "v": [[key, value], ...]}``
tuple, set, frozenset                       ``{"$t": "tuple" | "set" | "frozenset", "v": [...]}``
NaN, ±Infinity, complex                     ``{"$t": "float", "v": "nan"}``, ``{"$t": "complex", "v": [re, im]}``
datetime, date, time, timedelta             ISO-8601 (time zone offset, and the zone name of a ``ZoneInfo``)
Decimal, UUID, bytes, bytearray, Path       their exact text (bytes in base64)
dataclass, pydantic model, Enum,            ``{"$t": ..., "class": "module:QualName", "v": ...}``
NamedTuple                                  (OpenAI responses are pydantic models)
NumPy arrays and scalars, pandas            ``.npy`` (``allow_pickle=False``), Parquet, ISO text
DataFrame / Series / Timestamp
==========================================  ======================================================

Anything else raises ``Unencodable`` (the caller may fall back to pickle, and says so).

**Data never chooses code.** ``decode`` builds values only from the fixed tags above; a
``"class"`` reference resolves only to (1) a class registered with ``allow_class``, (2) a class
the caller's namespace holds (defined in the notebook, or imported into it, directly or as an
attribute of an imported module), or (3) a short built-in list of response types (OpenAI's
``ChatCompletion``...). The class must then be a dataclass, a pydantic model, an Enum or a
NamedTuple, built through its documented constructor. Anything else raises
``ClassNotAllowed`` before anything is called.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import enum
import importlib
import io
import math
import sys
import uuid
from collections.abc import Callable, Iterable
from decimal import Decimal
from pathlib import Path, PosixPath, PurePath, PurePosixPath, PureWindowsPath
from types import ModuleType
from typing import Any

from ..errors import ClassNotAllowed, JournalCorruptionError, Unencodable, UsageError

__all__ = ["Unencodable", "allow_class", "allowed_classes", "class_ref", "decode", "encode", "resolve_class"]

TAG = "$t"

# Response types of well-known client libraries, allowed without registration: their module is
# imported only for these exact names (never for a name read from data alone).
DEFAULT_ALLOWED = frozenset({
    "openai.types.chat.chat_completion:ChatCompletion",
    "openai.types.chat.chat_completion_message:ChatCompletionMessage",
    "openai.types.completion:Completion",
    "openai.types.create_embedding_response:CreateEmbeddingResponse",
    "openai.types.responses.response:Response",
    "anthropic.types.message:Message",
})
# Packages whose pydantic models are plain data (SDK response types, stream chunks and events, chat
# messages): a class of theirs is allowed when its module is already imported, and only if it is a
# pydantic model. Nothing is imported for them.
DEFAULT_ALLOWED_PACKAGES = ("openai.types.", "anthropic.types.", "langchain_core.messages.")
_ALLOWED: dict[str, type] = {}
_PATHS = {cls.__name__: cls for cls in (PurePath, PurePosixPath, PureWindowsPath, Path, PosixPath)}


def class_ref(cls: type) -> str:
    """``module:QualName`` of a class: how a saved value names it."""
    return f"{cls.__module__}:{cls.__qualname__}"


def allow_class(*classes: type) -> None:
    """Let saved values name these classes (dataclasses, pydantic models, Enums, NamedTuples).

    Classes defined in (or imported into) the notebook need no registration; use this for
    classes a restored value needs before the notebook has imported them.
    """
    for cls in classes:
        if not isinstance(cls, type):
            raise UsageError(f"allow_class() takes classes, got {cls!r}")
        _ALLOWED[class_ref(cls)] = cls


def allowed_classes() -> list[str]:
    """The class references saved values may name without the namespace's help."""
    return sorted({*_ALLOWED, *DEFAULT_ALLOWED})


# ---- encoding ---------------------------------------------------------------------------------
def encode(value: Any, path: str = "value") -> Any:
    """A JSON-able form of ``value`` (see the module docstring); ``Unencodable`` naming ``path``."""
    return _Encoder().encode(value, path)


class _Encoder:
    def __init__(self) -> None:
        self.active: set[int] = set()

    def encode(self, value: Any, path: str) -> Any:
        kind = type(value)
        if value is None or kind is str or kind is bool or kind is int:
            return value
        if kind is float:
            return value if math.isfinite(value) else {TAG: "float", "v": repr(value)}
        special = _SIMPLE.get(kind)
        if special is not None:
            return special(value)
        if kind in (list, tuple, set, frozenset, dict):
            return self.container(value, path)
        return self.other(value, path)

    def container(self, value: Any, path: str) -> Any:
        if id(value) in self.active:
            raise Unencodable(f"{path} refers back to itself (a circular reference)", path=path)
        self.active.add(id(value))
        try:
            if isinstance(value, dict):
                if all(type(k) is str for k in value) and TAG not in value:
                    return {k: self.encode(v, f"{path}[{k!r}]") for k, v in value.items()}
                return {TAG: "dict", "v": [[self.encode(k, f"{path} key {k!r}"), self.encode(v, f"{path}[{k!r}]")]
                                           for k, v in value.items()]}
            items = [self.encode(v, f"{path}[{i}]") for i, v in enumerate(value)]
            if isinstance(value, list):
                return items
            if isinstance(value, tuple):
                return {TAG: "tuple", "v": items}
            # sets: a stable order, so the same set always encodes to the same bytes
            return {TAG: type(value).__name__, "v": sorted(items, key=_sort_key)}
        except RecursionError:
            raise Unencodable(f"{path} is nested too deeply to save", path=path) from None
        finally:
            self.active.discard(id(value))

    def other(self, value: Any, path: str) -> Any:
        kind = type(value)
        if isinstance(value, PurePath) and kind.__name__ in _PATHS:
            return {TAG: "path", "kind": kind.__name__, "v": str(value)}
        if isinstance(value, enum.Enum):
            return {TAG: "enum", "class": class_ref(kind), "v": value.name}
        if isinstance(value, tuple) and hasattr(kind, "_fields"):
            return {TAG: "namedtuple", "class": class_ref(kind),
                    "v": [self.encode(v, f"{path}.{f}") for f, v in zip(kind._fields, value, strict=True)]}
        if _is_pydantic(kind):
            dumped = value.model_dump(mode="json")
            return {TAG: "pydantic", "class": class_ref(kind), "v": self.encode(dumped, path)}
        if dataclasses.is_dataclass(value):
            fields = {f.name: self.encode(getattr(value, f.name), f"{path}.{f.name}") for f in dataclasses.fields(value)}
            return {TAG: "dataclass", "class": class_ref(kind), "v": fields}
        module = kind.__module__ or ""
        if module.startswith("numpy"):
            return _numpy(value, path)
        if module.startswith("pandas"):
            return _pandas(value, path)
        raise Unencodable(f"{path} is a {module}.{kind.__qualname__}, which has no typed JSON form", path=path)


def _sort_key(item: Any) -> str:
    from ..journal import dumps

    return dumps(item)


def _datetime(value: dt.datetime) -> dict:
    out: dict[str, Any] = {TAG: "datetime", "v": value.isoformat()}
    _zone(value.tzinfo, out)
    if value.fold:
        out["fold"] = 1
    return out


def _time(value: dt.time) -> dict:
    out: dict[str, Any] = {TAG: "time", "v": value.isoformat()}
    _zone(value.tzinfo, out)
    return out


def _zone(tz: Any, out: dict) -> None:
    key = getattr(tz, "key", None)  # zoneinfo.ZoneInfo: keep the zone, not only today's offset
    if isinstance(key, str) and type(tz).__module__ == "zoneinfo":
        out["tz"] = key


_SIMPLE: dict[type, Callable[[Any], Any]] = {
    dt.datetime: _datetime,
    dt.date: lambda v: {TAG: "date", "v": v.isoformat()},
    dt.time: _time,
    dt.timedelta: lambda v: {TAG: "timedelta", "v": [v.days, v.seconds, v.microseconds]},
    Decimal: lambda v: {TAG: "decimal", "v": str(v)},
    uuid.UUID: lambda v: {TAG: "uuid", "v": str(v)},
    bytes: lambda v: {TAG: "bytes", "v": base64.b64encode(v).decode("ascii")},
    bytearray: lambda v: {TAG: "bytearray", "v": base64.b64encode(v).decode("ascii")},
    complex: lambda v: {TAG: "complex", "v": [repr(v.real), repr(v.imag)]},
}


def _is_pydantic(kind: type) -> bool:
    return any(base.__name__ == "BaseModel" and base.__module__.startswith("pydantic") for base in kind.__mro__)


def _numpy(value: Any, path: str) -> Any:
    import numpy as np

    if isinstance(value, np.ndarray) and value.dtype != object:
        buffer = io.BytesIO()
        np.save(buffer, value, allow_pickle=False)
        return {TAG: "ndarray", "v": base64.b64encode(buffer.getvalue()).decode("ascii")}
    if isinstance(value, np.generic) and value.dtype != object:
        return {TAG: "npscalar", "dtype": value.dtype.str, "v": _Encoder().encode(value.item(), path)}
    raise Unencodable(f"{path} is a NumPy {type(value).__name__} of Python objects, which has no typed JSON form", path=path)


def _pandas(value: Any, path: str) -> Any:
    import pandas as pd

    if isinstance(value, pd.Timestamp):
        return {TAG: "timestamp", "v": value.isoformat()}
    if isinstance(value, pd.Series):
        return {TAG: "series", "name": _Encoder().encode(value.name, path), "v": _parquet(value.to_frame("v"), path)}
    if isinstance(value, pd.DataFrame):
        return {TAG: "dataframe", "v": _parquet(value, path)}
    raise Unencodable(f"{path} is a pandas {type(value).__name__}, which has no typed JSON form", path=path)


def _parquet(frame: Any, path: str) -> str:
    buffer = io.BytesIO()
    try:
        frame.to_parquet(buffer, engine="pyarrow")
    except (ImportError, ValueError, TypeError) as exc:
        raise Unencodable(f"{path}: pandas data cannot be stored as Parquet ({type(exc).__name__})", path=path) from None
    return base64.b64encode(buffer.getvalue()).decode("ascii")


# ---- decoding ---------------------------------------------------------------------------------
def decode(data: Any, namespace: dict | None = None) -> Any:
    """The value ``encode`` made ``data`` from; classes resolve through ``resolve_class`` only."""
    return _Decoder(namespace or {}).decode(data)


class _Decoder:
    def __init__(self, namespace: dict) -> None:
        self.namespace = namespace

    def decode(self, data: Any) -> Any:
        if isinstance(data, list):
            return [self.decode(v) for v in data]
        if not isinstance(data, dict):
            return data
        tag = data.get(TAG)
        if tag is None:
            return {k: self.decode(v) for k, v in data.items()}
        handler = _TAGS.get(tag) if isinstance(tag, str) else None
        if handler is None:
            raise _damaged(f"uses the encoding {tag!r}, unknown to this caravanserai (upgrade it)")
        try:
            return handler(self, data)
        except (ClassNotAllowed, JournalCorruptionError):
            raise
        except Exception as exc:  # a malformed entry, or a constructor refusing the saved fields
            raise _damaged(f"has a malformed {tag!r} entry ({type(exc).__name__})") from None

    def items(self, data: dict) -> list:
        values = data["v"]
        if not isinstance(values, list):
            raise TypeError("v is not a list")
        return [self.decode(v) for v in values]

    def cls(self, data: dict, check: Callable[[type], bool], kind: str) -> Any:
        ref = data["class"]
        if not isinstance(ref, str):
            raise TypeError("class is not a str")
        return resolve_class(ref, self.namespace, check=check, kind=kind)


def _damaged(problem: str) -> JournalCorruptionError:
    return JournalCorruptionError(f"a saved value {problem}; re-run the cell with --restart to save it again", line=None)


def _dict(d: _Decoder, data: dict) -> dict:
    out = {}
    for pair in data["v"]:
        key, value = pair
        out[_hashable(d.decode(key))] = d.decode(value)
    return out


def _hashable(key: Any) -> Any:
    if isinstance(key, list):  # a list cannot be a key: only a damaged entry gets here
        raise TypeError("unhashable key")
    return key


def _dataclass(d: _Decoder, data: dict) -> Any:
    cls = d.cls(data, lambda c: dataclasses.is_dataclass(c), "dataclass")
    values = data["v"]
    if not isinstance(values, dict):
        raise TypeError("v is not an object")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(values) - set(fields)
    if unknown:
        raise _damaged(f"names fields {sorted(unknown)} that {class_ref(cls)} does not have")
    decoded = {k: d.decode(v) for k, v in values.items()}
    obj = cls(**{k: v for k, v in decoded.items() if fields[k].init})
    for name, value in decoded.items():
        if not fields[name].init:  # init=False fields: set as data, the class's own constructor ran above
            object.__setattr__(obj, name, value)
    return obj


def _pydantic(d: _Decoder, data: dict) -> Any:
    cls = d.cls(data, _is_pydantic, "pydantic model")
    return cls.model_validate(d.decode(data["v"]))


def _enum(d: _Decoder, data: dict) -> Any:
    cls = d.cls(data, lambda c: issubclass(c, enum.Enum), "Enum")
    return cls[data["v"]]


def _namedtuple(d: _Decoder, data: dict) -> Any:
    cls = d.cls(data, lambda c: issubclass(c, tuple) and hasattr(c, "_fields"), "NamedTuple")
    return cls(*d.items(data))


def _path(d: _Decoder, data: dict) -> Any:
    return _PATHS[data["kind"]](data["v"])


def _with_zone(value: Any, data: dict) -> Any:
    key = data.get("tz")
    if key is not None:
        from zoneinfo import ZoneInfo

        value = value.replace(tzinfo=ZoneInfo(key))
    if data.get("fold"):
        value = value.replace(fold=1)
    return value


def _ndarray(d: _Decoder, data: dict) -> Any:
    import numpy as np

    return np.load(io.BytesIO(base64.b64decode(data["v"], validate=True)), allow_pickle=False)


def _npscalar(d: _Decoder, data: dict) -> Any:
    import numpy as np

    dtype = np.dtype(data["dtype"])
    if dtype.hasobject:
        raise ValueError("object dtype")
    return dtype.type(d.decode(data["v"]))


def _frame(encoded: str) -> Any:
    import pandas as pd

    return pd.read_parquet(io.BytesIO(base64.b64decode(encoded, validate=True)), engine="pyarrow")


def _series(d: _Decoder, data: dict) -> Any:
    series = _frame(data["v"])["v"]
    series.name = d.decode(data.get("name"))
    return series


def _timestamp(d: _Decoder, data: dict) -> Any:
    import pandas as pd

    return pd.Timestamp(data["v"])


def _float(d: _Decoder, data: dict) -> float:
    text = data["v"]
    if text not in ("nan", "inf", "-inf"):
        raise ValueError(text)
    return float(text)


_TAGS: dict[str, Callable[[_Decoder, dict], Any]] = {
    "dict": _dict,
    "tuple": lambda d, data: tuple(d.items(data)),
    "set": lambda d, data: set(d.items(data)),
    "frozenset": lambda d, data: frozenset(d.items(data)),
    "float": _float,
    "complex": lambda d, data: complex(float(data["v"][0]), float(data["v"][1])),
    "datetime": lambda d, data: _with_zone(dt.datetime.fromisoformat(data["v"]), data),
    "date": lambda d, data: dt.date.fromisoformat(data["v"]),
    "time": lambda d, data: _with_zone(dt.time.fromisoformat(data["v"]), data),
    "timedelta": lambda d, data: dt.timedelta(*(int(x) for x in data["v"][:3])),
    "decimal": lambda d, data: Decimal(str(data["v"])),
    "uuid": lambda d, data: uuid.UUID(str(data["v"])),
    "bytes": lambda d, data: base64.b64decode(data["v"], validate=True),
    "bytearray": lambda d, data: bytearray(base64.b64decode(data["v"], validate=True)),
    "path": _path,
    "enum": _enum,
    "namedtuple": _namedtuple,
    "pydantic": _pydantic,
    "dataclass": _dataclass,
    "ndarray": _ndarray,
    "npscalar": _npscalar,
    "dataframe": lambda d, data: _frame(data["v"]),
    "series": _series,
    "timestamp": _timestamp,
}


# ---- classes ----------------------------------------------------------------------------------
def resolve_class(ref: str, namespace: dict | None = None, *, check: Callable[[type], bool] | None = None,
                  kind: str = "class") -> type:
    """The class ``ref`` (``module:QualName``) names, if this process allows it; ClassNotAllowed otherwise.

    Looked up, in order, among classes registered with ``allow_class``, classes the namespace
    holds (or that modules it holds define), and ``DEFAULT_ALLOWED``. Nothing else is imported;
    ``check`` then confirms the class is of the expected kind before anything is constructed.
    """
    cls = _ALLOWED.get(ref) or _from_namespace(ref, namespace or {}) or _default(ref)
    if cls is None:
        raise ClassNotAllowed(
            f"a saved value names the class {ref}, which is neither defined in this notebook nor allowed: define or import "
            f"it before the cell runs, or call caravanserai.allow_class(<the class>); nothing was called", ref=ref)
    if check is not None and not (isinstance(cls, type) and check(cls)):
        raise ClassNotAllowed(f"a saved value names {ref} as a {kind}, but it is not one; nothing was called", ref=ref)
    return cls


def _from_namespace(ref: str, namespace: dict) -> type | None:
    module, _, qualname = ref.partition(":")
    for value in list(namespace.values()):
        kind = type(value)  # never isinstance(): an object's __class__ may be a property
        if issubclass(kind, type) and class_ref(value) == ref:
            return value
        if issubclass(kind, ModuleType) and _own_dict(value).get("__name__") == module:
            found = _attribute_path(value, qualname)
            if found is not None and class_ref(found) == ref:
                return found
    return None


def _default(ref: str) -> type | None:
    if ref not in DEFAULT_ALLOWED:
        return _default_package_model(ref)
    module, _, qualname = ref.partition(":")
    try:
        target = sys.modules.get(module) or importlib.import_module(module)
    except ImportError:
        return None
    return _attribute_path(target, qualname)


def _default_package_model(ref: str) -> type | None:
    """A pydantic model of a DEFAULT_ALLOWED_PACKAGES module that is already imported (else None)."""
    module, _, qualname = ref.partition(":")
    pydantic = sys.modules.get("pydantic")
    target = sys.modules.get(module)
    if pydantic is None or target is None or not module.startswith(DEFAULT_ALLOWED_PACKAGES):
        return None
    cls = _attribute_path(target, qualname)
    return cls if cls is not None and issubclass(cls, pydantic.BaseModel) else None


def _attribute_path(obj: Any, qualname: str) -> type | None:
    """The class at ``qualname`` under a module, walked through the ``__dict__`` of modules and
    classes only: no ``getattr``, so no module ``__getattr__`` (a lazy import), no property, no
    descriptor and no metaclass hook runs, and nothing is imported. None unless it ends at a class."""
    for part in qualname.split("."):
        if not part.isidentifier() or part.startswith("__"):
            return None
        if not (issubclass(type(obj), ModuleType) or issubclass(type(obj), type)):
            return None  # an instance on the way (a module-level object): its attributes are code
        obj = _own_dict(obj).get(part)
    return obj if issubclass(type(obj), type) else None


def _own_dict(obj: Any) -> Any:
    """A module's or a class's own namespace, read through the C-level descriptors (a subclass of
    ModuleType or a metaclass cannot substitute a ``__dict__`` property)."""
    descriptor: Any = vars(ModuleType if issubclass(type(obj), ModuleType) else type)["__dict__"]
    return descriptor.__get__(obj) or {}


def class_refs(data: Any) -> Iterable[str]:
    """Every class reference inside an encoded value (to tell whether it can be restored yet)."""
    if isinstance(data, list):
        for item in data:
            yield from class_refs(item)
    elif isinstance(data, dict):
        if isinstance(data.get("class"), str) and TAG in data:
            yield data["class"]
        for value in data.values():
            yield from class_refs(value)


def show(data: Any, limit: int | None = None) -> str:
    """Typed JSON (as ``encode`` wrote it) as a person reads the value: Python's notation
    (``{0: 0, 1: 1}``, ``{1, 2}``, ``(1, 'a')``, ``Point(x=1, y=2)``), built from the data alone
    (no class is looked up). ``limit``: at most that many characters, ending in ``…``."""
    parts: list[str] = []
    _show(data, parts, [0], limit)
    text = "".join(parts)
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def _show(data: Any, out: list[str], used: list[int], limit: int | None) -> None:
    if limit is not None and used[0] > limit:
        return
    if isinstance(data, dict):
        tag = data.get(TAG)
        if isinstance(tag, str):
            _show_tagged(tag, data, out, used, limit)
        else:
            _items(out, used, limit, "{", "}", [(repr(k) + ": ", v) for k, v in data.items()])
    elif isinstance(data, list):
        _items(out, used, limit, "[", "]", [("", v) for v in data])
    else:
        text = repr(data)
        out.append(text)
        used[0] += len(text)


def _show_tagged(tag: str, data: dict, out: list[str], used: list[int], limit: int | None) -> None:
    items = data.get("v")
    name = str(data.get("class", "")).rpartition(":")[2].rpartition(".")[2] or tag
    if tag == "dict" and isinstance(items, list):
        pairs = [p for p in items if isinstance(p, list) and len(p) == 2]
        _items(out, used, limit, "{", "}", [(show(k) + ": ", v) for k, v in pairs])
    elif tag == "tuple" and isinstance(items, list):
        _items(out, used, limit, "(", ",)" if len(items) == 1 else ")", [("", v) for v in items])
    elif tag in ("set", "frozenset") and isinstance(items, list):
        if not items:
            out.append(f"{tag}()")
        else:
            _items(out, used, limit, "{" if tag == "set" else "frozenset({", "}" if tag == "set" else "})",
                   [("", v) for v in items])
    elif tag in ("dataclass", "pydantic") and isinstance(items, dict):
        _items(out, used, limit, f"{name}(", ")", [(f"{k}=", v) for k, v in items.items()])
    elif tag == "namedtuple" and isinstance(items, list):
        _items(out, used, limit, f"{name}(", ")", [("", v) for v in items])
    elif tag == "enum":
        out.append(f"{name}.{items}")
    elif tag == "float":
        out.append(f"float({items!r})")
    elif isinstance(items, (str, int, float)):
        out.append(f"{tag}({items!r})" if tag not in ("ndarray", "dataframe", "series") else f"<{tag}>")
    else:
        out.append(f"<{tag}>")
    used[0] += len(out[-1])


def _items(out: list[str], used: list[int], limit: int | None, open_: str, close: str, items: list[tuple[str, Any]]) -> None:
    out.append(open_)
    used[0] += len(open_)
    for i, (prefix, value) in enumerate(items):
        if limit is not None and used[0] > limit:
            out.append("…")
            break
        if i:
            out.append(", ")
        out.append(prefix)
        used[0] += len(prefix) + 2
        _show(value, out, used, limit)
    out.append(close)
    used[0] += len(close)


def changes(old: Any, new: Any, name: str = "", limit: int = 5, width: int = 60) -> list[tuple[str, str, str]]:
    """Where two typed-JSON values differ, as (path, old, new) shown for people: a dict or list is
    compared key by key (``results[5]: 125 → 2.5``), anything else as a whole; at most ``limit``."""
    out: list[tuple[str, str, str]] = []
    _changes(old, new, name, out, limit, width)
    return out


_MISSING = "<absent>"


def _entries(data: Any) -> dict | None:
    """A dict or list's entries as {key shown: value}; None for anything else."""
    if isinstance(data, list):
        return {f"[{i}]": v for i, v in enumerate(data)}
    if isinstance(data, dict) and TAG not in data:
        return {f"[{k!r}]": v for k, v in data.items()}
    if isinstance(data, dict) and data.get(TAG) == "dict" and isinstance(data.get("v"), list):
        return {f"[{show(p[0])}]": p[1] for p in data["v"] if isinstance(p, list) and len(p) == 2}
    return None


def _changes(old: Any, new: Any, path: str, out: list, limit: int, width: int) -> None:
    if len(out) >= limit or old == new:
        return
    a, b = _entries(old), _entries(new)
    if a is None or b is None or type(old) is not type(new):
        out.append((path, _MISSING if old is _MISSING else show(old, width), _MISSING if new is _MISSING else show(new, width)))
        return
    for key in list(a) + [k for k in b if k not in a]:
        if len(out) >= limit:
            return
        left, right = a.get(key, _MISSING), b.get(key, _MISSING)
        if left != right:
            if left is _MISSING or right is _MISSING:
                out.append((path + key, _MISSING if left is _MISSING else show(left, width),
                            _MISSING if right is _MISSING else show(right, width)))
            else:
                _changes(left, right, path + key, out, limit, width)
