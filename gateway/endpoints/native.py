"""Forwarding a protocol to an upstream that speaks it itself, byte for byte, and recording it.

OpenAI's Responses API to OpenAI (or any upstream configured to speak it), Anthropic's
Messages API to Anthropic: the client's bytes go out as they came (the model name aside, when a
deployment calls it differently), the upstream's bytes come back as they are, errors included
(they are already in the protocol's own format). The call is recorded like a chat call, with
its protocol, the native request and the native answer (a stream's answer rebuilt from its
events); such calls are other models' work, so the learner never trains on them.

Durability is the chat path's: the call is journaled before the last event reaches the client
(here the last whole event of the stream is held back, since these protocols end with an event
of their own rather than `[DONE]`).

Trajectories: a Messages conversation resends its history, so it is stitched by content like a
chat run. A Responses call that names `previous_response_id` continues that response's
trajectory: the previous call registered a key derived from its own response id, which the new
call looks up (this process) or leaves for the store's stitching (another process), exactly as
chat calls do with their message keys.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import replace
from typing import Any

import orjson

from gateway import metrics
from gateway.auth.keys import KeyInfo
from gateway.endpoints.chat_completions.sse import EVENT_END
from gateway.http.asgi import JSON_HEADERS, SSE_HEADERS, Scope, Send, send_response
from gateway.http.errors import GatewayError
from gateway.limits.limiter import NOT_LIMITED, Admission, RateLimited, estimate_tokens
from gateway.state import GatewayState
from gateway.trajectories.stitching import (
    KEY_BYTES,
    MessageKeys,
    OpenTrajectory,
    TrajectoryAssignment,
    new_call_id,
    new_trajectory_id,
    request_keys,
    trajectory_id_for_client,
)
from gateway.upstreams.direct import RETRYABLE_STATUS, attempt_order, post_with_retries
from gateway.upstreams.routing import RoutePlan, UpstreamTarget


class NativeProtocol(ABC):
    """What differs between the protocols forwarded as they are."""

    name: str
    path: str

    @abstractmethod
    def headers(self, target: UpstreamTarget, client_headers: dict[str, str]) -> dict[str, str]:
        """The upstream request's headers: its credentials, and the client's protocol headers."""

    @abstractmethod
    def answer_from_events(self, events: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The whole answer a stream's events add up to."""

    @abstractmethod
    def usage(self, answer: dict[str, Any]) -> tuple[int | None, int | None]:
        """(input tokens, output tokens)."""

    @abstractmethod
    def keys(self, tenant: str, model: str, body: dict[str, Any]) -> MessageKeys:
        """The stitching keys of a request."""

    @abstractmethod
    def continuation(self, keys: MessageKeys, tenant: str, answer: dict[str, Any]) -> list[bytes]:
        """The keys a next call of this run will carry as its parent."""

    @abstractmethod
    async def send_error(self, send: Send, error: GatewayError, headers: list[tuple[bytes, bytes]]) -> None:
        """An error the gateway itself raises, in the protocol's own format."""


def response_chain_key(tenant: str, response_id: str) -> bytes:
    """The stitching key of a Responses answer: what `previous_response_id` names."""
    return hashlib.blake2b(f"responses\x00{tenant}\x00{response_id}".encode(), digest_size=KEY_BYTES).digest()


def sse_payloads(raw: bytes) -> list[dict[str, Any]]:
    """The JSON `data:` payloads of an event stream (any line endings)."""
    payloads = []
    for line in raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n"):
        if line.startswith(b"data:"):
            try:
                payload = orjson.loads(line[5:].strip())
            except orjson.JSONDecodeError:
                continue
            if isinstance(payload, dict):
                payloads.append(payload)
    return payloads


class LastEventHeldBack:
    """Cuts a stream into whole events and holds the last one back until `finish()`."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> bytes:
        self._buffer += data
        ends = list(EVENT_END.finditer(self._buffer))
        if len(ends) < 2:
            return b""
        cut = ends[-2].end()
        ready, self._buffer = self._buffer[:cut], self._buffer[cut:]
        return ready

    def finish(self) -> bytes:
        rest, self._buffer = self._buffer, b""
        return rest


def assign(
    state: GatewayState, key: KeyInfo, keys: MessageKeys, client_trajectory_id: str | None
) -> TrajectoryAssignment:
    """The trajectory of a forwarded call (see the module docstring)."""
    if client_trajectory_id:
        trajectory = trajectory_id_for_client(state.instance_secret, key.tenant, client_trajectory_id)
        return TrajectoryAssignment(trajectory, client_trajectory_id, keys, False)
    known = state.stitch_index.lookup(keys.parent_key)
    if known is not None:
        return TrajectoryAssignment(known.trajectory_id, None, keys, False, continued=known)
    return TrajectoryAssignment(
        new_trajectory_id(state.instance_secret, key.tenant), None, keys, keys.parent_key is not None
    )


class NativeCall:
    """One forwarded call: what the record needs."""

    def __init__(
        self,
        state: GatewayState,
        protocol: NativeProtocol,
        key: KeyInfo,
        body: dict[str, Any],
        *,
        model: str,
        client_trajectory_id: str | None,
        group_id: str | None,
        started: float,
        created_at: float,
    ) -> None:
        self.state = state
        self.protocol = protocol
        self.key = key
        self.body = body
        self.model = model
        self.group_id = group_id
        self.started = started
        self.created_at = created_at
        self.call_id: uuid.UUID = new_call_id()
        self.assignment = state.trajectory_cap.admit(
            assign(state, key, protocol.keys(key.tenant, model, body), client_trajectory_id),
            secret=state.instance_secret,
            tenant=key.tenant,
        )
        self.admission: Admission = NOT_LIMITED
        self.target: UpstreamTarget | None = None
        self.ttft_ms: float | None = None
        internal = str(self.assignment.trajectory_id).encode()
        named = client_trajectory_id.encode() if client_trajectory_id else internal
        self.headers = [
            (b"x-trajectory-id", named),
            (b"x-apprentice-trajectory-id", internal),
            (b"x-apprentice-call-id", str(self.call_id).encode()),
        ]

    def finish(self, status: int, answer: dict[str, Any] | None, error: Any) -> None:
        """Journal the call and register the keys its run's next call will carry."""
        prompt, completion = self.protocol.usage(answer) if answer else (None, None)
        keys = self.protocol.continuation(self.assignment.keys, self.key.tenant, answer) if answer else []
        self.state.record(
            {
                "id": str(self.call_id),
                "response_id": (answer or {}).get("id"),
                "protocol": self.protocol.name,
                "trajectory_id": str(self.assignment.trajectory_id),
                "client_trajectory_id": self.assignment.client_trajectory_id,
                "group_id": self.group_id,
                "tenant": self.key.tenant,
                "api_key_id": str(self.key.id) if self.key.id else None,
                "model": self.model,
                "policy": None,
                "upstream": self.target.name if self.target else None,
                "upstream_model": self.target.upstream_model if self.target else None,
                "adapter_version_id": None,
                "created_at": self.created_at,
                "latency_ms": (time.perf_counter() - self.started) * 1000.0,
                "ttft_ms": self.ttft_ms,
                "status_code": status,
                "error": error,
                "stream": bool(self.body.get("stream")),
                "request": self.body,
                "response": answer,
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "temperature": self.body.get("temperature"),
                "continuation_key": keys[0].hex() if keys else None,
                "parent_key": self.assignment.keys.parent_key.hex() if self.assignment.keys.parent_key else None,
                "stitch_pending": self.assignment.stitch_pending,
            }
        )
        self.state.limiter.settle(self.admission, self.target, prompt, completion)
        self.state.trajectory_cap.add_tokens(self.assignment.trajectory_id, (prompt or 0) + (completion or 0))
        trajectory = OpenTrajectory(self.assignment.trajectory_id, None)
        for continuation in keys:
            self.state.stitch_index.register(continuation, trajectory)


async def forward(
    state: GatewayState,
    protocol: NativeProtocol,
    call: NativeCall,
    targets: list[UpstreamTarget],
    raw: bytes,
    client_headers: dict[str, str],
    send: Send,
) -> int:
    """Forward the call to the first target that answers; relay and record its answer."""
    bodies = {}
    for target in targets:
        body = (
            raw
            if call.body.get("model") == target.upstream_model
            else orjson.dumps({**call.body, "model": target.upstream_model})
        )
        bodies[target.upstream_model] = body
    native_targets = [_native(target, protocol, client_headers) for target in targets]
    try:
        answer = await post_with_retries(
            state.http, native_targets, protocol.path, bodies, retry_statuses=RETRYABLE_STATUS
        )
    except GatewayError as failure:
        call.finish(failure.status, None, {"error": {"message": failure.message}})
        await protocol.send_error(send, failure, call.headers)
        return failure.status
    call.target = answer.target
    response = answer.response
    status = response.status
    content_type = response.headers.get("Content-Type", "application/json")
    if status != 200 or not content_type.startswith("text/event-stream"):
        raw_answer = await response.read()
        try:
            parsed = orjson.loads(raw_answer)
        except orjson.JSONDecodeError:
            parsed = {"raw": raw_answer.decode("utf-8", "replace")[:2000]}
        if status == 200:
            call.finish(200, parsed, None)
        else:
            metrics.UPSTREAM_ERRORS.labels(answer.target.name, str(status)).inc()
            call.finish(status, None, parsed)
        await send_response(send, status, raw_answer, [*JSON_HEADERS, *call.headers])
        return status
    await send({"type": "http.response.start", "status": 200, "headers": [*SSE_HEADERS, *call.headers]})
    received: list[bytes] = []
    holdback = LastEventHeldBack()
    error: dict[str, Any] | None = None
    try:
        async for chunk in response.content.iter_any():
            if call.ttft_ms is None:
                call.ttft_ms = (time.perf_counter() - call.started) * 1000.0
            received.append(chunk)
            ready = holdback.feed(chunk)
            if ready:
                await send({"type": "http.response.body", "body": ready, "more_body": True})
    except Exception as exc:  # the upstream broke off mid-stream: recorded with the error
        error = {"error": {"message": f"upstream stream failed: {type(exc).__name__}: {exc}"}}
        metrics.UPSTREAM_ERRORS.labels(answer.target.name, "stream").inc()
    call.finish(200, protocol.answer_from_events(sse_payloads(b"".join(received))), error)
    await send({"type": "http.response.body", "body": holdback.finish(), "more_body": False})
    return 200


async def forward_request(
    state: GatewayState,
    protocol: NativeProtocol,
    key: KeyInfo,
    body: dict[str, Any],
    raw: bytes,
    plan: RoutePlan,
    scope: Scope,
    send: Send,
    *,
    client_trajectory_id: str | None,
    group_id: str | None,
    started: float,
    created_at: float,
) -> None:
    """One request of `protocol` to the deployments of `plan` that speak it: forwarded, relayed,
    recorded and counted (the handlers of both protocols call this)."""
    try:  # the key's and tenant's limits, from memory (gateway/limits)
        admission = state.limiter.admit(key, estimate_tokens(len(raw)))
    except RateLimited as limited:
        metrics.REQUESTS.labels(protocol.name, metrics.status_class(limited.status)).inc()
        await protocol.send_error(send, limited, limited.headers)
        return
    call = NativeCall(
        state,
        protocol,
        key,
        body,
        model=body["model"],
        client_trajectory_id=client_trajectory_id,
        group_id=group_id,
        started=started,
        created_at=created_at,
    )
    call.admission = admission
    call.headers.extend(admission.headers)
    state.redact_early(call.call_id, call.assignment.trajectory_id, None, body)  # while the upstream works
    order = attempt_order(plan.targets, plan.primary_count, state.settings.router_settings.num_retries)
    targets = [target for target in order if protocol.name in target.protocols]
    client_headers = {k.decode().lower(): v.decode("latin-1") for k, v in scope["headers"]}
    status = 500
    try:
        status = await forward(state, protocol, call, targets, raw, client_headers, send)
    finally:
        metrics.REQUESTS.labels(protocol.name, metrics.status_class(status)).inc()
        metrics.LATENCY.labels(protocol.name, "true" if body.get("stream") else "false").observe(
            time.perf_counter() - started
        )


def _native(target: UpstreamTarget, protocol: NativeProtocol, client_headers: dict[str, str]) -> UpstreamTarget:
    """The target as the protocol reaches it: its native base URL and headers."""
    return replace(
        target,
        api_base=target.native_api_base or target.api_base,
        native_headers=protocol.headers(target, client_headers),
    )


def chain_keys(tenant: str, model: str, previous_response_id: str | None) -> MessageKeys:
    """Keys of a Responses call: its parent is the response it names."""
    parent = response_chain_key(tenant, previous_response_id) if previous_response_id else None
    root = request_keys(tenant, model, []).root_key
    return MessageKeys(request_key=root, parent_key=parent, root_key=parent or root)
