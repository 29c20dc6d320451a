"""Choose a store by URL: ``open_store(url)``; ``CARAVANSERAI_STORE`` sets the default.

=====================================  ==============================  ==========================
URL                                    backend                         install
=====================================  ==============================  ==========================
``./.caravanserai``, ``/path``,        local directory (default)       core
``file:///path``
``memory://name``                      in-process                      core
``sqlite:///path.db``                  SQLite (WAL, synchronous=FULL)  core
``postgresql://user@host/db``          PostgreSQL (psycopg 3)          ``[postgres]``
``s3://bucket/prefix``, ``gs://``,     object storage (obstore)        ``[s3]``
``az://``
``https://host/prefix``                journal service client          ``[http]``
(``http://`` on loopback only)
=====================================  ==============================  ==========================

Further schemes (``sqlite``, ``postgresql``, ``s3``/``gs``/``az``, ``http(s)``) register here as
their backends land; an unknown scheme raises ``UnknownStoreScheme`` listing the known ones, and
a scheme whose extra is missing raises ``MissingExtra`` naming the ``pip install`` to run.
"""

from __future__ import annotations

import importlib
import os
from typing import Callable, Union

from ..errors import MissingExtra, UnknownStoreScheme
from .base import Lease, ObjectStore, Store
from .local import LocalDirectoryStore, LocalStore
from .memory import MemoryStore

__all__ = [
    "LocalDirectoryStore",
    "LocalStore",
    "Lease",
    "MemoryStore",
    "ObjectStore",
    "Store",
    "default_store_url",
    "open_store",
    "register_scheme",
]

DEFAULT_STORE = ".caravanserai"
ENV_VAR = "CARAVANSERAI_STORE"

# scheme -> (module, class name, extra that provides its dependencies)
_SCHEMES: dict[str, tuple[str, str, str | None]] = {
    "file": ("caravanserai.stores.local", "LocalStore", None),
    "memory": ("caravanserai.stores.memory", "MemoryStore", None),
    "sqlite": ("caravanserai.stores.sql", "SqliteStore", None),
    "postgresql": ("caravanserai.stores.postgres", "PostgresStore", "postgres"),
    "postgres": ("caravanserai.stores.postgres", "PostgresStore", "postgres"),
    "s3": ("caravanserai.stores.objects", "ObjectDurableStore", "s3"),
    "gs": ("caravanserai.stores.objects", "ObjectDurableStore", "s3"),
    "az": ("caravanserai.stores.objects", "ObjectDurableStore", "s3"),
    "http": ("caravanserai.stores.http", "HttpDurableStore", "http"),
    "https": ("caravanserai.stores.http", "HttpDurableStore", "http"),
}

StoreLike = Union[Store, str, os.PathLike, None]


def register_scheme(scheme: str, module: str, class_name: str, extra: str | None = None) -> None:
    """Make ``open_store`` route ``scheme://`` URLs to ``module.class_name.from_url``."""
    _SCHEMES[scheme] = (module, class_name, extra)


def default_store_url() -> str:
    """``$CARAVANSERAI_STORE`` or ``./.caravanserai`` resolved against the current directory now."""
    return os.environ.get(ENV_VAR) or os.path.join(os.getcwd(), DEFAULT_STORE)


_OPEN: dict[str, Store] = {}


def open_store(url: StoreLike = None) -> Store:
    """Return the store for ``url`` (a Store passes through; None means the default store).

    Stores are cached per URL within a process, so every call site shares one writer state.
    """
    if isinstance(url, Store):
        return url
    if url is None:
        url = default_store_url()
    cached = _OPEN.get(url)  # fast path: checkpoint() in a loop resolves the same store each call
    if cached is not None:
        return cached
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str) or not url:
        raise UnknownStoreScheme(f"store must be a URL, a path or a Store, got {url!r}", url=repr(url))
    scheme = url.split("://", 1)[0].lower() if "://" in url else "file"
    if scheme == "file" and "://" not in url:
        url = os.path.abspath(os.path.expanduser(url))
    cached = _OPEN.get(url)
    if cached is not None:
        return cached
    entry = _SCHEMES.get(scheme)
    if entry is None:
        known = ", ".join(sorted(f"{s}://" for s in _SCHEMES))
        raise UnknownStoreScheme(f"unknown store scheme {scheme!r} in {url!r}; use one of: {known} or a path", url=url, scheme=scheme)
    module_name, class_name, extra = entry
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise MissingExtra(
            f"the {scheme}:// store needs extra packages ({exc.name}): pip install 'caravanserai[{extra}]'",
            scheme=scheme, extra=extra,
        ) from exc
    factory: Callable[[str], Store] = getattr(module, class_name).from_url
    store = factory(url)
    _OPEN[url] = store
    return store
