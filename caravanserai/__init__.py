"""caravanserai: durable, human-readable AI-agent runs for Python and Jupyter.

Checkpoint at natural stopping points (``checkpoint``, ``@resumable``, ``resumable_iterate``,
``with durable(run_id) as run``); a ``kill -9`` loses nothing acknowledged; every run leaves a
journal and waypoint notes a person can read (``caravanserai show RUN``).
"""

from __future__ import annotations

from . import _moved
from ._version import __version__
from .agents.agent import Agent, DiskDurableStore, Durable, RunResult, Tool, agent, run, tool
from .calls import http_journal
from .calls.http_journal import UnjournaledCallWarning
from .calls.journaled import current_idempotency_key
from .calls.ledger import Budget, Receipt
from .calls.models import Model, ModelResponse, OpenAICompatibleModel, auto
from .checkpoints.agent import DurableAgent
from .errors import (
    AgentMismatch,
    AgentNotStarted,
    AmbiguousId,
    BudgetChanged,
    BudgetExceeded,
    CallError,
    CaravanseraiError,
    CheckpointCorruptionError,
    CheckpointError,
    CheckpointFormatError,
    ClassNotAllowed,
    ConversationMismatch,
    DefinitionChanged,
    DurableOptionConflict,
    ForeignLease,
    HttpInsecure,
    HttpTokenRequired,
    HttpUnauthorized,
    IdentityMismatch,
    InputMismatch,
    InvalidInput,
    InvalidObjectKey,
    InvalidPutMode,
    InvalidRunId,
    InvalidStoreUrl,
    ItemsChanged,
    JournalCorruptionError,
    LeaseLost,
    LeaseTtlInvalid,
    MaxTurnsExceeded,
    MissingExtra,
    ModelError,
    ModelFingerprintMismatch,
    ModelNotChosen,
    ModelNotConfigured,
    NoCurrentRun,
    NoSuchCall,
    NoSuchWaypoint,
    ObjectCompactionInvalid,
    ObjectConditionalPutRequired,
    ObjectLeaseTtlInvalid,
    ObjectNotFound,
    ObjectPreconditionFailed,
    ResumeError,
    ResumeNotConfirmed,
    RunClosed,
    RunError,
    RunExists,
    RunLocked,
    RunNotFound,
    SequenceMismatch,
    SerializationError,
    SessionMismatch,
    StoreError,
    StoreFull,
    StoreRequestRejected,
    StoreRequestTooLarge,
    StoreUnavailable,
    ToolEffectUncertain,
    ToolFailed,
    UndigestableValue,
    UnknownNode,
    UnknownStoreScheme,
    UnsupportedClient,
    UntrustedPickle,
    UsageError,
    ValueRestoreError,
)
from .runs.api import checkpoint, clean, complete, history, last_updated, load_command, load_latest, resumable
from .runs.fork import fork
from .runs.iterate import resumable_iterate
from .runs.lifecycle import current_run, durable
from .runs.openai_client import durable_client
from .runs.run import Run, Waypoint
from .runs.settle import settle
from .runs.summary import input_is_replayable, run_summary
from .runs.trust import trust_store
from .runs.values import allow_class
from .runs.view import RunView, inspect_run
from .stores import (
    IfVersion,
    LocalDirectoryStore,
    LocalObjects,
    LocalStore,
    MemoryObjects,
    MemoryStore,
    Objects,
    ObjectStore,
    Store,
    open_store,
)

__all__ = [
    "Agent",
    "AgentMismatch",
    "AgentNotStarted",
    "AmbiguousId",
    "Budget",
    "BudgetChanged",
    "BudgetExceeded",
    "CallError",
    "CaravanseraiError",
    "CheckpointCorruptionError",
    "CheckpointError",
    "CheckpointFormatError",
    "ClassNotAllowed",
    "ConversationMismatch",
    "DefinitionChanged",
    "DiskDurableStore",
    "Durable",
    "DurableAgent",
    "DurableOptionConflict",
    "ForeignLease",
    "HttpInsecure",
    "HttpTokenRequired",
    "HttpUnauthorized",
    "IdentityMismatch",
    "IfVersion",
    "InputMismatch",
    "InvalidInput",
    "InvalidObjectKey",
    "InvalidPutMode",
    "InvalidRunId",
    "InvalidStoreUrl",
    "ItemsChanged",
    "JournalCorruptionError",
    "LeaseLost",
    "LeaseTtlInvalid",
    "LocalDirectoryStore",
    "LocalObjects",
    "LocalStore",
    "MaxTurnsExceeded",
    "MemoryObjects",
    "MemoryStore",
    "MissingExtra",
    "Model",
    "ModelError",
    "ModelFingerprintMismatch",
    "ModelNotChosen",
    "ModelNotConfigured",
    "ModelResponse",
    "NoCurrentRun",
    "NoSuchCall",
    "NoSuchWaypoint",
    "ObjectCompactionInvalid",
    "ObjectConditionalPutRequired",
    "ObjectLeaseTtlInvalid",
    "ObjectNotFound",
    "ObjectPreconditionFailed",
    "ObjectStore",
    "Objects",
    "OpenAICompatibleModel",
    "Receipt",
    "ResumeError",
    "ResumeNotConfirmed",
    "Run",
    "RunClosed",
    "RunError",
    "RunExists",
    "RunLocked",
    "RunNotFound",
    "RunResult",
    "RunView",
    "SequenceMismatch",
    "SerializationError",
    "SessionMismatch",
    "Store",
    "StoreError",
    "StoreFull",
    "StoreRequestRejected",
    "StoreRequestTooLarge",
    "StoreUnavailable",
    "Tool",
    "ToolEffectUncertain",
    "ToolFailed",
    "UndigestableValue",
    "UnjournaledCallWarning",
    "UnknownNode",
    "UnknownStoreScheme",
    "UnsupportedClient",
    "UntrustedPickle",
    "UsageError",
    "ValueRestoreError",
    "Waypoint",
    "agent",
    "allow_class",
    "auto",
    "checkpoint",
    "clean",
    "complete",
    "current_idempotency_key",
    "current_run",
    "durable",
    "durable_client",
    "fork",
    "history",
    "http_journal",
    "input_is_replayable",
    "inspect_run",
    "last_updated",
    "load_command",
    "load_ipython_extension",
    "load_latest",
    "open_store",
    "resumable",
    "resumable_iterate",
    "run",
    "run_summary",
    "settle",
    "tool",
    "trust_store",
    "unload_ipython_extension",
    "__version__",
]

_moved.install()


def load_ipython_extension(ipython):  # pragma: no cover - exercised through IPython
    """``%load_ext caravanserai``: imports the notebook layer only now (IPython stays optional)."""
    from .ipython_ext import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython):  # pragma: no cover - exercised through IPython
    from .ipython_ext import unload_ipython_extension as unload

    unload(ipython)
