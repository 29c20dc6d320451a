"""Every error caravanserai raises, under one base class with a stable ``code``.

The tree::

    CaravanseraiError                 (code: caravanserai_error)
    ├── InvalidRunId                  (invalid_run_id)        bad run id; nothing written
    ├── SerializationError            (serialization_error)   state is not JSON; nothing written
    ├── RunNotFound                   (run_not_found)         no such run in the store
    ├── RunLocked                     (run_locked)            another live writer holds the run
    ├── LeaseLost                     (lease_lost)            this writer's lease/lock is gone
    ├── JournalCorruptionError        (journal_corruption)    damaged or foreign journal
    ├── StoreUnavailable              (store_unavailable)     the store cannot be reached/opened
    ├── UnknownStoreScheme            (unknown_store_scheme)  open_store() got an unknown URL
    ├── MissingExtra                  (missing_extra)         a backend needs `pip install ...`
    ├── ObjectNotFound                (object_not_found)      object face: no such key
    ├── ItemsChanged                  (items_changed)         resumable_iterate input changed
    ├── ResumeError                   (resume_error)          `caravanserai resume` cannot replay
    ├── IdentityMismatch              a resume would become a different run; appends nothing
    │   ├── DefinitionChanged         (durable_definition_changed)
    │   ├── InputMismatch             (durable_input_mismatch)
    │   ├── BudgetChanged             (durable_budget_changed)
    │   ├── AgentMismatch             (durable_agent_mismatch)
    │   ├── SessionMismatch           (durable_session_mismatch)
    │   └── ConversationMismatch      (durable_conversation_mismatch)
    ├── ToolEffectUncertain           (durable_tool_effect_uncertain) a write/external tool's outcome is unknown
    ├── ToolFailed                    (tool_failed)           a journaled tool call failed (an agent shows it to the model)
    ├── BudgetExceeded                (budget_exceeded)       a call would exceed the run's budget; not sent
    ├── DurableOptionConflict         (durable_option_conflict) durable runs take budget=, not max_cost_usd=
    ├── ModelNotConfigured            (model_not_configured)  auto() found no model in the environment
    ├── HttpInsecure                  (durable_http_insecure) an http:// journal URL outside localhost
    ├── HttpTokenRequired             (durable_http_token_required) the journal service needs a token
    ├── HttpUnauthorized              (durable_http_unauthorized) the journal service refused the token (401/403)
    ├── ObjectConditionalPutRequired  (durable_object_conditional_put_required) object-store leases need conditional puts
    ├── ObjectLeaseTtlInvalid         (durable_object_lease_ttl_invalid) lease_ttl_ms below 3000
    ├── CheckpointFormatError         (checkpoint_format)     not a checkpoint this version can read
    ├── CheckpointCorruptionError     (checkpoint_corruption) damaged checkpoint bytes, or an id that does not match
    ├── ModelError                    (model_error)           the model server failed (unreachable, status, body)
    ├── UsageError                    (usage_error)           bad arguments to a command or magic (CLI exit 2)
    ├── InvalidStoreUrl               (invalid_store_url)     a store URL or option this version does not understand
    ├── StoreFull                     (store_full)            the disk or a file-size limit is full; nothing half-written
    ├── UntrustedPickle               (untrusted_pickle)      a pickled value from a store not trusted for pickle
    ├── ClassNotAllowed               (class_not_allowed)     a saved value names a class not defined here nor allowed
    ├── UnknownNode                   (unknown_node)          a checkpoint has no node with that id
    └── AmbiguousId                   (ambiguous_id)          an id prefix matches more than one id

Messages are one line naming the problem and the remedy. Errors carry their fields as
attributes (``err.run_id``...), compare by ``code`` and survive pickling (they cross process
boundaries in tests and workers).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AgentMismatch",
    "AmbiguousId",
    "BudgetChanged",
    "BudgetExceeded",
    "CaravanseraiError",
    "CheckpointCorruptionError",
    "CheckpointFormatError",
    "ClassNotAllowed",
    "ConversationMismatch",
    "DefinitionChanged",
    "DurableOptionConflict",
    "HttpInsecure",
    "HttpTokenRequired",
    "HttpUnauthorized",
    "IdentityMismatch",
    "InputMismatch",
    "InvalidRunId",
    "InvalidStoreUrl",
    "ItemsChanged",
    "JournalCorruptionError",
    "LeaseLost",
    "MissingExtra",
    "ModelError",
    "ModelNotConfigured",
    "ObjectConditionalPutRequired",
    "ObjectLeaseTtlInvalid",
    "ObjectNotFound",
    "ResumeError",
    "RunLocked",
    "RunNotFound",
    "SerializationError",
    "SessionMismatch",
    "StoreFull",
    "StoreUnavailable",
    "ToolEffectUncertain",
    "ToolFailed",
    "UnknownNode",
    "UnknownStoreScheme",
    "UntrustedPickle",
    "UsageError",
]


class CaravanseraiError(Exception):
    """Base class: ``code`` is stable across releases, ``fields`` holds the structured facts."""

    code = "caravanserai_error"

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields
        for key, value in fields.items():
            setattr(self, key, value)

    def __reduce__(self):  # keep fields across pickling (multiprocessing, workers)
        return (_rebuild, (type(self), self.message, self.fields))

    def _render_traceback_(self) -> list[str]:
        """How IPython/Jupyter show it: the one-line message, no traceback (``%tb`` still has it)."""
        return [f"{type(self).__name__}: {self.message}"]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description, used by ``--json`` output and journal `run_failed` events."""
        return {"code": self.code, "message": self.message, **{k: _jsonable(v) for k, v in self.fields.items()}}


def _rebuild(cls, message, fields):
    err = cls.__new__(cls)
    CaravanseraiError.__init__(err, message, **fields)
    return err


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return repr(value)


class InvalidRunId(CaravanseraiError, ValueError):
    code = "invalid_run_id"


class SerializationError(CaravanseraiError, ValueError):
    code = "serialization_error"


class RunNotFound(CaravanseraiError, LookupError):
    code = "run_not_found"


class RunLocked(CaravanseraiError):
    code = "run_locked"


class LeaseLost(CaravanseraiError):
    code = "lease_lost"


class JournalCorruptionError(CaravanseraiError):
    code = "journal_corruption"


class StoreUnavailable(CaravanseraiError, OSError):
    code = "store_unavailable"


class UnknownStoreScheme(CaravanseraiError, ValueError):
    code = "unknown_store_scheme"


class MissingExtra(CaravanseraiError, ImportError):
    code = "missing_extra"


class ObjectNotFound(CaravanseraiError, KeyError):
    code = "object_not_found"

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return self.message


class ItemsChanged(CaravanseraiError):
    code = "items_changed"


class ResumeError(CaravanseraiError):
    code = "resume_error"


class IdentityMismatch(CaravanseraiError):
    code = "durable_identity_mismatch"


class DefinitionChanged(IdentityMismatch):
    code = "durable_definition_changed"


class InputMismatch(IdentityMismatch):
    code = "durable_input_mismatch"


class BudgetChanged(IdentityMismatch):
    code = "durable_budget_changed"


class AgentMismatch(IdentityMismatch):
    code = "durable_agent_mismatch"


class SessionMismatch(IdentityMismatch):
    code = "durable_session_mismatch"


class ConversationMismatch(IdentityMismatch):
    code = "durable_conversation_mismatch"


class ToolEffectUncertain(CaravanseraiError):
    code = "durable_tool_effect_uncertain"

    def __str__(self) -> str:
        return self.message


class ToolFailed(CaravanseraiError):
    code = "tool_failed"


class BudgetExceeded(CaravanseraiError):
    code = "budget_exceeded"


class DurableOptionConflict(CaravanseraiError, ValueError):
    code = "durable_option_conflict"


class ModelNotConfigured(CaravanseraiError):
    code = "model_not_configured"


class ModelError(CaravanseraiError):
    code = "model_error"


class CheckpointFormatError(CaravanseraiError, ValueError):
    code = "checkpoint_format"


class CheckpointCorruptionError(CaravanseraiError):
    code = "checkpoint_corruption"


class ObjectConditionalPutRequired(CaravanseraiError):
    code = "durable_object_conditional_put_required"


class ObjectLeaseTtlInvalid(CaravanseraiError, ValueError):
    code = "durable_object_lease_ttl_invalid"


class HttpInsecure(CaravanseraiError, ValueError):
    code = "durable_http_insecure"


class HttpTokenRequired(CaravanseraiError, ValueError):
    code = "durable_http_token_required"


class HttpUnauthorized(CaravanseraiError, PermissionError):
    code = "durable_http_unauthorized"


class UsageError(CaravanseraiError, ValueError):
    code = "usage_error"


class InvalidStoreUrl(CaravanseraiError, ValueError):
    code = "invalid_store_url"


class StoreFull(StoreUnavailable):
    code = "store_full"


class UntrustedPickle(CaravanseraiError):
    code = "untrusted_pickle"


class ClassNotAllowed(CaravanseraiError):
    code = "class_not_allowed"


class UnknownNode(CaravanseraiError, KeyError):
    code = "unknown_node"

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return self.message


class AmbiguousId(CaravanseraiError, ValueError):
    code = "ambiguous_id"


class RunClosed(CaravanseraiError):
    code = "run_closed"


class NoSuchCall(CaravanseraiError, LookupError):
    code = "no_such_call"
