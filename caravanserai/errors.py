"""Every error caravanserai raises, under one base class with a stable ``code``, in branches.

The tree (codes in parentheses)::

    CaravanseraiError                      (caravanserai_error)
    ├── UsageError                         (usage_error)            bad arguments: CLI exit 2, IPython UsageError
    │   └── DurableOptionConflict          (durable_option_conflict) durable runs take budget=, not max_cost_usd=
    ├── InvalidInput                       (invalid_input)          a value this library cannot take; nothing written
    │   ├── InvalidRunId                   (invalid_run_id)
    │   ├── InvalidStoreUrl                (invalid_store_url)      a store URL or option this version does not understand
    │   ├── UnknownStoreScheme             (unknown_store_scheme)
    │   ├── SerializationError             (serialization_error)    a state or value JSON cannot hold
    │   │   ├── Unencodable                (unencodable)            no typed-JSON form (``path``); a snapshot then tries pickle
    │   │   └── UndigestableValue          (undigestable_value)     a digest over a value that is not JSON (never its repr)
    │   ├── InvalidObjectKey               (invalid_object_key)     not a plain relative /-path
    │   ├── InvalidPutMode                 (invalid_put_mode)       not "overwrite", "create" or IfVersion
    │   └── ObjectCompactionInvalid        (object_compaction_invalid) compact_every / delta_every not a count >= 1
    ├── StoreError                         (store_error)            a store, its journal or its leases
    │   ├── StoreUnavailable               (store_unavailable)      cannot be reached or opened
    │   │   └── StoreFull                  (store_full)             disk, quota or file-size limit; nothing half-written
    │   ├── MissingExtra                   (missing_extra)          a backend needs `pip install ...`
    │   ├── RunLocked                      (run_locked)             another live writer holds the run
    │   ├── LeaseLost                      (lease_lost)             this writer's lease is gone (fenced)
    │   ├── SequenceMismatch               (seq_mismatch)           an append not at the journal's next seq
    │   ├── ForeignLease                   (foreign_lease)          a lease on another run or store
    │   ├── JournalCorruptionError         (journal_corruption)     damaged, foreign or tampered journal
    │   ├── ObjectNotFound                 (object_not_found)       object face: no such key
    │   ├── ObjectPreconditionFailed       (object_precondition_failed) a create-only or CAS put lost
    │   ├── ObjectConditionalPutRequired   (durable_object_conditional_put_required)
    │   ├── LeaseTtlInvalid                (lease_ttl_invalid)      lease_ttl_ms below the one minimum
    │   │   ├── ObjectLeaseTtlInvalid      (durable_object_lease_ttl_invalid) the seed's name, object storage
    │   │   └── LeaseTtlOptionInvalid      (invalid_store_url)      from a store URL option: also an InvalidStoreUrl
    │   ├── HttpInsecure                   (durable_http_insecure)  an http:// journal URL outside localhost
    │   ├── HttpTokenRequired              (durable_http_token_required)
    │   ├── HttpUnauthorized               (durable_http_unauthorized) the service refused the token
    │   ├── StoreRequestRejected           (store_request_rejected) the journal service refused a request (4xx)
    │   ├── StoreRequestTooLarge           (store_request_too_large) a request over the service's body limit
    │   └── ApiError                       (bad_request)            service side: a request the journal service refuses
    ├── RunError                           (run_error)              a run cannot do what was asked
    │   ├── RunNotFound                    (run_not_found)
    │   ├── RunClosed                      (run_closed)             appended to after close()
    │   ├── ItemsChanged                   (items_changed)          resumable_iterate's input changed
    │   ├── ResumeError                    (resume_error)           `caravanserai resume` cannot replay the launch
    │   │   └── ResumeNotConfirmed         (resume_not_confirmed)   a command not signed by a key you trust: --yes
    │   ├── NoSuchCall                     (no_such_call)           no unsettled tool call with that id
    │   ├── NoCurrentRun                   (no_current_run)         checkpoint(state) etc. outside a run
    │   ├── NoSuchWaypoint                 (no_such_waypoint)       fork(at=N): the run has no waypoint N
    │   └── RunExists                      (run_exists)             fork into a run id that is taken
    ├── ValueRestoreError                  (value_restore_error)    a saved notebook value that must not be loaded
    │   ├── UntrustedPickle                (untrusted_pickle)       pickle not signed by a key you trust
    │   └── ClassNotAllowed                (class_not_allowed)      a class neither defined here nor allowed
    ├── TrustError                         (trust_error)            signing keys and the signatures on what could run
    │   ├── KeyFileInvalid                 (key_file_invalid)       your signing key cannot be made, read or is readable by others
    │   ├── PublicKeyInvalid               (public_key_invalid)     not an ``ed25519:…`` public key (also a UsageError)
    │   └── SignatureInvalid               (signature_invalid)      a signature that does not verify: refused always
    ├── CallError                          (call_error)             a journaled model or tool call
    │   ├── ModelError                     (model_error)            the model server failed (unreachable, status, body)
    │   ├── ModelNotConfigured             (model_not_configured)   auto() found no model in the environment
    │   ├── BudgetExceeded                 (budget_exceeded)        the call would exceed the budget; not sent
    │   ├── ToolFailed                     (tool_failed)            a tool raised (an agent shows it to the model)
    │   ├── ToolEffectUncertain            (durable_tool_effect_uncertain) a write/external tool's outcome is unknown
    │   ├── MaxTurnsExceeded               (max_turns_exceeded)     an agent used all its turns
    │   └── UnsupportedClient              (unsupported_client)     durable_client() of a client not on httpx/httpx2
    ├── CheckpointError                    (checkpoint_error)       DurableAgent checkpoints and logs
    │   ├── CheckpointFormatError          (checkpoint_format)      not a checkpoint this version can read
    │   ├── CheckpointCorruptionError      (checkpoint_corruption)  damaged bytes, or an id that does not match
    │   ├── UnknownNode                    (unknown_node)           no node with that id
    │   ├── AmbiguousId                    (ambiguous_id)           an id prefix matches more than one id
    │   ├── AgentNotStarted                (agent_not_started)      a DurableAgent used before begin()/resume_from()
    │   ├── ModelFingerprintMismatch       (model_fingerprint_mismatch) a KV cache made by another model, revision or dtype
    │   └── ModelNotChosen                 (model_not_chosen)       a checkpoint names a model folder this code did not choose
    └── IdentityMismatch                   (durable_identity_mismatch) a resume would be a different run; appends nothing
        ├── DefinitionChanged              (durable_definition_changed)
        │   └── CellChanged                (durable_definition_changed) a %%resumable cell's source changed
        ├── InputMismatch                  (durable_input_mismatch)
        ├── BudgetChanged                  (durable_budget_changed)
        ├── AgentMismatch                  (durable_agent_mismatch)
        ├── SessionMismatch                (durable_session_mismatch)
        └── ConversationMismatch           (durable_conversation_mismatch)

Messages are one line naming the problem and the remedy. Errors carry their fields as
attributes (``err.run_id``...), compare by ``code`` and survive pickling (they cross process
boundaries in tests and workers). Where a builtin exception fits too, an error also derives from
it (``InvalidRunId`` is a ``ValueError``, ``ObjectNotFound`` a ``KeyError``...), so existing
``except ValueError`` code keeps working.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AgentMismatch",
    "ApiError",
    "AgentNotStarted",
    "AmbiguousId",
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
    "DurableOptionConflict",
    "ForeignLease",
    "HttpInsecure",
    "HttpTokenRequired",
    "HttpUnauthorized",
    "IdentityMismatch",
    "InputMismatch",
    "InvalidInput",
    "InvalidObjectKey",
    "InvalidPutMode",
    "InvalidRunId",
    "InvalidStoreUrl",
    "ItemsChanged",
    "JournalCorruptionError",
    "KeyFileInvalid",
    "LeaseLost",
    "LeaseTtlInvalid",
    "MaxTurnsExceeded",
    "MissingExtra",
    "ModelError",
    "ModelFingerprintMismatch",
    "ModelNotChosen",
    "ModelNotConfigured",
    "NoCurrentRun",
    "NoSuchCall",
    "NoSuchWaypoint",
    "ObjectCompactionInvalid",
    "ObjectConditionalPutRequired",
    "ObjectLeaseTtlInvalid",
    "ObjectNotFound",
    "ObjectPreconditionFailed",
    "PublicKeyInvalid",
    "ResumeError",
    "ResumeNotConfirmed",
    "RunClosed",
    "RunError",
    "RunExists",
    "RunLocked",
    "RunNotFound",
    "SequenceMismatch",
    "SerializationError",
    "SessionMismatch",
    "SignatureInvalid",
    "StoreError",
    "StoreFull",
    "StoreRequestRejected",
    "StoreRequestTooLarge",
    "StoreUnavailable",
    "ToolEffectUncertain",
    "ToolFailed",
    "TrustError",
    "UndigestableValue",
    "UnknownNode",
    "Unencodable",
    "UnsupportedClient",
    "UnknownStoreScheme",
    "UntrustedPickle",
    "UsageError",
    "ValueRestoreError",
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


class UsageError(CaravanseraiError, ValueError):
    code = "usage_error"


class DurableOptionConflict(UsageError):
    code = "durable_option_conflict"


class InvalidInput(CaravanseraiError, ValueError):
    code = "invalid_input"


class InvalidRunId(InvalidInput):
    code = "invalid_run_id"


class InvalidStoreUrl(InvalidInput):
    code = "invalid_store_url"


class UnknownStoreScheme(InvalidInput):
    code = "unknown_store_scheme"


class SerializationError(InvalidInput):
    code = "serialization_error"


class Unencodable(SerializationError):
    """The value holds something typed JSON (``caravanserai.runs.values``) cannot represent; field
    ``path`` says where. The notebook snapshot catches it and tries pickle."""

    code = "unencodable"


class UndigestableValue(SerializationError):
    """A request, definition or argument digest met a value JSON cannot hold (an SDK sentinel, an
    object): refused, because its ``repr`` may hold a memory address and never match on resume."""

    code = "undigestable_value"


class InvalidObjectKey(InvalidInput):
    """An object key that is not a plain relative ``/``-path."""

    code = "invalid_object_key"


class InvalidPutMode(InvalidInput):
    """A put mode other than ``"overwrite"``, ``"create"`` or ``IfVersion(version)``."""

    code = "invalid_put_mode"


class ObjectCompactionInvalid(InvalidInput):
    """``compact_every`` or ``delta_every`` of an object store is not a whole number of appends >= 1 (field ``option``)."""

    code = "object_compaction_invalid"


class StoreError(CaravanseraiError):
    code = "store_error"


class StoreUnavailable(StoreError, OSError):
    code = "store_unavailable"


class StoreFull(StoreUnavailable):
    code = "store_full"


class MissingExtra(StoreError, ImportError):
    code = "missing_extra"


class RunLocked(StoreError):
    code = "run_locked"
    holder: Any  # field: the holder's description (a dict), where the raiser knows it


class LeaseLost(StoreError):
    code = "lease_lost"


class SequenceMismatch(StoreError, ValueError):
    """An append at a seq that is not the journal's next one (field ``expected``); nothing written."""

    code = "seq_mismatch"
    expected: int  # field: the journal's next seq


class ForeignLease(StoreError, ValueError):
    """An append with a lease on another run or from another store; nothing written."""

    code = "foreign_lease"


class JournalCorruptionError(StoreError):
    code = "journal_corruption"
    line: int | None  # field: the damaged line's number, where there is one


class ObjectNotFound(StoreError, KeyError):
    code = "object_not_found"

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return self.message


class ObjectPreconditionFailed(StoreError):
    """A create-only or compare-and-swap put whose condition did not hold (field ``key``); nothing written."""

    code = "object_precondition_failed"
    key: str  # field: the object's key


class ObjectConditionalPutRequired(StoreError):
    code = "durable_object_conditional_put_required"


class LeaseTtlInvalid(StoreError, ValueError):
    """A lease TTL below the one minimum (``caravanserai.stores.leases.MIN_TTL_MS``), from any backend."""

    code = "lease_ttl_invalid"



class ObjectLeaseTtlInvalid(LeaseTtlInvalid):
    """The seed's name for an object store's too-short lease."""

    code = "durable_object_lease_ttl_invalid"


class LeaseTtlOptionInvalid(LeaseTtlInvalid, InvalidStoreUrl):
    """A too-short ``lease_ttl_ms`` (or ``lock_ttl_ms``) option in a store URL: the one lease error,
    and also an ``InvalidStoreUrl`` (fields ``url``, ``option``, ``lease_ttl_ms``, ``minimum``).

    It keeps ``InvalidStoreUrl``'s code (what a bad URL has always reported, in ``--json`` too), so
    like ``CellChanged`` it is left out of ``__all__``, whose codes are distinct; import it from here.
    """

    code = "invalid_store_url"


class ObjectLeaseTtlOptionInvalid(ObjectLeaseTtlInvalid, LeaseTtlOptionInvalid):
    """A too-short ``lease_ttl_ms`` option in an object-store URL (``s3://``, ``gs://``, ``az://``): the
    seed's ``durable_object_lease_ttl_invalid``, and still a ``LeaseTtlOptionInvalid`` and an
    ``InvalidStoreUrl`` (same fields). Its code repeats ``ObjectLeaseTtlInvalid``'s, so it is left out
    of ``__all__``, whose codes are distinct; import it from here."""

    code = "durable_object_lease_ttl_invalid"


class HttpInsecure(StoreError, ValueError):
    code = "durable_http_insecure"


class HttpTokenRequired(StoreError, ValueError):
    code = "durable_http_token_required"


class HttpUnauthorized(StoreError, PermissionError):
    code = "durable_http_unauthorized"


class StoreRequestRejected(StoreError, ValueError):
    """The journal service refused a request as malformed (HTTP 4xx with no more specific error);
    nothing was written. Fields ``status`` and ``service_code`` (the service's error code, or "")."""

    code = "store_request_rejected"


class StoreRequestTooLarge(StoreError, ValueError):
    """A request over the journal service's body limit (HTTP 413); nothing was written. Field
    ``limit``: the limit in bytes, where the service said it."""

    code = "store_request_too_large"


class ApiError(StoreError):
    """Service side (``caravanserai.stores.http_service``): what the wire protocol itself refuses
    (malformed body, body too large, existing object), with an HTTP ``status``, a wire ``code``
    (``bad_request`` by default; the instance's ``code`` is the one sent), a one-line message and
    extra JSON fields. Errors of the library (``SequenceMismatch``, ``RunLocked``...) are not
    wrapped: the service's ``_ANSWERS`` gives their status. A client sees ``StoreRequestRejected``."""

    code = "bad_request"

    def __init__(self, status: int, code: str, message: str, **fields: Any) -> None:
        super().__init__(message, status=status, code=code, **fields)

    def answer_fields(self) -> dict[str, Any]:
        """The extra JSON fields of the error body (not the status and code)."""
        return {k: v for k, v in self.fields.items() if k not in ("status", "code")}


class RunError(CaravanseraiError):
    code = "run_error"


#: What a missing run's error says to do, in words that read the same in a terminal and a notebook.
LIST_HINT = "check the id with `caravanserai list` (`%caravanserai list` in a notebook)"


class RunNotFound(RunError, LookupError):
    code = "run_not_found"

    @classmethod
    def in_store(cls, run_id: str, store_url: str | None = None, *, yet: bool = False) -> RunNotFound:
        """The one message for a run id a store does not hold (CLI, panels, API), with ``LIST_HINT``."""
        where = f" in {store_url}" if store_url else ""
        return cls(f"no run {run_id!r}{where}{' (yet)' if yet else ''}: {LIST_HINT}", run_id=run_id)


class RunClosed(RunError):
    code = "run_closed"


class ItemsChanged(RunError):
    code = "items_changed"


class ResumeError(RunError):
    code = "resume_error"


class ResumeNotConfirmed(ResumeError):
    """``caravanserai resume`` of a run whose recorded command is not signed by a key you trust (nor
    is its store trusted): the command was read from the store, so it is printed and needs ``--yes``."""

    code = "resume_not_confirmed"


class NoSuchCall(RunError, LookupError):
    code = "no_such_call"


class NoCurrentRun(RunError, TypeError):
    code = "no_current_run"


class NoSuchWaypoint(RunError, LookupError):
    code = "no_such_waypoint"


class RunExists(RunError):
    code = "run_exists"


class ValueRestoreError(CaravanseraiError):
    code = "value_restore_error"


class UntrustedPickle(ValueRestoreError):
    code = "untrusted_pickle"


class ClassNotAllowed(ValueRestoreError):
    code = "class_not_allowed"


class TrustError(CaravanseraiError):
    code = "trust_error"


class KeyFileInvalid(TrustError):
    code = "key_file_invalid"


class PublicKeyInvalid(TrustError, UsageError):
    code = "public_key_invalid"


class SignatureInvalid(TrustError):
    """A signature present on a pickled value, a launch command or an output bundle that does not verify
    (altered, swapped, or moved): refused whatever the store's trust. Fields ``run_id``, ``item``, ``key``."""

    code = "signature_invalid"


class CallError(CaravanseraiError):
    code = "call_error"


class ModelError(CallError):
    code = "model_error"


class ModelNotConfigured(CallError):
    code = "model_not_configured"


class BudgetExceeded(CallError):
    code = "budget_exceeded"


class ToolFailed(CallError):
    code = "tool_failed"
    detail: str  # field: what the tool raised, as "Type: message"


class ToolEffectUncertain(CallError):
    code = "durable_tool_effect_uncertain"

    def __str__(self) -> str:  # the message alone, whatever the arguments
        return self.message


class MaxTurnsExceeded(CallError):
    code = "max_turns_exceeded"


class UnsupportedClient(CallError, TypeError):
    """``durable_client(x)`` of an object that is not an SDK client on httpx or httpx2."""

    code = "unsupported_client"


class CheckpointError(CaravanseraiError):
    code = "checkpoint_error"


class CheckpointFormatError(CheckpointError, ValueError):
    code = "checkpoint_format"


class CheckpointCorruptionError(CheckpointError):
    code = "checkpoint_corruption"


class UnknownNode(CheckpointError, KeyError):
    code = "unknown_node"

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return self.message


class AmbiguousId(CheckpointError, ValueError):
    code = "ambiguous_id"


class AgentNotStarted(CheckpointError):
    code = "agent_not_started"


class ModelFingerprintMismatch(CheckpointError):
    """A checkpoint's KV cache was computed by another model, revision or dtype than the one loaded here."""

    code = "model_fingerprint_mismatch"


class ModelNotChosen(CheckpointError):
    """A checkpoint names a local model folder that this process's code did not choose: data never picks
    files to load (pass ``model_id=`` or set ``CARAVANSERAI_LOCAL_MODEL``)."""

    code = "model_not_chosen"


class IdentityMismatch(CaravanseraiError):
    code = "durable_identity_mismatch"


class DefinitionChanged(IdentityMismatch):
    code = "durable_definition_changed"


class CellChanged(DefinitionChanged):
    """A ``%%resumable`` cell's source differs from the one its run started with.

    It keeps ``DefinitionChanged``'s code (a changed cell is a changed definition), so it is left
    out of ``__all__``, whose codes are distinct; import it from here or ``caravanserai.ipython_ext``.
    """

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
