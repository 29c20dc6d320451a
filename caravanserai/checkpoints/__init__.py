"""Checkpoints as bytes (layer 5): the DurableAgent, its checkpoint format, CheckpointLog, timelines.

``format`` is the versioned, deterministic, digest-checked byte format; ``agent`` the DurableAgent
and its backends; ``log`` the content-addressed CheckpointLog with deltas, lineage and forks;
``stores`` the checkpoint stores (object faces); ``timelines`` a run as steps and their comparison.
"""

from ..errors import CheckpointCorruptionError, CheckpointFormatError
from .agent import DurableAgent
from .log import CheckpointLog, CheckpointRecord, checkpoint_from_file_or_log, find_checkpoint, log_status
from .stores import CheckpointStore, GCSStore, LocalDirectoryStore, MemoryCheckpointStore, S3Store

__all__ = [
    "CheckpointCorruptionError",
    "CheckpointFormatError",
    "CheckpointLog",
    "CheckpointRecord",
    "CheckpointStore",
    "DurableAgent",
    "GCSStore",
    "LocalDirectoryStore",
    "MemoryCheckpointStore",
    "S3Store",
    "checkpoint_from_file_or_log",
    "find_checkpoint",
    "log_status",
]
