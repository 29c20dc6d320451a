"""The object face on object storage (S3, GCS, Azure, memory) through obstore.

``put_if_absent`` is a conditional create (S3 ``If-None-Match: *``, GCS
``x-goog-if-generation-match: 0``), so of concurrent writers exactly one wins, with no lock.
Needs ``pip install 'caravanserai[s3]'``.

obstore reports failures as multi-line Rust debug dumps and, for some bad configurations, as a
``pyo3_runtime.PanicException`` (a ``BaseException``). Every one of them leaves here as a
one-line ``StoreUnavailable``: the first meaningful line, no dump, and never the address of a
cloud metadata service: a failed credentials lookup says which environment variables to set.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import MissingExtra, StoreUnavailable
from .base import ObjectStore
from .urls import first_line, redact


def _obstore():
    try:
        import obstore
        from obstore import exceptions
    except ImportError as exc:
        raise MissingExtra("object storage needs obstore: pip install 'caravanserai[s3]'", extra="s3") from exc
    return obstore, exceptions


class _Missing(Exception):
    pass


class _Exists(Exception):
    pass


CREDENTIAL_HINTS = {
    "s3": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (plus AWS_SESSION_TOKEN for temporary credentials), or add "
          "access_key_id=...&secret_access_key=... to the store URL, or skip_signature=true for a public bucket",
    "gs": "set GOOGLE_SERVICE_ACCOUNT (a service-account key file) or GOOGLE_APPLICATION_CREDENTIALS, or add "
          "service_account=... to the store URL",
    "az": "set AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_SAS_KEY), or add "
          "account_name=...&account_key=... to the store URL",
}
_GENERIC_HINT = "set your cloud's credential environment variables or pass the credentials explicitly"

# A credentials lookup that fell through to an instance-metadata service (EC2, GCE, Azure IMDS).
_METADATA = re.compile(r"169\.254\.169\.254|fd00:ec2::254|/latest/api/token|/latest/meta-data|metadata\.google\."
                       r"internal|computeMetadata|/metadata/identity|/metadata/instance|credentials? (?:provider|"
                       r"chain)|missing credentials|no credentials", re.IGNORECASE)


_XML_CODE = re.compile(r"<Code>([^<]{1,100})</Code>")
_XML_MESSAGE = re.compile(r"<Message>([^<]{1,200})</Message>")


def is_panic(error: BaseException) -> bool:
    """True for pyo3's ``PanicException`` (a BaseException; not importable by name)."""
    return type(error).__name__ == "PanicException"


def describe_failure(error: BaseException, description: str) -> StoreUnavailable:
    """The one-line StoreUnavailable for an obstore failure on ``description`` ("s3://bucket")."""
    text = str(error)
    scheme = description.split("://", 1)[0] if "://" in description else ""
    if _METADATA.search(text):
        return StoreUnavailable(f"object store {description} has no credentials: "
                                f"{CREDENTIAL_HINTS.get(scheme, _GENERIC_HINT)}", url=description)
    line = redact(first_line(error))
    cut = line.find(": <?xml")
    if cut >= 0:  # the server's XML error body: keep its code and message, not the markup
        code, message = _XML_CODE.search(text), _XML_MESSAGE.search(text)
        line = line[:cut] + (f" ({code.group(1)}{': ' + message.group(1) if message else ''})" if code else "")
    if is_panic(error):
        line = f"obstore failed internally ({line})"
    return StoreUnavailable(f"object store {description} failed: {line}; check the endpoint, bucket and credentials",
                            url=description)


class ObstoreObjects(ObjectStore):
    """Objects in any obstore store (``obstore.store.S3Store(...)``, ``GCSStore``, ``MemoryStore``...)."""

    def __init__(self, store: Any, description: str = "") -> None:
        self.store = store
        self.description = description or repr(store)

    def _call(self, fn, *args, **kwargs):
        """Run an obstore call, mapping its errors (obstore raises both its own and builtin ones)."""
        _, exc = _obstore()
        try:
            return fn(*args, **kwargs)
        except (exc.NotFoundError, FileNotFoundError):
            raise _Missing from None
        except (exc.AlreadyExistsError, exc.PreconditionError, FileExistsError):
            raise _Exists from None
        except (exc.BaseError, OSError, RuntimeError, ValueError) as error:
            raise describe_failure(error, self.description) from None
        except BaseException as error:  # a Rust panic; KeyboardInterrupt and SystemExit pass through
            if is_panic(error):
                raise describe_failure(error, self.description) from None
            raise

    def put(self, key: str, data: bytes) -> None:
        obs, _ = _obstore()
        self._call(obs.put, self.store, self.check_key(key), bytes(data))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        obs, _ = _obstore()
        try:
            self._call(obs.put, self.store, self.check_key(key), bytes(data), mode="create")
        except _Exists:
            return False
        return True

    def get(self, key: str) -> bytes:
        obs, _ = _obstore()
        try:
            return self._call(lambda: bytes(obs.get(self.store, key).bytes()))
        except _Missing:
            raise self._missing(key) from None

    def exists(self, key: str) -> bool:
        obs, _ = _obstore()
        try:
            self._call(obs.head, self.store, key)
        except _Missing:
            return False
        return True

    def list(self, prefix: str = "") -> list[str]:
        obs, _ = _obstore()

        def collect() -> list[str]:  # the listing streams: errors surface while iterating
            return [meta["path"] for batch in obs.list(self.store, prefix=prefix or None) for meta in batch]

        try:
            keys = self._call(collect)
        except _Missing:
            return []
        return sorted(k for k in keys if k.startswith(prefix))

    def delete(self, key: str) -> bool:
        obs, _ = _obstore()
        if not self.exists(key):
            return False
        try:
            self._call(obs.delete, self.store, key)
        except _Missing:
            return False
        return True

    def __repr__(self) -> str:
        return f"ObstoreObjects({self.description})"
