"""``durable_client(client)``: an OpenAI or Anthropic SDK client whose requests inside a run are journaled.

    client = caravanserai.durable_client(openai.OpenAI(base_url=..., api_key=...))
    with caravanserai.durable("nightly") as run:
        reply = client.chat.completions.create(model=..., messages=[...])   # journaled

Every model request made over httpx or httpx2 inside a run is journaled at the transport
(``caravanserai.calls.http_journal``), whatever client or framework makes it, so this returns
the **same client object** (same class: ``isinstance`` checks in frameworks pass, and every method
— streams, ``with_raw_response``, ``parse``, ``responses``, ``messages`` — is journaled). It makes
sure the transport journal is installed and, when the client was built on a transport that is not
httpx's own (a custom or mock transport), wraps that transport in place.
"""

from __future__ import annotations

import sys
from typing import Any, TypeVar

from ..calls.http_journal import install, wrap_transport
from ..errors import UnsupportedClient

__all__ = ["durable_client"]

C = TypeVar("C")


def durable_client(client: C, *, provider: str | None = None) -> C:
    """``client`` itself, journaled inside any run (``provider`` is accepted for 0.x callers and unused)."""
    install()
    http = getattr(client, "_client", None)
    module = _http_module(http)
    if http is None or module is None:
        raise UnsupportedClient(
            f"durable_client() takes an openai or anthropic SDK client (built on httpx or httpx2), not a "
            f"{type(client).__module__}.{type(client).__qualname__}: inside a run those are journaled anyway; for another "
            "client use run.proxy_url(upstream) as its base URL, or run.call_model(...)",
            client=type(client).__qualname__)
    transport = getattr(http, "_transport", None)
    if transport is not None and not isinstance(transport, (module.HTTPTransport, module.AsyncHTTPTransport)) \
            and not getattr(transport, "caravanserai_journaled", False):
        wrapped = wrap_transport(transport, module)
        wrapped.caravanserai_journaled = True
        http._transport = wrapped
    return client


def _http_module(http: Any) -> Any:
    """httpx or httpx2, whichever ``http`` (an SDK's inner client) is a client of."""
    for name in ("httpx2", "httpx"):
        module = sys.modules.get(name)
        if module is not None and isinstance(http, (module.Client, module.AsyncClient)):
            return module
    return None
