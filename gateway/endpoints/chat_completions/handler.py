"""POST /v1/chat/completions: forward, stream back, and journal the call.

A plain ASGI callable: this is the hot path, and every framework layer costs CPU per call.
The order of work is chosen for durability: the call is journaled before its last byte (the
whole body, or a stream's `data: [DONE]`) reaches the client, so a call the client saw
complete is on disk even if the process is killed right after.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson

from apprentice.grouping import JUDGE_TRAJECTORY_PREFIX, task_key
from gateway import metrics
from gateway.auth.keys import KeyInfo
from gateway.endpoints.chat_completions.assembly import assemble_completion, parse_sse_events
from gateway.endpoints.chat_completions.policy_tokens import TokenCapture, capture_for, event_stripper, strip_answer
from gateway.endpoints.chat_completions.request import ChatRequest, parse_chat_request
from gateway.endpoints.chat_completions.sse import EventRelay
from gateway.endpoints.chat_completions.wire import CHAT_WIRE, TranslatingWire, Wire
from gateway.exploration.eligibility import ServedCall
from gateway.http.asgi import (
    JSON_HEADERS,
    SSE_HEADERS,
    Receive,
    Scope,
    Send,
    header,
    read_body,
    send_response,
)
from gateway.http.errors import GatewayError, UpstreamStatusError, error_body
from gateway.limits.limiter import NOT_LIMITED, Admission, RateLimited, estimate_tokens
from gateway.policies.versions import Choice, ServingVersion, VersionUnavailable
from gateway.state import GatewayState
from gateway.trajectories.parents import continue_stored_run
from gateway.trajectories.stitching import (
    OpenTrajectory,
    TrajectoryAssignment,
    assign_trajectory,
    continuation_keys,
    new_call_id,
)
from gateway.upstreams import litellm_backend
from gateway.upstreams.direct import (
    ADAPTER_RETRYABLE_STATUS,
    RETRYABLE_STATUS,
    UpstreamAnswer,
    attempt_order,
    error_from_answer,
    post_with_retries,
)
from gateway.upstreams.routing import EndpointsUnresolved, RoutePlan, UnknownModel, UpstreamTarget

log = logging.getLogger(__name__)

ENDPOINT = "chat.completions"


class CallContext:
    """What is known about one call while it runs; becomes the journal record at the end."""

    __slots__ = (
        "call_id",
        "created_at",
        "started",
        "key",
        "request",
        "plan",
        "assignment",
        "temperature",
        "overrides",
        "capture",
        "version",
        "ttft_ms",
        "target",
        "headers",
        "wire",
        "strip_usage",
        "admission",
        "arm",
        "judging",
    )

    def __init__(
        self,
        key: KeyInfo,
        request: ChatRequest,
        plan: RoutePlan,
        assignment: TrajectoryAssignment,
        started: float,
        created_at: float,
        wire: Wire = CHAT_WIRE,
    ) -> None:
        self.call_id: uuid.UUID = new_call_id()
        self.wire = wire
        self.created_at = created_at
        self.started = started
        self.key = key
        self.request = request
        self.plan = plan
        self.assignment = assignment
        # A policy's temperature is for its own runs (GRPO needs variety); the LLM judge's calls to a
        # policy keep the judge's own (they are never trained on, see gateway/judging).
        self.judging = judging = (assignment.client_trajectory_id or "").startswith(JUDGE_TRAJECTORY_PREFIX)
        # A call its teacher answers (apprentice.settings.TeacherSettings) is the hosted model's, as the
        # client sent it: no policy temperature, no token capture (those fields are vLLM's own).
        own = plan.policy is not None and not plan.teacher
        self.temperature: float | None = plan.policy.temperature if plan.policy and own and not judging else None
        # Fields the gateway sets on the forwarded body, and what it must strip from the answer.
        self.overrides: dict[str, Any] = {}
        self.capture: TokenCapture | None = None
        self.version: ServingVersion | None = None  # the policy's adapter; None: the base model
        self.arm: Choice | None = None  # the canary arm this call drew for its unit, if it drew one
        if plan.policy is not None and own:
            if self.temperature is not None:
                self.overrides["temperature"] = self.temperature
            if plan.policy.record_tokens:
                added, capture = capture_for(request.body)
                self.overrides.update(added)
                self.capture = capture if capture.active else None
        # Every streamed call is recorded with its usage: the upstream is asked for it, and the
        # usage chunk is removed from what a client that did not ask for it sees.
        self.strip_usage = False
        if request.stream:
            options = request.body.get("stream_options")
            options = options if isinstance(options, dict) else {}
            if not options.get("include_usage"):
                self.overrides["stream_options"] = {**options, "include_usage": True}
                self.strip_usage = not isinstance(wire, TranslatingWire)
        self.ttft_ms: float | None = None
        self.target: UpstreamTarget | None = None
        self.admission: Admission = NOT_LIMITED  # the limits' reservation, settled in _finish
        internal = str(assignment.trajectory_id).encode()
        # A client that names its run gets its own name back; the internal id, accepted
        # everywhere the name is, travels in its own header.
        named = assignment.client_trajectory_id.encode() if assignment.client_trajectory_id else internal
        self.headers = [
            (b"x-trajectory-id", named),
            (b"x-apprentice-trajectory-id", internal),
            (b"x-apprentice-call-id", str(self.call_id).encode()),
        ]

    def litellm_body(self) -> dict[str, Any]:
        """The body for litellm: the client's, with the policy's sampling settings (the token
        capture fields are vLLM's own and stay off other providers)."""
        body = {**self.request.body, "model": self.request.model}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if "stream_options" in self.overrides:
            body["stream_options"] = self.overrides["stream_options"]
        return body

    def served_model(self, target: UpstreamTarget) -> str:
        """The model name the upstream is asked for: the adapter's LoRA name when one serves (a
        teacher answering as the fallback is asked for its own model)."""
        return self.version.name if self.version is not None and not target.teacher else target.upstream_model

    def teacher_overrides(self) -> dict[str, Any]:
        """What a teacher answering as the fallback is sent of the overrides: the usage request only."""
        return {k: v for k, v in self.overrides.items() if k == "stream_options"}

    def served_call(self) -> ServedCall | None:
        """What exploration needs of this call once the client has its answer (None: not a
        policy's call answered by one of its own endpoints)."""
        policy, target = self.plan.policy, self.target
        if policy is None or target is None or not target.direct:
            return None
        return ServedCall(
            call_id=self.call_id,
            policy=policy,
            tenant=self.key.tenant,
            api_key_id=self.key.id,
            key_opted_out=self.key.training_opt_out,
            judging=self.judging,
            teacher=self.plan.teacher or target.teacher,
            stream=self.request.stream,
            model=self.request.model,
            group_id=self.request.group_id,
            body=self.request.body,
            target=target,
            temperature=self.temperature if self.temperature is not None else self.request.body.get("temperature"),
        )

    def _teacher_answered(self) -> bool:
        return self.target is not None and self.target.teacher

    def record(self, status: int, response: dict[str, Any] | None, error: Any) -> tuple[dict[str, Any], list[bytes]]:
        """The journal record, and the continuation keys a next call of this run will carry."""
        usage = (response or {}).get("usage") or {}
        answers = [choice.get("message") or {} for choice in (response or {}).get("choices") or []]
        keys = continuation_keys(self.assignment.keys, answers) if status == 200 else []
        request_temperature = self.request.body.get("temperature")
        return {
            "id": str(self.call_id),
            "response_id": self.wire.response_id(response),
            "protocol": self.wire.protocol,
            "native_request": self.wire.native_request(),
            "native_response": self.wire.native_response(response) if status == 200 else None,
            "trajectory_id": str(self.assignment.trajectory_id),
            "client_trajectory_id": self.assignment.client_trajectory_id,
            "group_id": self.request.group_id,
            "task_family": self.request.family(self.plan.policy.name) if self.plan.policy else None,
            "tenant": self.key.tenant,
            "api_key_id": str(self.key.id) if self.key.id else None,
            "model": self.request.model,
            "policy": self.plan.policy.name if self.plan.policy else None,
            "upstream": self.target.name if self.target else None,
            "upstream_model": self.served_model(self.target) if self.target else None,
            "adapter_version_id": str(self.version.id) if self.version and not self._teacher_answered() else None,
            "created_at": self.created_at,
            "latency_ms": (time.perf_counter() - self.started) * 1000.0,
            "ttft_ms": self.ttft_ms,
            "status_code": status,
            "error": error,
            "stream": self.request.stream,
            "request": self.request.body,
            "response": response,
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
            "temperature": self.temperature if self.temperature is not None else request_temperature,
            "continuation_key": keys[0].hex() if keys else None,
            "parent_key": self.assignment.keys.parent_key.hex() if self.assignment.keys.parent_key else None,
            "stitch_pending": self.assignment.stitch_pending,
            # A policy with record_for_training false: recorded, never trained on (the key's own
            # opt-out is read as the call is shipped, gateway/store/calls.py).
            "trainable": self.plan.policy.record_for_training if self.plan.policy else True,
            **self._arm_fields(),
        }, keys

    def _arm_fields(self) -> dict[str, Any]:
        """The canary arm the run was assigned at this call (apprentice/promotion/sequential.py):
        stored on the trajectory by its first call, the stratum with it."""
        arm = self.arm
        if arm is None or arm.arm is None:
            return {}
        _, unit = self.assignment.canary_unit(self.key.tenant, self.request.group_id)
        return {
            "arm": arm.arm,
            "arm_version_id": str(arm.version.id) if arm.version else None,
            "arm_share": arm.share,
            "arm_unit": unit,
            "task_key": task_key(self.request.messages, self.request.body.get("tools")),
        }


class ChatCompletionsEndpoint:
    def __init__(self, state: GatewayState) -> None:
        self.state = state
        self.limit = state.settings.limits.max_body_bytes
        self.router_settings = state.settings.router_settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        created_at = time.time()
        try:
            key = await self.state.authenticate(scope)
            raw = await read_body(receive, scope, self.limit)
            request = parse_chat_request(
                raw, header(scope, b"x-trajectory-id"), header(scope, b"x-group-id"), header(scope, b"x-task-family")
            )
            plan = self.plan(request.model)
        except GatewayError as error:
            metrics.REQUESTS.labels(ENDPOINT, metrics.status_class(error.status)).inc()
            await CHAT_WIRE.send_error(send, error, [])
            return
        except ConnectionResetError:
            return
        await self.serve(key, request, plan, send, started=started, created_at=created_at)

    def plan(self, model: str) -> RoutePlan:
        """Where a model name goes; an unknown one is a 404 naming the models served here."""
        try:
            return self.state.router.plan(model)
        except UnknownModel:
            raise GatewayError(
                404,
                f"The model `{model}` does not exist or you do not have access "
                f"to it. Models served here: {', '.join(self.state.router.model_names)}",
                param="model",
                code="model_not_found",
            ) from None

    async def serve(
        self,
        key: KeyInfo,
        request: ChatRequest,
        plan: RoutePlan,
        send: Send,
        *,
        started: float,
        created_at: float,
        wire: Wire = CHAT_WIRE,
    ) -> None:
        """Run one parsed chat request (the client's own, or one translated from another
        protocol, whose `wire` translates the answer back) and record it."""
        endpoint = wire.protocol
        try:  # the key's and tenant's limits, from memory (gateway/limits)
            admission = self.state.limiter.admit(key, estimate_tokens(len(request.raw)))
        except RateLimited as limited:
            metrics.REQUESTS.labels(endpoint, metrics.status_class(limited.status)).inc()
            await wire.send_error(send, limited, limited.headers)
            return
        assignment = assign_trajectory(
            self.state.stitch_index,
            secret=self.state.instance_secret,
            tenant=key.tenant,
            model=request.model,
            messages=request.messages,
            client_trajectory_id=request.client_trajectory_id,
        )
        assignment = self.state.trajectory_cap.admit(assignment, secret=self.state.instance_secret, tenant=key.tenant)
        choice = None
        if plan.policy is not None:
            if assignment.stitch_pending and self.state.versions.serving(plan.policy.name).canary is not None:
                assignment = await continue_stored_run(
                    self.state.engine,
                    assignment,
                    tenant=key.tenant,
                    margin_s=self.state.settings.stitching.parent_wait_margin_s,
                    open_window_s=self.state.settings.stitching.open_window_s,
                )
            continued = assignment.continued
            unit, _ = assignment.canary_unit(key.tenant, request.group_id)
            choice = self.state.versions.choose(
                plan.policy.name,
                unit,
                continued.adapter_version_id if continued else None,
                sticky_known=continued is not None,
                group=bool(request.group_id),
            )
            if choice.version is None and plan.policy.teacher is not None:
                # No version of the policy is promoted (it is behind its teacher): the teacher answers.
                plan = self.state.router.teacher_plan(plan)
        call = CallContext(key, request, plan, assignment, started, created_at, wire)
        # The record's request is redacted while the upstream works (gateway/redaction).
        policy_name = call.plan.policy.name if call.plan.policy else None
        self.state.redact_early(
            call.call_id, call.assignment.trajectory_id, policy_name, request.body, wire.native_request()
        )
        call.version = choice.version if choice else None
        call.arm = choice
        call.admission = admission
        call.headers.extend(admission.headers)
        status = 500
        try:
            if request.stream:
                status = await self._stream(call, send)
            else:
                status = await self._complete(call, send)
        finally:
            metrics.REQUESTS.labels(endpoint, metrics.status_class(status)).inc()
            metrics.LATENCY.labels(endpoint, "true" if request.stream else "false").observe(
                time.perf_counter() - started
            )

    # ---- helpers ---------------------------------------------------------------------
    def _finish(self, call: CallContext, status: int, response: dict[str, Any] | None, error: Any) -> None:
        record, keys = call.record(status, response, error)
        self.state.record(record, ship_now=self._awaited_elsewhere(call, keys))
        prompt, completion = record["prompt_tokens"], record["completion_tokens"]
        self.state.limiter.settle(call.admission, call.target, prompt, completion)
        self.state.trajectory_cap.add_tokens(call.assignment.trajectory_id, (prompt or 0) + (completion or 0))
        if status == 200:
            call.wire.recorded(response, call.assignment.trajectory_id)
        trajectory = OpenTrajectory(call.assignment.trajectory_id, call.version.id if call.version else None)
        for key in keys:
            self.state.stitch_index.register(key, trajectory)

    def _awaited_elsewhere(self, call: CallContext, keys: list[bytes]) -> bool:
        """Whether this call's record should reach the store at once rather than within the ship
        interval: while a canary serves the policy, the run's next call, when another process or
        replica gets it, waits for this record in the store to learn the run's version
        (gateway/trajectories/parents.py). A run the client names needs no lookup (its arm is
        drawn from its name), and an answer nobody can continue has no keys."""
        policy = call.plan.policy
        return (
            bool(keys)
            and policy is not None
            and call.assignment.client_trajectory_id is None
            and self.state.versions.serving(policy.name).canary is not None
        )

    def _explore(self, call: CallContext) -> None:
        """Offer an answered call to exploration (gateway/exploration): after its last byte was
        sent, and only a queue put: the extra answers are asked for in the background."""
        if self.state.explorer.enabled and (served := call.served_call()) is not None:
            self.state.explorer.offer(served)

    def _attempts(self, call: CallContext) -> list[UpstreamTarget]:
        targets = attempt_order(call.plan.targets, call.plan.primary_count, self.router_settings.num_retries)
        if not targets:  # a policy whose endpoint names never resolved, and its teacher does not answer this call
            policy = call.plan.policy
            unresolved = self.state.router.directory.unresolved(policy) if policy else []
            raise EndpointsUnresolved(policy.name if policy else call.plan.model, unresolved)
        return targets

    def _bodies(self, call: CallContext, targets: list[UpstreamTarget]) -> dict[str, bytes]:
        return {
            target.upstream_model: call.request.forward_bytes(
                {**(call.teacher_overrides() if target.teacher else call.overrides), "model": call.served_model(target)}
            )
            for target in targets
        }

    async def _open_direct(self, call: CallContext, targets: list[UpstreamTarget]) -> UpstreamAnswer:
        """The upstream's answer, open for reading; an error status raises UpstreamStatusError."""
        try:
            answer = await post_with_retries(
                self.state.http,
                targets,
                "/chat/completions",
                self._bodies(call, targets),
                retry_after=self.router_settings.retry_after,
                retry_statuses=ADAPTER_RETRYABLE_STATUS if call.version else RETRYABLE_STATUS,
            )
        except GatewayError as error:  # no endpoint answered at all
            if call.version is None or call.plan.policy is None or error.status != 502:
                raise
            raise VersionUnavailable(call.plan.policy.name, call.version, error.message) from error
        call.target = answer.target
        if answer.response.status != 200:
            status, body = await error_from_answer(answer)
            policy = call.plan.policy
            if status == 404 and call.version is not None and policy is not None and not answer.target.teacher:
                # every endpoint tried answered 404 for the adapter's name: none holds it
                said = orjson.loads(body).get("error", {}).get("message", "")
                raise VersionUnavailable(policy.name, call.version, f"every endpoint tried answered 404 ({said})")
            raise UpstreamStatusError(status, body)
        return answer

    async def _fail(self, call: CallContext, send: Send, error: GatewayError) -> int:
        """Record the failed call and answer the client with the error (the upstream's own body
        when it answered with an error status)."""
        if isinstance(error, VersionUnavailable):
            log.warning("%s (%s)", error.message, error.detail)
        if call.target is None or isinstance(error, VersionUnavailable):
            call.version = None  # no version answered it: the record must not count it as one's work
        self._finish(call, error.status, None, self._upstream_error(call, error.status, error.body()))
        await call.wire.send_error(send, error, call.headers)
        return error.status

    def _upstream_error(self, call: CallContext, status: int, body: bytes) -> dict[str, Any]:
        kind = "timeout" if status == 504 else ("unreachable" if status == 502 and call.target is None else str(status))
        metrics.UPSTREAM_ERRORS.labels(call.target.name if call.target else "none", kind).inc()
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            return {"error": {"message": body.decode("utf-8", "replace")}}

    # ---- non-streamed ----------------------------------------------------------------
    async def _complete(self, call: CallContext, send: Send) -> int:
        try:
            targets = self._attempts(call)
            if targets[0].direct:
                answer = await self._open_direct(call, targets)
                raw = await answer.response.read()
                response = orjson.loads(raw)
            else:
                call.target = targets[0]
                response = await litellm_backend.complete(targets[0], call.litellm_body())
                raw = orjson.dumps(response)
        except GatewayError as error:
            return await self._fail(call, send, error)
        except (orjson.JSONDecodeError, ValueError) as exc:
            return await self._fail(
                call,
                send,
                GatewayError(502, f"upstream answered with a body that is not JSON: {exc}", code="bad_upstream_body"),
            )
        self._finish(call, 200, response, None)
        if isinstance(call.wire, TranslatingWire):
            raw = call.wire.complete(strip_answer(response, call.capture) if call.capture is not None else response)
        elif call.capture is not None:
            raw = orjson.dumps(strip_answer(response, call.capture))
        await send_response(send, 200, raw, [*JSON_HEADERS, *call.headers])
        self._explore(call)
        return 200

    # ---- streamed ----------------------------------------------------------------------
    async def _stream(self, call: CallContext, send: Send) -> int:
        try:
            targets = self._attempts(call)
            if targets[0].direct:
                answer = await self._open_direct(call, targets)
                chunks: AsyncIterator[bytes] = answer.response.content.iter_any()
            else:
                call.target = targets[0]
                chunks = await litellm_backend.stream(targets[0], call.litellm_body())
        except GatewayError as error:
            return await self._fail(call, send, error)

        await send({"type": "http.response.start", "status": 200, "headers": [*SSE_HEADERS, *call.headers]})
        received: list[bytes] = []
        stream_error: dict[str, Any] | None = None
        # Whole events only; the final `[DONE]` is held back until the call is journaled.
        relay = EventRelay(event_stripper(call.capture, strip_usage=call.strip_usage))
        translating = call.wire if isinstance(call.wire, TranslatingWire) else None
        if translating is not None:
            await send({"type": "http.response.body", "body": translating.stream_start(), "more_body": True})
        try:
            async for chunk in chunks:
                if call.ttft_ms is None:
                    call.ttft_ms = (time.perf_counter() - call.started) * 1000.0
                    metrics.TTFT.observe(call.ttft_ms / 1000.0)
                received.append(chunk)
                ready = relay.feed(chunk)
                if ready and translating is not None:
                    ready = translating.stream_chunks(parse_sse_events(ready))
                if ready:
                    await send({"type": "http.response.body", "body": ready, "more_body": True})
            rest = relay.finish()
        except Exception as exc:  # the upstream broke off mid-stream: the client sees an error event
            stream_error = {
                "error": {
                    "message": f"upstream stream failed: {type(exc).__name__}: {exc}",
                    "type": "upstream_error",
                    "param": None,
                    "code": "stream_interrupted",
                }
            }
            metrics.UPSTREAM_ERRORS.labels(call.target.name if call.target else "none", "stream").inc()
            rest = (
                b"data: "
                + error_body(stream_error["error"]["message"], "upstream_error", None, "stream_interrupted")
                + b"\n\n"
            )
        response = assemble_completion(parse_sse_events(b"".join(received)))
        self._finish(call, 200, response, stream_error)
        if translating is not None:
            tail = translating.stream_chunks(parse_sse_events(rest)) if stream_error is None else b""
            rest = tail + translating.stream_end(response, stream_error)
        await send({"type": "http.response.body", "body": rest, "more_body": False})
        if stream_error is None:
            self._explore(call)
        return 200
