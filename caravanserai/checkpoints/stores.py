"""Checkpoint stores: the object face of caravanserai's one storage contract, for checkpoint bytes.

Any ``caravanserai.stores.Objects`` works (``store.objects`` of a full Store too): ``put`` with
modes ``"overwrite"`` / ``"create"`` (/ ``IfVersion`` where ``supports_cas``), ``get``, ``exists``,
``list``, ``delete`` and the derived atomic ``put_if_absent``. The seed's names for the common
faces stay, as aliases of the storage layer's ``…Objects`` classes:

- ``CheckpointStore`` is ``caravanserai.stores.Objects`` (the contract; CAS per backend);
- ``LocalDirectoryStore`` is ``caravanserai.stores.LocalObjects`` (no CAS);
- ``MemoryCheckpointStore`` is ``caravanserai.stores.MemoryObjects`` (CAS);
- ``S3Store`` / ``GCSStore`` are ``caravanserai.stores.obstore_objects.S3Objects`` / ``GCSObjects`` (CAS).
"""

from __future__ import annotations

from ..stores.base import Objects
from ..stores.local.objects import LocalDirectoryStore, LocalObjects
from ..stores.memory import MemoryObjects
from ..stores.obstore_objects import GCSObjects, S3Objects

__all__ = ["CheckpointStore", "GCSObjects", "GCSStore", "LocalDirectoryStore", "LocalObjects", "MemoryCheckpointStore",
           "MemoryObjects", "S3Objects", "S3Store"]

CheckpointStore = Objects
MemoryCheckpointStore = MemoryObjects  # MemoryCheckpointStore(): checkpoints in this process's memory
S3Store = S3Objects
GCSStore = GCSObjects
