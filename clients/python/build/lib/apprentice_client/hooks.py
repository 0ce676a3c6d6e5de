"""HTTP client hooks that put the current run's headers on every request.

The official openai and anthropic SDKs (and langchain-openai, which builds on openai's) accept
an `http_client`; an httpx client with these event hooks adds `X-Trajectory-Id` and
`X-Group-Id` of the run current in the calling context (runs.py) to each request it sends.
The hook runs in the task that sends the request, so it reads that task's run. A header the
caller set on the request itself (`extra_headers`) is left as it is.

Which HTTP package: the newest openai and anthropic SDKs are built on `httpx2` (a fork with
httpx's API) and anthropic's refuses an `httpx.Client`; older ones are built on `httpx`.
`http_client()` builds an `httpx2` client when that package is installed (it is, with such an
SDK) and an `httpx` one otherwise. The sure way for any SDK version is to hook the SDK's own
default client: `instrument(anthropic.DefaultHttpxClient())`; `instrument` works on anything
with httpx's `event_hooks`, and keeps the client's timeouts, proxies and limits.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Protocol, TypeVar

import httpx

from apprentice_client.runs import current_run


class _Request(Protocol):
    @property
    def headers(self) -> Any: ...


class _HookedClient(Protocol):
    @property
    def event_hooks(self) -> Any: ...

    @event_hooks.setter
    def event_hooks(self, value: Any) -> None: ...


ClientT = TypeVar("ClientT", bound=_HookedClient)


def add_run_headers(request: _Request) -> None:
    """Request hook: the current run's headers, unless the request names its run itself."""
    run = current_run()
    if run is None:
        return
    for name, value in run.headers().items():
        if name not in request.headers:
            request.headers[name] = value


async def add_run_headers_async(request: _Request) -> None:
    """The same hook for async clients (httpx awaits the hooks of an AsyncClient)."""
    add_run_headers(request)


def _is_async(client: Any) -> bool:
    return inspect.iscoroutinefunction(getattr(client, "send", None))


def instrument(client: ClientT) -> ClientT:
    """Add the run-header hook to an httpx-style client (sync or async); returns the same client.

    Idempotent: instrumenting a client twice adds the hook once.
    """
    hook = add_run_headers_async if _is_async(client) else add_run_headers
    hooks = {name: list(functions) for name, functions in dict(client.event_hooks).items()}
    requests = hooks.setdefault("request", [])
    if hook not in requests:
        requests.append(hook)
    client.event_hooks = hooks
    return client


def _http_package() -> Any:
    """`httpx2` when installed (what the newest SDKs require), else `httpx`."""
    try:
        return importlib.import_module("httpx2")
    except ImportError:
        return httpx


def http_client(**options: Any) -> Any:
    """A new `Client(**options)` of httpx2 (else httpx) that tags each request with the current run."""
    return instrument(_http_package().Client(**options))


def async_http_client(**options: Any) -> Any:
    """A new `AsyncClient(**options)` of httpx2 (else httpx) that tags each request with the current run."""
    return instrument(_http_package().AsyncClient(**options))
