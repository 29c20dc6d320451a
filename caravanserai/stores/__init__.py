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

Names: a journal store is a ``…Store`` (``LocalStore``, ``MemoryStore``, ``SqliteStore``,
``PostgresStore``, ``SqlStore``, ``BucketStore``, ``HttpStore``), an object face is ``…Objects``
(``LocalObjects``, ``MemoryObjects``, ``S3Objects``, ``GCSObjects``, ``ObstoreObjects``), all under
the one ``Objects`` contract; the seed's names (``DiskDurableStore``, ``SqlDurableStore``,
``HttpDurableStore``, ``ObjectDurableStore``, ``LocalDirectoryStore``...) stay as aliases.

An unknown scheme raises ``UnknownStoreScheme`` listing the known ones; a scheme whose extra is
missing raises ``MissingExtra`` naming the ``pip install`` to run; an unknown option, a malformed
URL or a known scheme written without ``//`` (``sqlite:runs.db``: not a directory named
``sqlite:``) raises ``InvalidStoreUrl`` with the form to use. ``docs/stores.md`` has the options
of every scheme. Stores are cached per URL; ``store.close()`` takes one out of the cache.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable

from ..errors import InvalidStoreUrl, MissingExtra, UnknownStoreScheme
from .base import _OPEN, IfVersion, Lease, Objects, ObjectStore, PrefixedObjects, PutMode, Store
from .local.store import LocalDirectoryStore, LocalObjects, LocalStore
from .memory import MemoryObjects, MemoryStore
from .urls import parse_bool, redact

__all__ = [
    "IfVersion",
    "Lease",
    "LocalDirectoryStore",
    "LocalObjects",
    "LocalStore",
    "MemoryObjects",
    "MemoryStore",
    "ObjectStore",
    "Objects",
    "PrefixedObjects",
    "PutMode",
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
    "s3": ("caravanserai.stores.objects", "BucketStore", "s3"),
    "gs": ("caravanserai.stores.objects", "BucketStore", "s3"),
    "az": ("caravanserai.stores.objects", "BucketStore", "s3"),
    "http": ("caravanserai.stores.http", "HttpStore", "http"),
    "https": ("caravanserai.stores.http", "HttpStore", "http"),
}

StoreLike = Store | str | os.PathLike | None


def register_scheme(scheme: str, module: str, class_name: str, extra: str | None = None) -> None:
    """Make ``open_store`` route ``scheme://`` URLs to ``module.class_name.from_url``."""
    _SCHEMES[scheme] = (module, class_name, extra)


def default_store_url() -> str:
    """``$CARAVANSERAI_STORE`` or ``./.caravanserai`` resolved against the current directory now."""
    return os.environ.get(ENV_VAR) or os.path.join(os.getcwd(), DEFAULT_STORE)


def open_store(url: StoreLike = None) -> Store:
    """Return the store for ``url`` (a Store passes through; None means the default store).

    Stores are cached per URL within a process, so every call site shares one writer state.
    """
    if isinstance(url, Store):
        return url
    if url is None:
        url = default_store_url()
    # fast path: checkpoint() in a loop resolves the same store each call
    cached = _OPEN.get(url) if isinstance(url, str) else None
    if cached is not None:
        return cached
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str) or not url:
        raise UnknownStoreScheme(f"store must be a URL, a path or a Store, got {url!r}", url=repr(url))
    scheme = url.split("://", 1)[0].lower() if "://" in url else "file"
    if scheme == "file" and "://" not in url:
        _refuse_scheme_without_slashes(url)
        if "?" in url and re.search(r"\?(?:.*&)?signed(?:=|&|$)", url):  # a path rarely has one: no regex to compile
            raise InvalidStoreUrl(f"{url!r} is a path, which takes no options: write file:///absolute/path?signed=1 "
                                  "for a signed local journal", url=url, option="signed")
        url = os.path.abspath(os.path.expanduser(url))
    cached = _OPEN.get(url)
    if cached is not None:
        return cached
    entry = _SCHEMES.get(scheme)
    if entry is None:
        known = ", ".join(sorted(f"{s}://" for s in _SCHEMES))
        raise UnknownStoreScheme(f"unknown store scheme {scheme!r} in {redact(url)!r}; use one of: {known} or a path",
                                 url=redact(url), scheme=scheme)
    module_name, class_name, extra = entry
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise MissingExtra(
            f"the {scheme}:// store needs extra packages ({exc.name}): pip install 'caravanserai[{extra}]'",
            scheme=scheme, extra=extra,
        ) from exc
    factory: Callable[[str], Store] = getattr(module, class_name).from_url
    bare, signed = _signed_option(url) if "://" in url else (url, False)
    store = factory(bare)
    if signed:
        from ..signing import line_signer

        store.journal_signer, store.opened_url = line_signer(), url
    _OPEN[url] = store
    return store


def _signed_option(url: str) -> tuple[str, bool]:
    """The URL without ``signed=…`` (an option every scheme takes, read here), and whether it asks for a
    signed journal."""
    base, mark, query = url.partition("?")
    if not mark:
        return url, False
    pairs = [pair for pair in query.split("&") if pair]
    mine = [pair for pair in pairs if pair.split("=", 1)[0] == "signed"]
    if any("=" not in pair or not pair.split("=", 1)[1] for pair in mine):
        raise InvalidStoreUrl(f"option signed in {redact(url)!r} needs a value: signed=1 (sign every journal line) or "
                              "signed=0", url=redact(url), option="signed")
    if not mine:
        return url, False
    if len(mine) > 1:
        raise InvalidStoreUrl(f"store URL {redact(url)!r} gives the option 'signed' twice; give it once", url=redact(url))
    value = mine[0].partition("=")[2]
    try:
        signed = parse_bool(value)
    except ValueError:
        raise InvalidStoreUrl(f"option signed={value!r} in {redact(url)!r}: expected true or false", url=redact(url),
                              option="signed") from None
    rest = [pair for pair in pairs if pair not in mine]
    return base + ("?" + "&".join(rest) if rest else ""), signed


_SCHEME_PREFIX = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):(/?)(.*)", re.DOTALL)
_FORMS = {
    "file": "file:///absolute/path or a plain path",
    "memory": "memory://name",
    "sqlite": "sqlite:///runs.db (relative to the current directory) or sqlite:////abs/path/runs.db",
    "postgresql": "postgresql://user@host:5432/db",
    "postgres": "postgresql://user@host:5432/db",
    "s3": "s3://bucket/prefix",
    "gs": "gs://bucket/prefix",
    "az": "az://container/prefix",
    "http": "http://127.0.0.1:8765 (loopback) or https://host/prefix",
    "https": "https://host/prefix",
}


def _refuse_scheme_without_slashes(path: str) -> None:
    """A known scheme and ':' without '//' (``sqlite:runs.db``, ``s3:/x``) is a mistyped URL, not a
    directory literally named ``sqlite:``: refuse it with the right form."""
    match = _SCHEME_PREFIX.fullmatch(path)
    if match is None or match.group(1).lower() not in _SCHEMES:
        return
    scheme = match.group(1).lower()
    form = _FORMS.get(scheme, f"{scheme}://...")
    raise InvalidStoreUrl(f"store URL {path!r} is missing the '//' after '{scheme}:'; use {form} (a directory whose "
                          "name starts with a scheme needs ./ in front)", url=path, scheme=scheme)
