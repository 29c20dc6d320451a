"""The object face on object storage (S3, GCS, Azure, memory) through obstore: ``ObstoreObjects``,
and ``S3Objects`` / ``GCSObjects`` built from a bucket name (the seed's ``S3Store`` / ``GCSStore``).

Put modes are obstore's own: ``"create"`` is a conditional create (S3 ``If-None-Match: *``, GCS
``x-goog-if-generation-match: 0``), so of concurrent writers exactly one wins, with no lock;
``IfVersion(v)`` is obstore's update mode (``If-Match`` on the e-tag, or the GCS generation), so
these faces have compare-and-swap (``supports_cas``). A version is the JSON of the e-tag and
version the server sent. Needs ``pip install 'caravanserai[s3]'``.

obstore reports failures as multi-line Rust debug dumps and, for some bad configurations, as a
``pyo3_runtime.PanicException`` (a ``BaseException``). Every one of them leaves here as a
one-line ``StoreUnavailable``: the first meaningful line, no dump, and never the address of a
cloud metadata service: a failed credentials lookup says which environment variables to set.
"""

from __future__ import annotations

import builtins
import json
import re
from typing import TYPE_CHECKING, Any, cast

from ..errors import MissingExtra, StoreUnavailable
from .base import IfVersion, Objects, PutMode
from .urls import first_line, redact

if TYPE_CHECKING:
    from obstore.store import ClientConfig

__all__ = ["GCSObjects", "ObstoreObjects", "S3Objects", "describe_failure"]


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


# the server's error code, never a key that happens to contain the word
_NO_BUCKET = re.compile(r"(?<=\()(NoSuchBucket|ContainerNotFound)(?=: )|(?<=<Code>)(NoSuchBucket|ContainerNotFound)(?=</Code>)")


def describe_failure(error: BaseException, description: str) -> StoreUnavailable:
    """The one-line StoreUnavailable for an obstore failure on ``description`` ("s3://bucket")."""
    text = str(error)
    scheme = description.split("://", 1)[0] if "://" in description else ""
    if _METADATA.search(text):
        return StoreUnavailable(f"object store {description} has no credentials: "
                                f"{CREDENTIAL_HINTS.get(scheme, _GENERIC_HINT)}", url=description)
    missing = _NO_BUCKET.search(text)
    if missing:
        return StoreUnavailable(f"object store {description}: the bucket (or container) does not exist ({missing.group()}); "
                                "create it, or fix the bucket in the store URL", url=description)
    line = redact(first_line(error))
    cut = line.find(": <?xml")
    if cut >= 0:  # the server's XML error body: keep its code and message, not the markup
        code, message = _XML_CODE.search(text), _XML_MESSAGE.search(text)
        line = line[:cut] + (f" ({code.group(1)}{': ' + message.group(1) if message else ''})" if code else "")
    if is_panic(error):
        line = f"obstore failed internally ({line})"
    return StoreUnavailable(f"object store {description} failed: {line}; check the endpoint, bucket and credentials",
                            url=description)


class ObstoreObjects(Objects):
    """Objects in any obstore store (``obstore.store.S3Store(...)``, ``GCSStore``, ``MemoryStore``...)."""

    supports_cas = True
    parallel_gets = 16  # obstore's blocking calls release the GIL

    def __init__(self, store: Any, description: str = "") -> None:
        self.store = store
        self.description = description or repr(store)

    def _call(self, fn, *args, **kwargs):
        """Run an obstore call, mapping its errors (obstore raises both its own and builtin ones)."""
        _, exc = _obstore()
        try:
            return fn(*args, **kwargs)
        except (exc.NotFoundError, FileNotFoundError) as error:
            if _NO_BUCKET.search(str(error)):  # not a missing key: a missing bucket (a put would read as a lost race)
                raise describe_failure(error, self.description) from None
            raise _Missing from None
        except (exc.AlreadyExistsError, exc.PreconditionError, FileExistsError):
            raise _Exists from None
        except (exc.BaseError, OSError, RuntimeError, ValueError) as error:
            raise describe_failure(error, self.description) from None
        except BaseException as error:  # a Rust panic; KeyboardInterrupt and SystemExit pass through
            if is_panic(error):
                raise describe_failure(error, self.description) from None
            raise

    def put(self, key: str, data: bytes, *, mode: PutMode = "overwrite") -> str:
        obs, _ = _obstore()
        key, mode = self.check_key(key), self.check_mode(mode)
        wire: Any = json.loads(mode.version) if isinstance(mode, IfVersion) else mode
        try:
            result = self._call(obs.put, self.store, key, bytes(data), mode=wire)
        except (_Exists, _Missing):  # a create on an existing key; an update whose version moved or vanished
            raise self._exists(key, mode) from None
        return _version(result)

    def get(self, key: str) -> bytes:
        obs, _ = _obstore()
        try:
            return self._call(lambda: bytes(obs.get(self.store, key).bytes()))
        except _Missing:
            raise self._missing(key) from None

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        obs, _ = _obstore()

        def read() -> tuple[bytes, str]:  # the body streams: errors may surface while reading it
            result = obs.get(self.store, key)
            return bytes(result.bytes()), _version(result.meta)

        try:
            return self._call(read)
        except _Missing:
            return None

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

    def list_children(self, prefix: str) -> builtins.list[str]:
        """The names directly under ``prefix`` (a ``/``-path ending in ``/``): one delimiter listing, one
        entry per folder or object, however many keys each folder holds."""
        obs, _ = _obstore()
        try:
            found = self._call(obs.list_with_delimiter, self.store, prefix.rstrip("/") or None)
        except _Missing:
            return []
        names = [p.rstrip("/") for p in found["common_prefixes"]] + [m["path"] for m in found["objects"]]
        return sorted({n[len(prefix):].split("/", 1)[0] for n in names if n.startswith(prefix) and len(n) > len(prefix)})

    def delete_many(self, keys: builtins.list[str]) -> None:
        """Remove ``keys`` (those absent are skipped) in as few requests as the store allows: one S3
        ``DeleteObjects`` per 1,000 keys."""
        obs, _ = _obstore()
        keys = [self.check_key(k) for k in keys]
        if keys:
            try:
                self._call(obs.delete, self.store, keys)
            except _Missing:
                pass

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
        return f"{type(self).__name__}({self.description})"


def _version(meta: Any) -> str:
    """The version of an object as ``IfVersion`` carries it: the e-tag and version the server sent.

    obstore 0.12 rejects None values in an update mode, so only what the server sent is kept.
    """
    return json.dumps({k: meta[k] for k in ("e_tag", "version") if meta.get(k) is not None}, sort_keys=True)


def _with_http(config: dict[str, Any], *url_keys: str) -> ClientConfig:
    """``client_options`` taken out of ``config``, with ``allow_http`` on when its endpoint is http://."""
    options = dict(config.pop("client_options", {}) or {})
    endpoint = next((config[k] for k in url_keys if config.get(k)), "")
    if str(endpoint).startswith("http://"):
        options.setdefault("allow_http", True)
    return cast("ClientConfig", options)  # the caller's client_options: obstore checks them


class S3Objects(ObstoreObjects):
    """Objects in an S3 bucket (or any S3-compatible server) through obstore.

    ``S3Objects("my-bucket", prefix="caravanserai", endpoint="http://127.0.0.1:5555",
    access_key_id=..., secret_access_key=..., region=...)``; other keyword arguments go to
    ``obstore.store.S3Store``. ``"create"`` puts send ``If-None-Match: *``, ``IfVersion`` ``If-Match``.
    """

    def __init__(self, bucket: str, prefix: str | None = None, **config: Any) -> None:
        _obstore()
        from obstore.store import S3Store as ObstoreS3

        options = _with_http(config, "endpoint", "aws_endpoint")
        super().__init__(ObstoreS3(bucket, prefix=prefix, client_options=options or None, **config),
                         f"s3://{bucket}/{prefix or ''}")


class GCSObjects(ObstoreObjects):
    """Objects in a Google Cloud Storage bucket through obstore (``x-goog-if-generation-match: 0`` for
    ``"create"`` puts). Pass credentials (e.g. ``bearer_token=``) explicitly in tests: without them
    obstore asks the GCE metadata server."""

    def __init__(self, bucket: str, prefix: str | None = None, **config: Any) -> None:
        _obstore()
        from obstore.store import GCSStore as ObstoreGCS

        options = _with_http(config, "base_url")
        super().__init__(ObstoreGCS(bucket, prefix=prefix, client_options=options or None, **config),
                         f"gs://{bucket}/{prefix or ''}")
