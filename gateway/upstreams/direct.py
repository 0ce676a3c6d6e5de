"""Forwarding to OpenAI-compatible upstreams (OpenAI, vLLM, the local server) byte for byte.

litellm costs about 4.5 ms of CPU a call; an aiohttp request on a kept-alive connection
costs a fraction of that. Retries and fallbacks happen here, and only before the first
byte of an answer has reached the client.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from gateway.http.errors import GatewayError, as_openai_error
from gateway.upstreams.routing import UpstreamTarget

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
# A policy's replica that answers 404 for an adapter lost it (restarted before the promotion
# job re-loaded it): another replica may have it.
ADAPTER_RETRYABLE_STATUS = RETRYABLE_STATUS | {404}


@dataclass(slots=True)
class UpstreamAnswer:
    """An upstream that answered (any status): the open response and which target it was."""

    response: aiohttp.ClientResponse
    target: UpstreamTarget
    attempts: int


def make_session() -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=60, ttl_dns_cache=300)
    # No total timeout: streams may be long; each target sets its own read timeout.
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None),
        auto_decompress=True,
        skip_auto_headers=("User-Agent",),
    )


def attempt_order(targets: Sequence[UpstreamTarget], primary_count: int, num_retries: int) -> list[UpstreamTarget]:
    """The primary deployments, cycled to cover 1 + num_retries tries, then the fallbacks."""
    if num_retries == 0 and primary_count == len(targets):
        return list(targets)  # the common case: each deployment once
    primary = list(targets[:primary_count]) or list(targets)
    if not primary:  # a policy whose DNS names have not resolved yet, and no fallback
        return []
    tries = [primary[i % len(primary)] for i in range(max(1 + num_retries, len(primary)))]
    return tries + list(targets[primary_count:])


async def post_with_retries(
    session: aiohttp.ClientSession,
    targets: Sequence[UpstreamTarget],
    path: str,
    bodies: dict[str, bytes],
    *,
    retry_after: float = 0.0,
    retry_statuses: frozenset[int] = RETRYABLE_STATUS,
) -> UpstreamAnswer:
    """POST to the first target that answers with a non-retryable status.

    `bodies` maps an upstream model name to the body for it (the model name differs between
    a deployment and its fallbacks). Returns the last answer even if it is an error status;
    raises GatewayError 502/504 when no target answered at all.
    """
    last_error: Exception | None = None
    last_answer: UpstreamAnswer | None = None
    for attempt, target in enumerate(targets, start=1):
        if last_answer is not None:
            last_answer.response.release()
            last_answer = None
        if attempt > 1 and retry_after:
            await asyncio.sleep(retry_after)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(10.0, target.timeout), sock_read=target.timeout)
        try:
            response = await session.post(
                target.api_base + path, data=bodies[target.upstream_model], headers=target.headers(), timeout=timeout
            )
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            last_error = exc
            log.warning(
                "upstream %s failed (%s: %s); attempt %d of %d",
                target.name,
                type(exc).__name__,
                exc,
                attempt,
                len(targets),
            )
            continue
        answer = UpstreamAnswer(response, target, attempt)
        if response.status not in retry_statuses or attempt == len(targets):
            return answer
        log.warning("upstream %s answered %d; attempt %d of %d", target.name, response.status, attempt, len(targets))
        last_answer = answer
    if last_answer is not None:
        return last_answer
    if isinstance(last_error, asyncio.TimeoutError):
        raise GatewayError(504, f"upstream timed out: {', '.join(t.name for t in targets)}", code="upstream_timeout")
    raise GatewayError(
        502,
        f"no upstream answered ({', '.join(sorted({t.name for t in targets}))}): "
        f"{type(last_error).__name__}: {last_error}",
        code="upstream_unavailable",
    )


async def error_from_answer(answer: UpstreamAnswer) -> tuple[int, bytes]:
    """The upstream's error status and its body in OpenAI's format."""
    raw = await answer.response.read()
    return answer.response.status, as_openai_error(answer.response.status, raw)
