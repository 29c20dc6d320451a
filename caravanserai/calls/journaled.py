"""Journaled calls: intent appended before the call goes out, result after, replay on resume.

Model calls: ``call_started`` → the request is sent → ``call_settled`` (usage, inferred USD, the
response) or ``call_failed``. A resumed attempt that makes the same request again (same path,
same request digest, in the replay window) gets the journaled response without sending it.

Tool calls go by declared effect: ``read`` re-drives an unsettled call; ``idempotent`` re-drives
it with the stable key ``sha256(run_id, tool path, call id, sha256(args))``; ``write`` and
``external`` stop with ``ToolEffectUncertain`` because the journal holds the intent but not the
outcome — settle it by hand (``caravanserai settle RUN CALL_ID --result JSON``) and re-run.
"""

from __future__ import annotations

import contextvars
import hashlib
import inspect
from collections.abc import Callable
from typing import Any, Protocol, cast

from ..errors import CaravanseraiError, SerializationError, ToolEffectUncertain, ToolFailed
from ..journal import RawJSON, canonical, digest, to_json
from .ledger import CallRecord, Ledger
from .models import Model, ModelResponse, Usage
from .pricing import estimate_usd, price_for
from .scope import paused

__all__ = ["EFFECTS", "Journal", "current_idempotency_key", "fail_call", "failed_call", "idempotency_key", "journaled_call",
           "model_call", "settle_call", "start_call", "tool_call"]


class Journal(Protocol):
    """What a journaled call needs from the run it belongs to (``caravanserai.runs.Run`` is one)."""

    run_id: str
    ledger: Ledger

    def append(self, *events: dict, sync: bool = True) -> list[dict]: ...

    def note_replayed(self, call_id: str) -> None:
        """A settled call was answered from the journal (recorded with the run's next append)."""

EFFECTS = ("read", "idempotent", "write", "external")
_IDEMPOTENCY_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("caravanserai_idempotency_key", default=None)


def current_idempotency_key() -> str | None:
    """Inside an ``idempotent`` tool: the stable key to pass to the remote service."""
    return _IDEMPOTENCY_KEY.get()


def idempotency_key(run_id: str, tool_path: str, call_id: str, args_sha256: str) -> str:
    return hashlib.sha256("\x1f".join((run_id, tool_path, call_id, args_sha256)).encode("utf-8")).hexdigest()


def start_call(run: Journal, *, path: str, kind: str, provider: str, model: str, request: dict,
               prompt_estimate: int = 0, max_tokens: int | None = None) -> tuple[dict | None, dict | None]:
    """Before a call goes out: (journaled response, None) to replay, or (None, pending) once the
    intent (``call_started``) is durable. Refuses a call over budget before anything is sent."""
    ledger = run.ledger
    request_sha = digest(request)
    hit = ledger.replay_model(path, request_sha)
    if hit is not None:
        ledger.settle(hit, replayed=True)
        run.note_replayed(hit["call"]["call_id"])
        return hit["call"]["response"], None
    ledger.check_budget(model, prompt_estimate, max_tokens)
    pending = {"path": path, "kind": kind, "provider": provider, "model": model,
               "call_id": ledger.next_call_id(path), "request_sha256": request_sha}
    run.append({"type": "call_started", **pending})
    ledger.reserve(pending["call_id"], model, prompt_estimate, max_tokens)
    return None, pending


def fail_call(run: Journal, pending: dict, exc: BaseException) -> None:
    """The call failed before any answer: journal it (nothing was spent), unless the process is stopping."""
    if not isinstance(exc, (KeyboardInterrupt, SystemExit)):
        info = exc.to_dict() if isinstance(exc, CaravanseraiError) else {"code": type(exc).__name__, "message": str(exc)[:500]}
        failed_call(run, pending, info)


def failed_call(run: Journal, pending: dict, info: dict) -> None:
    """Journal ``call_failed`` with ``info`` (``code``, ``message``): no answer was settled."""
    run.ledger.release(pending["call_id"])
    run.append({"type": "call_failed", **info, "path": pending["path"], "kind": pending["kind"],
                "call_id": pending["call_id"]})  # the call's own fields win over the error's


def settle_call(run: Journal, pending: dict, response: dict, usage: Usage) -> dict:
    """After the answer: ``call_settled`` with usage, inferred USD and the response (durable on return)."""
    model = pending["model"]
    usd = estimate_usd(model, usage.prompt_tokens, usage.completion_tokens)
    call = {
        "call_id": pending["call_id"], "request_sha256": pending["request_sha256"], "provider": pending["provider"],
        "model": model,
        "usage": {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                  "total_tokens": usage.total_tokens, "cached_tokens": min(usage.cached_tokens, usage.prompt_tokens)},
        "estimated_usd": usd,
        "price_per_million": price_for(model),
        "response": response,
    }
    encoded = RawJSON(to_json(call, what="model response"), call)  # encoded once, spliced into the line
    run.append({"type": "call_settled", "path": pending["path"], "kind": pending["kind"], "call": encoded})
    # figures computed here, not read from a store: metered without the revalidation a journal read gets
    run.ledger.settle_fresh(CallRecord(pending["call_id"], pending["path"], pending["kind"], pending["provider"], model,
                                       usage.prompt_tokens, usage.completion_tokens, call["usage"]["cached_tokens"], usd,
                                       run.ledger.attempt))
    return response


def journaled_call(run: Journal, *, path: str, kind: str, provider: str, model: str, request: dict,
                   send: Callable[[], tuple[dict, Usage]], prompt_estimate: int = 0, max_tokens: int | None = None) -> dict:
    """Journal one call around ``send()`` (which returns the response as JSON plus its usage)."""
    replayed, pending = start_call(run, path=path, kind=kind, provider=provider, model=model, request=request,
                                   prompt_estimate=prompt_estimate, max_tokens=max_tokens)
    if pending is None:
        return cast(dict, replayed)  # start_call gives (response, None) or (None, pending)
    try:
        response, usage = send()
    except BaseException as exc:
        fail_call(run, pending, exc)
        raise
    return settle_call(run, pending, response, usage)


def model_call(run: Journal, model: Model, messages: list[dict], *, path: str, tools: list[dict] | None = None,
               **params: Any) -> ModelResponse:
    """Ask ``model`` through the run's journal (replayed on resume, metered, budget-checked)."""
    request = {"model": model.describe(), "messages": messages, "tools": tools or [], "params": params}

    def send() -> tuple[dict, Usage]:
        with paused():  # journaled here, so not again by the transport journal
            response = model.complete(messages, tools=tools, **params)
        return response.to_dict(), response.usage

    data = journaled_call(run, path=path, kind="model", provider=model.provider, model=model.name, request=request,
                          send=send, prompt_estimate=len(canonical(messages)) // 4, max_tokens=params.get("max_tokens"))
    return ModelResponse.from_dict(data)


def tool_call(run: Journal, fn: Callable[..., Any], args: dict, *, name: str, path: str, effect: str = "read",
              call_id: str | None = None) -> Any:
    """Run a tool through the journal by its declared ``effect`` (see the module docstring)."""
    if effect not in EFFECTS:
        raise ValueError(f"tool {name!r}: effect must be one of {', '.join(EFFECTS)}, got {effect!r}")
    ledger = run.ledger
    hit = ledger.replay_tool(path, name, args)
    if hit is not None:
        intent, settled = hit
        redrivable = effect in ("read", "idempotent")
        if settled is not None and "error" not in settled:
            run.note_replayed(intent["call_id"])
            return settled.get("result")
        if settled is not None and not redrivable:
            raise ToolFailed(f"tool {name!r} call {intent['call_id']} failed: {settled['error']}",
                             tool=name, call_id=intent["call_id"], detail=settled["error"])
        if settled is None and not redrivable:
            raise ToolEffectUncertain(
                f"durable_tool_effect_uncertain:{name}:{intent['call_id']}: tool {name!r} ({effect}) was called in an "
                f"earlier attempt of run {run.run_id!r} but its outcome was never journaled; check what it did, then "
                f"record it with `caravanserai settle {run.run_id} {intent['call_id']} --result JSON` (or --error TEXT) "
                "and run again",
                tool=name, call_id=intent["call_id"], run_id=run.run_id,
            )
        call_id = intent["call_id"]  # re-drive under the same id (and so the same idempotency key)
    else:
        call_id = call_id or ledger.next_call_id(path)
    journaled_args = _encoded(args, lambda: f"arguments of tool {name!r}")  # refuses non-JSON before anything
    args_sha = digest(args)
    # A read tool's intent need not be durable before the call: if a crash loses it, the resumed
    # run simply calls the tool again, which a read tool allows. Every other effect's intent is.
    run.append({"type": "tool_intent", "path": path, "tool": name, "call_id": call_id, "effect": effect,
                "args_sha256": args_sha, "args": journaled_args}, sync=effect != "read")
    key = idempotency_key(run.run_id, path, call_id, args_sha) if effect == "idempotent" else None
    # The context variable is set only when it changes: a read tool outside any idempotent one skips it.
    token = _IDEMPOTENCY_KEY.set(key) if key is not None or _IDEMPOTENCY_KEY.get() is not None else None
    try:
        if key is not None and "idempotency_key" in _parameters(fn):
            result = fn(**{**args, "idempotency_key": key})
        else:
            result = fn(**args)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}"[:1000]
        run.append({"type": "tool_settled", "path": path, "tool": name, "call_id": call_id, "error": detail})
        raise ToolFailed(f"tool {name!r} call {call_id} failed: {detail}", tool=name, call_id=call_id, detail=detail) from exc
    finally:
        if token is not None:
            _IDEMPOTENCY_KEY.reset(token)
    try:
        encoded = _encoded(result, lambda: f"result of tool {name!r}")
    except CaravanseraiError:
        encoded = RawJSON(to_json(repr(result)), repr(result))
        result = repr(result)
    run.append({"type": "tool_settled", "path": path, "tool": name, "call_id": call_id, "result": encoded})
    return result


def _encoded(value: Any, what: Callable[[], str]) -> RawJSON:
    """``value`` encoded once for the journal; a SerializationError names ``what()`` (built only then)."""
    try:
        return RawJSON(to_json(value), value)
    except SerializationError:
        return RawJSON(to_json(value, what=what()), value)  # raises again, naming the value


def _parameters(fn: Callable[..., Any]) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()
