"""Store URL options: one parser for every scheme, so an unknown or malformed option is always an
``InvalidStoreUrl`` that lists the known ones, and messages never carry a password or a dump."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from urllib.parse import SplitResult, parse_qsl, urlsplit

from ..errors import InvalidStoreUrl, LeaseTtlInvalid, LeaseTtlOptionInvalid
from .leases import MIN_TTL_MS, check_lease_ttl

__all__ = ["MIN_TTL_MS", "check_options", "first_line", "parse_bool", "parse_options", "redact", "split_url"]
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def split_url(url: str, form: str) -> SplitResult:
    """``urlsplit(url)`` with a checked port; InvalidStoreUrl naming ``form`` (the shape to use) otherwise."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise InvalidStoreUrl(f"store URL {redact(url)!r} is not valid ({exc}); use {form}", url=redact(url)) from None
    return parts


def parse_options(query: str, known: dict[str, Callable[[str], Any]], url: str, *, shown: str | None = None,
                  lease_error: type[LeaseTtlOptionInvalid] = LeaseTtlOptionInvalid) -> dict[str, Any]:
    """The URL query's options converted by ``known``; InvalidStoreUrl (listing the known ones) otherwise.

    ``shown`` is how messages name the URL (default: ``url`` with secrets redacted); ``lease_error`` the
    error of a too-short lease option (an object store's is the seed's ``ObjectLeaseTtlOptionInvalid``).
    """
    shown = redact(shown or url)
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise InvalidStoreUrl(f"cannot read the options of {shown!r}; write them as ?name=value&name=value",
                              url=shown) from None
    return check_options(dict(pairs), known, shown, lease_error=lease_error)


def check_options(given: dict[str, str], known: dict[str, Callable[[str], Any]], url: str, *,
                  lease_error: type[LeaseTtlOptionInvalid] = LeaseTtlOptionInvalid) -> dict[str, Any]:
    """``given`` converted by ``known`` (name -> converter); ``url`` (already redacted) names the URL."""
    unknown = set(given) - set(known)
    if unknown:
        raise InvalidStoreUrl(f"unknown option(s) {', '.join(sorted(unknown))} in {url!r}; known: "
                              f"{', '.join(sorted(known))}", url=url, unknown=sorted(unknown))
    converted = {}
    for name, value in given.items():
        try:
            converted[name] = known[name](value)
        except (TypeError, ValueError):
            raise InvalidStoreUrl(f"option {name}={value!r} in {url!r} is not valid: {_expects(known[name])}",
                                  url=url, option=name) from None
    if "table" in converted and not _IDENT.fullmatch(converted["table"]):
        raise InvalidStoreUrl(f"option table={converted['table']!r} in {url!r} must be a plain SQL identifier "
                              "([A-Za-z_][A-Za-z0-9_]*)", url=url, option="table")
    for name in ("lease_ttl_ms", "lock_ttl_ms"):  # the one check (leases.py): the one error, also a URL error
        if name in converted:
            try:
                check_lease_ttl(converted[name], option=name)
            except LeaseTtlInvalid:
                raise lease_error(f"option {name}={converted[name]} in {url!r} is below the minimum "
                                  f"{MIN_TTL_MS}; use {MIN_TTL_MS} or more", url=url, option=name,
                                  lease_ttl_ms=converted[name], minimum=MIN_TTL_MS) from None
    return converted


def parse_bool(value: str) -> bool:
    """``true/false``, ``1/0``, ``yes/no``, ``on/off`` (any case); ValueError otherwise."""
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(value)


def _expects(convert: Callable[[str], Any]) -> str:
    if convert is int:
        return "expected an integer"
    if convert is parse_bool:
        return "expected true or false"
    return "expected a plain value"


def first_line(exc: BaseException) -> str:
    """The first non-empty line of ``exc``'s message (drivers append DETAIL/HINT lines and dumps)."""
    for line in str(exc).splitlines():
        if line.strip():
            return " ".join(line.split())[:300]
    return type(exc).__name__


_PASSWORD_IN_NETLOC = re.compile(r"(://[^:/@\s]*):[^@/\s]*@")
_PASSWORD_OPTION = re.compile(r"((?:^|[?&\s])(?:password|secret_access_key|session_token|token|account_key|sas_key|"
                              r"client_secret)=)[^&\s]*", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with URL passwords and secret options replaced by ``***``."""
    return _PASSWORD_OPTION.sub(r"\1***", _PASSWORD_IN_NETLOC.sub(r"\1:***@", text))
