"""Journaled calls (layer 3, above the stores): the intent before a call goes out, the result after.

``journaled`` appends intents and results to a run's journal and replays settled calls on
resume, ``ledger`` meters what a run spent and decides what a resume may replay, ``pricing`` holds
public list prices, ``models`` the model clients. Nothing here knows what a run is beyond the
small ``Journal`` protocol, so this layer imports nothing from ``caravanserai.runs``.
"""

from .journaled import (
    EFFECTS,
    Journal,
    current_idempotency_key,
    fail_call,
    idempotency_key,
    journaled_call,
    model_call,
    settle_call,
    start_call,
    tool_call,
)
from .ledger import Budget, CallRecord, Ledger, Receipt, ResumeInfo, completed_receipt
from .models import Model, ModelResponse, OpenAICompatibleModel, Usage, auto

__all__ = [
    "EFFECTS",
    "Budget",
    "CallRecord",
    "Journal",
    "Ledger",
    "Model",
    "ModelResponse",
    "OpenAICompatibleModel",
    "Receipt",
    "ResumeInfo",
    "Usage",
    "auto",
    "completed_receipt",
    "current_idempotency_key",
    "fail_call",
    "idempotency_key",
    "journaled_call",
    "model_call",
    "settle_call",
    "start_call",
    "tool_call",
]
