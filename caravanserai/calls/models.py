"""Models an agent can call: an OpenAI-compatible server (chat and ``/v1/completions``), ``auto()``.

A model turns messages into a ``ModelResponse`` (text, tool calls, token usage read from the
response). The scripted model for tests lives in ``caravanserai.testing``. Server failures
(unreachable, bad status, malformed body) raise ``ModelError`` with ``kind`` set, so a caller
can tell a retryable outage from a bad request; nothing is journaled as settled then.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import MissingExtra, ModelError, ModelNotConfigured

__all__ = ["Model", "ModelResponse", "OpenAICompatibleModel", "Usage", "auto"]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def from_openai(cls, usage: Any) -> Usage:
        if not isinstance(usage, dict):
            return cls()
        details = usage.get("prompt_tokens_details") or {}
        return cls(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
                   int((details.get("cached_tokens") if isinstance(details, dict) else 0) or 0))


@dataclass(frozen=True)
class ModelResponse:
    """One model answer: its text, any tool calls (OpenAI shape), usage, and the raw body."""

    text: str
    usage: Usage = field(default_factory=Usage)
    tool_calls: tuple[dict, ...] = ()
    model: str = ""
    raw: dict | None = None

    def to_dict(self) -> dict:
        return {"text": self.text, "tool_calls": list(self.tool_calls), "model": self.model,
                "usage": {"prompt_tokens": self.usage.prompt_tokens, "completion_tokens": self.usage.completion_tokens,
                          "cached_tokens": self.usage.cached_tokens}, "raw": self.raw}

    @classmethod
    def from_dict(cls, data: dict) -> ModelResponse:
        usage = data.get("usage") or {}
        return cls(data.get("text", ""), Usage(usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0),
                                               usage.get("cached_tokens", 0)),
                   tuple(data.get("tool_calls") or ()), data.get("model", ""), data.get("raw"))


class Model:
    """What an agent needs from a model. ``provider``/``name`` label journal events and prices."""

    provider = "unknown"
    name = "unknown"

    def complete(self, messages: Sequence[dict], *, tools: Sequence[dict] | None = None, **params: Any) -> ModelResponse:
        raise NotImplementedError

    def describe(self) -> dict:
        """What identifies this model in a run's definition digest."""
        return {"provider": self.provider, "model": self.name}


class OpenAICompatibleModel(Model):
    """Any server speaking OpenAI's ``/v1/chat/completions`` and ``/v1/completions`` (vLLM, llama.cpp,
    ``transformers serve``, OpenAI itself), over httpx (``pip install 'caravanserai[openai]'``)."""

    provider = "openai-compatible"

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout: float = 120.0,
                 default_params: dict | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[:-3]
        self.name = model
        self.api_key = api_key
        self.timeout = timeout
        self.default_params = dict(default_params or {})
        self._client = None

    def _http(self):
        if self._client is None:
            try:
                import httpx
            except ImportError as exc:
                raise MissingExtra("OpenAICompatibleModel needs httpx: pip install 'caravanserai[openai]'",
                                   extra="openai") from exc
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._client = httpx.Client(base_url=self.base_url, headers=headers, timeout=self.timeout)
        return self._client

    def post(self, path: str, body: dict) -> dict:
        """POST JSON, returning the decoded body; ModelError (kind unreachable/status/malformed) otherwise."""
        import httpx

        try:
            response = self._http().post(path, json=body)
        except httpx.HTTPError as exc:
            raise ModelError(f"model server {self.base_url} is unreachable ({exc.__class__.__name__}: {exc}); "
                             "check that it is running and the URL", kind="unreachable", url=self.base_url) from None
        if response.status_code >= 400:
            raise ModelError(f"model server {self.base_url}{path} answered HTTP {response.status_code}: "
                             f"{response.text[:300]}", kind="status", status=response.status_code, url=self.base_url)
        try:
            data = response.json()
        except ValueError:
            data = None
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
            raise ModelError(f"model server {self.base_url}{path} sent a malformed body: {response.text[:300]!r}",
                             kind="malformed", url=self.base_url)
        return data

    def complete(self, messages: Sequence[dict], *, tools: Sequence[dict] | None = None, **params: Any) -> ModelResponse:
        body: dict[str, Any] = {"model": self.name, "messages": list(messages), **self.default_params, **params}
        if tools:
            body["tools"] = list(tools)
        data = self.post("/v1/chat/completions", body)
        message = data["choices"][0].get("message") or {}
        if not isinstance(message, dict):
            raise ModelError(f"model server {self.base_url} sent a choice without a message", kind="malformed", url=self.base_url)
        return ModelResponse(message.get("content") or "", Usage.from_openai(data.get("usage")),
                             tuple(message.get("tool_calls") or ()), data.get("model") or self.name, data)

    def complete_text(self, prompt: str, **params: Any) -> ModelResponse:
        """``/v1/completions``: plain text in, text out (the DurableAgent backend uses this)."""
        data = self.post("/v1/completions", {"model": self.name, "prompt": prompt, **self.default_params, **params})
        text = data["choices"][0].get("text")
        if not isinstance(text, str):
            raise ModelError(f"model server {self.base_url} sent a completion without text", kind="malformed", url=self.base_url)
        return ModelResponse(text, Usage.from_openai(data.get("usage")), (), data.get("model") or self.name, data)

    def describe(self) -> dict:
        return {"provider": self.provider, "model": self.name, "base_url": self.base_url}

    def __repr__(self) -> str:
        return f"OpenAICompatibleModel({self.base_url!r}, {self.name!r})"


def auto(**params: Any) -> Model:
    """The model the environment configures.

    ``OPENAI_BASE_URL`` + ``OPENAI_MODEL`` (and ``OPENAI_API_KEY``), else ``VLLM_BASE_URL``
    (model ``VLLM_MODEL``, default ``gemma4``); ModelNotConfigured naming them otherwise.
    """
    env = os.environ
    if env.get("OPENAI_BASE_URL") and env.get("OPENAI_MODEL"):
        return OpenAICompatibleModel(env["OPENAI_BASE_URL"], env["OPENAI_MODEL"], api_key=env.get("OPENAI_API_KEY"), **params)
    if env.get("VLLM_BASE_URL"):
        name = env.get("VLLM_MODEL", "gemma4")
        return OpenAICompatibleModel(env["VLLM_BASE_URL"], name.removeprefix("vllm/"), api_key=env.get("VLLM_API_KEY"), **params)
    raise ModelNotConfigured(
        "no model configured: set OPENAI_BASE_URL and OPENAI_MODEL (and OPENAI_API_KEY), or VLLM_BASE_URL, "
        "or pass model=... (caravanserai.testing.ScriptedModel for tests)",
    )
