"""Checkpoint stores: the object face of caravanserai's one Store abstraction, for checkpoint bytes.

``put``, ``get``, ``exists``, ``list``, ``delete`` and an atomic ``put_if_absent``; any object
face works (``store.objects`` of a full Store too). These are the seed's names for the common
ones: a local directory, process memory, S3 and GCS through obstore.
"""

from __future__ import annotations

from typing import Any

from ..stores.base import ObjectStore
from ..stores.local.store import LocalDirectoryStore
from ..stores.memory import MemoryObjects, _Space
from ..stores.obstore_objects import ObstoreObjects

__all__ = ["CheckpointStore", "GCSStore", "LocalDirectoryStore", "MemoryCheckpointStore", "S3Store"]

CheckpointStore = ObjectStore


class MemoryCheckpointStore(MemoryObjects):
    """Checkpoints in process memory (tests, demos)."""

    def __init__(self) -> None:
        super().__init__(_Space(), "memory://checkpoints")


class S3Store(ObstoreObjects):
    """Checkpoints in an S3 bucket (or any S3-compatible server) through obstore.

    ``S3Store("my-bucket", prefix="caravanserai", endpoint="http://127.0.0.1:5555",
    access_key_id=..., secret_access_key=..., region=...)``; other keyword arguments go to
    ``obstore.store.S3Store``. ``put_if_absent`` is a conditional create (``If-None-Match``).
    """

    def __init__(self, bucket: str, prefix: str | None = None, **config: Any) -> None:
        from obstore.store import S3Store as ObstoreS3

        endpoint = config.get("endpoint") or config.get("aws_endpoint")
        options = dict(config.pop("client_options", {}) or {})
        if endpoint and str(endpoint).startswith("http://"):
            options.setdefault("allow_http", True)
        super().__init__(ObstoreS3(bucket, prefix=prefix, client_options=options or None, **config),
                         f"s3://{bucket}/{prefix or ''}")


class GCSStore(ObstoreObjects):
    """Checkpoints in a Google Cloud Storage bucket through obstore (``x-goog-if-generation-match: 0``
    for ``put_if_absent``). Pass credentials (e.g. ``bearer_token=``) explicitly in tests: without
    them obstore asks the GCE metadata server."""

    def __init__(self, bucket: str, prefix: str | None = None, **config: Any) -> None:
        from obstore.store import GCSStore as ObstoreGCS

        options = dict(config.pop("client_options", {}) or {})
        url = config.get("base_url") or ""
        if str(url).startswith("http://"):
            options.setdefault("allow_http", True)
        super().__init__(ObstoreGCS(bucket, prefix=prefix, client_options=options or None, **config),
                         f"gs://{bucket}/{prefix or ''}")
