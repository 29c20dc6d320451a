"""``durable_client(client)``: an OpenAI-style client whose calls inside a run are journaled.

    client = caravanserai.durable_client(openai.OpenAI(base_url=..., api_key=...))
    with caravanserai.durable("nightly") as run:
        reply = client.chat.completions.create(model=..., messages=[...])   # journaled

Outside a run the wrapper passes every call straight through. Inside one (``durable()``,
``%%resumable``), ``client.chat.completions.create(...)`` and ``client.completions.create(...)``
append ``call_started`` before the request and ``call_settled`` (usage, inferred USD, the
response) after; a resumed attempt making the same request gets the journaled response back,
rebuilt as the client's own response type, without sending it. Streaming calls are passed
through unjournaled (a stream cannot be replayed faithfully).
"""

from __future__ import annotations

import inspect
import sys
from types import SimpleNamespace
from typing import Any, cast

from ..calls.journaled import fail_call, settle_call, start_call
from ..calls.models import Usage
from ..errors import ClassNotAllowed
from ..journal import canonical
from .lifecycle import current_run
from .values import resolve_class

__all__ = ["durable_client"]

_JOURNALED = {("chat", "completions", "create"): "chat.completions", ("completions", "create"): "completions"}


def durable_client(client: Any, *, provider: str = "openai") -> Any:
    """Wrap ``client`` (openai.OpenAI or any object with the same ``.chat.completions.create``)."""
    return _Proxy(client, (), provider, type(client).__name__.startswith("Async"))


class _Proxy:
    def __init__(self, target: Any, path: tuple[str, ...], provider: str, is_async: bool) -> None:
        self._target = target
        self._path = path
        self._provider = provider
        self._async = is_async

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        path = (*self._path, name)
        endpoint = _JOURNALED.get(path)
        if endpoint is not None and callable(value):
            is_async = self._async or inspect.iscoroutinefunction(inspect.unwrap(value))
            return _journaled(value, endpoint, self._provider, is_async)
        if any(key[: len(path)] == path for key in _JOURNALED):
            return _Proxy(value, path, self._provider, self._async)
        return value

    def __repr__(self) -> str:
        return f"durable_client({self._target!r})"


def _journaled(create: Any, endpoint: str, provider: str, is_async: bool) -> Any:
    path = f"openai.{endpoint}"

    def begin(run: Any, kwargs: dict) -> tuple[dict | None, dict | None]:
        prompt = canonical(kwargs.get("messages") or kwargs.get("prompt") or "")
        return start_call(run, path=path, kind="model", provider=provider, model=str(kwargs.get("model", "")),
                          request={"endpoint": endpoint, "kwargs": kwargs}, prompt_estimate=len(prompt) // 4,
                          max_tokens=kwargs.get("max_tokens"))

    if is_async:  # openai.AsyncOpenAI: the intent is durable before the await
        async def acall(**kwargs: Any) -> Any:
            run = current_run()
            if run is None or kwargs.get("stream"):
                return await create(**kwargs)
            replayed, pending = begin(run, kwargs)
            if pending is None:
                return _from_dict(cast(dict, replayed))  # start_call gives (response, None) or (None, pending)
            try:
                response = await create(**kwargs)
            except BaseException as exc:
                fail_call(run, pending, exc)
                raise
            return _from_dict(settle_call(run, pending, *_settled(response)))

        return acall

    def call(**kwargs: Any) -> Any:
        run = current_run()
        if run is None or kwargs.get("stream"):
            return create(**kwargs)
        replayed, pending = begin(run, kwargs)
        if pending is None:
            return _from_dict(cast(dict, replayed))  # start_call gives (response, None) or (None, pending)
        try:
            response = create(**kwargs)
        except BaseException as exc:
            fail_call(run, pending, exc)
            raise
        return _from_dict(settle_call(run, pending, *_settled(response)))

    return call


def _settled(response: Any) -> tuple[dict, Usage]:
    data = _to_dict(response)
    return {"type": f"{type(response).__module__}:{type(response).__qualname__}", "body": data}, \
        Usage.from_openai(data.get("usage"))


def _to_dict(response: Any) -> dict:
    if isinstance(response, dict):
        return response
    for method in ("model_dump", "to_dict", "dict"):
        if hasattr(response, method):
            return getattr(response, method)()
    raise TypeError(f"cannot journal a response of type {type(response).__name__}: it has no model_dump()/to_dict()")


def _from_dict(stored: dict) -> Any:
    """Rebuild the client's response type (pydantic ``model_validate``), else attribute access.

    The type named in the journal is data: it is built only if ``values.resolve_class`` allows it
    (OpenAI's own response types, classes the notebook holds, ``caravanserai.allow_class``);
    otherwise the response comes back as plain attributes, and nothing named by the journal is called.
    """
    body, type_name = stored.get("body", stored), stored.get("type", "")
    if type_name == "builtins:dict":
        return body
    main = getattr(sys.modules.get("__main__"), "__dict__", {})
    try:
        cls: Any = resolve_class(str(type_name), main, check=lambda c: hasattr(c, "model_validate"), kind="pydantic model")
        return cls.model_validate(body)  # check= let through only classes with model_validate
    except (ClassNotAllowed, ValueError, TypeError):
        return _namespace(body)


def _namespace(value: Any) -> Any:
    if isinstance(value, dict):
        return SimpleNamespace(**{k: _namespace(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_namespace(v) for v in value]
    return value
