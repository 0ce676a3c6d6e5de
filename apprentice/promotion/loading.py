"""Load and unload LoRA adapters at a policy's inference endpoints (vLLM's runtime LoRA API).

    POST {endpoint}/load_lora_adapter    {"lora_name": NAME, "lora_path": PATH}
    POST {endpoint}/unload_lora_adapter  {"lora_name": NAME}
    GET  {endpoint}/models               the base model and every resident adapter

`endpoint` is the policy's OpenAI base URL (`http://host:8000/v1`). vLLM (started with
`--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`) and `apprentice serve-model`
answer the same way.

`ensure_loaded` is idempotent and verified: an adapter already listed under the name (with
the same path) is left alone; a load answered 400 "has already been loaded" counts as
loaded; every load is checked with GET /models afterwards. Network errors, timeouts, 429
and 5xx answers are retried with exponential backoff; other 4xx answers (no adapter at the
path, wrong base model, rank above --max-lora-rank) are permanent and reported at once.
There is no broadcast between vLLM replicas: every endpoint is called, concurrently, and
the call succeeds only when every one of them serves the adapter.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

log = logging.getLogger(__name__)

ALREADY_LOADED = "has already been loaded"
NOT_FOUND_ON_UNLOAD = "cannot be found"


class LoadError(Exception):
    """The adapter could not be (un)loaded at one or more endpoints."""

    def __init__(self, name: str, failures: dict[str, str], action: str = "load", permanent: bool = False) -> None:
        detail = "; ".join(f"{endpoint}: {reason}" for endpoint, reason in failures.items())
        super().__init__(f"could not {action} adapter {name!r} at {len(failures)} endpoint(s): {detail}")
        self.name = name
        self.failures = failures
        # Every failure was an answer that retrying cannot change (4xx: no adapter there, wrong base...).
        self.permanent = permanent


class _Permanent(Exception):
    pass


class _Transient(Exception):
    pass


@dataclass(frozen=True)
class EndpointOutcome:
    endpoint: str
    action: str  # present | loaded | reloaded | unloaded | absent
    attempts: int


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or f"HTTP {response.status_code}"
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or error)
    if error is not None:
        return str(error)
    if isinstance(body, dict) and "message" in body:
        return str(body["message"])
    return response.text.strip()[:500]


def _classify(response: httpx.Response) -> None:
    """Raise _Transient or _Permanent for an unsuccessful answer."""
    if response.status_code == 429 or response.status_code >= 500:
        raise _Transient(f"HTTP {response.status_code}: {_message(response)}")
    raise _Permanent(f"HTTP {response.status_code}: {_message(response)}")


async def list_models(client: httpx.AsyncClient, endpoint: str, api_key: str | None = None) -> dict[str, str | None]:
    """{model id: root} of everything the endpoint serves (the base model and its adapters)."""
    try:
        response = await client.get(f"{endpoint}/models", headers=_headers(api_key))
    except httpx.HTTPError as exc:
        raise _Transient(f"{type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        _classify(response)
    try:
        data = response.json().get("data") or []
    except ValueError as exc:
        raise _Transient(f"GET /models answered no JSON: {exc}") from exc
    return {str(card.get("id")): card.get("root") for card in data if isinstance(card, dict)}


def _same_path(a: str | None, b: str) -> bool:
    return a is None or a.rstrip("/") == b.rstrip("/")


async def _load_one(client: httpx.AsyncClient, endpoint: str, name: str, path: str, api_key: str | None) -> str:
    """One attempt: returns the action taken, raises _Transient/_Permanent."""
    models = await list_models(client, endpoint, api_key)
    inplace = False
    if name in models:
        if _same_path(models[name], path):
            return "present"
        inplace = True  # another adapter under this name (a reused name): replace it in place
    try:
        body = {"lora_name": name, "lora_path": path, **({"load_inplace": True} if inplace else {})}
        response = await client.post(f"{endpoint}/load_lora_adapter", headers=_headers(api_key), json=body)
    except httpx.HTTPError as exc:  # the load may have happened: the next attempt checks /models first
        raise _Transient(f"{type(exc).__name__}: {exc}") from exc
    if response.status_code != 200 and not (response.status_code == 400 and ALREADY_LOADED in response.text):
        _classify(response)
    models = await list_models(client, endpoint, api_key)
    if name not in models:
        raise _Transient(f"the load answered {response.status_code} but GET /models does not list {name!r}")
    return "reloaded" if inplace else "loaded"


async def _unload_one(client: httpx.AsyncClient, endpoint: str, name: str, api_key: str | None) -> str:
    try:
        response = await client.post(
            f"{endpoint}/unload_lora_adapter", headers=_headers(api_key), json={"lora_name": name}
        )
    except httpx.HTTPError as exc:
        raise _Transient(f"{type(exc).__name__}: {exc}") from exc
    if response.status_code == 404 or (response.status_code == 400 and NOT_FOUND_ON_UNLOAD in response.text):
        return "absent"
    if response.status_code != 200:
        _classify(response)
    if name in await list_models(client, endpoint, api_key):
        raise _Transient(f"the unload answered 200 but GET /models still lists {name!r}")
    return "unloaded"


async def _with_retries(operation: Any, endpoint: str, attempts: int, backoff_s: float) -> tuple[str, int]:
    delay = backoff_s
    for attempt in range(1, attempts + 1):
        try:
            return await operation(), attempt
        except _Permanent:
            raise
        except _Transient as exc:
            if attempt == attempts:
                raise
            log.warning("%s: attempt %d failed (%s); retrying in %.1fs", endpoint, attempt, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)
    raise AssertionError("unreachable")


async def _run_everywhere(
    endpoints: Sequence[str],
    name: str,
    action: str,
    make_op: Any,
    client: httpx.AsyncClient | None,
    timeout_s: float,
    attempts: int,
    backoff_s: float,
) -> list[EndpointOutcome]:
    own = client is None
    client = client or httpx.AsyncClient(timeout=timeout_s)
    try:
        permanent: list[bool] = []

        async def one(endpoint: str) -> EndpointOutcome | str:
            endpoint = endpoint.rstrip("/")
            try:
                done, tries = await _with_retries(lambda: make_op(client, endpoint), endpoint, attempts, backoff_s)
                return EndpointOutcome(endpoint, done, tries)
            except (_Permanent, _Transient) as exc:
                permanent.append(isinstance(exc, _Permanent))
                return str(exc)

        results = await asyncio.gather(*(one(e) for e in endpoints))
    finally:
        if own:
            await client.aclose()
    failures = {
        endpoint: result for endpoint, result in zip(endpoints, results, strict=True) if isinstance(result, str)
    }
    if failures:
        raise LoadError(name, failures, action, permanent=all(permanent))
    return [r for r in results if isinstance(r, EndpointOutcome)]


async def ensure_loaded(
    endpoints: Sequence[str],
    name: str,
    path: str,
    *,
    api_key: str | None = None,
    client: httpx.AsyncClient | None = None,
    timeout_s: float = 120.0,
    attempts: int = 4,
    backoff_s: float = 0.5,
) -> list[EndpointOutcome]:
    """Make every endpoint serve adapter `name` from `path`; raise LoadError naming those that don't."""
    if not endpoints:
        raise LoadError(name, {"(none)": "the policy has no inference endpoints to load adapters into"}, permanent=True)
    return await _run_everywhere(
        endpoints,
        name,
        "load",
        lambda c, e: _load_one(c, e, name, path, api_key),
        client,
        timeout_s,
        attempts,
        backoff_s,
    )


async def unload(
    endpoints: Sequence[str],
    name: str,
    *,
    api_key: str | None = None,
    client: httpx.AsyncClient | None = None,
    timeout_s: float = 60.0,
    attempts: int = 3,
    backoff_s: float = 0.5,
) -> list[EndpointOutcome]:
    """Remove adapter `name` from every endpoint; one that does not have it counts as done."""
    return await _run_everywhere(
        endpoints, name, "unload", lambda c, e: _unload_one(c, e, name, api_key), client, timeout_s, attempts, backoff_s
    )


async def loaded_at(
    endpoints: Sequence[str],
    *,
    api_key: str | None = None,
    client: httpx.AsyncClient | None = None,
    timeout_s: float = 30.0,
) -> dict[str, dict[str, Any] | str]:
    """{endpoint: {model id: root}} for each endpoint, or the error text where it did not answer."""
    own = client is None
    client = client or httpx.AsyncClient(timeout=timeout_s)
    try:

        async def one(endpoint: str) -> dict[str, Any] | str:
            try:
                return await list_models(client, endpoint.rstrip("/"), api_key)
            except (_Permanent, _Transient) as exc:
                return str(exc)

        results = await asyncio.gather(*(one(e) for e in endpoints))
    finally:
        if own:
            await client.aclose()
    return dict(zip(endpoints, results, strict=True))
