"""Calls and rewards as OpenTelemetry spans (GenAI semantic conventions), and their exporter.

The only module of the gateway that imports the OpenTelemetry SDK; gateway/tracing/exporter.py
loads it when tracing is configured. Spans are built directly as `ReadableSpan`s with the
timestamps of the record (the call is over when it is journaled), not through a tracer: no
context, sampler or span processor is involved, and the ids are chosen here:

- Trace id = the trajectory id (its 128 bits): every call of one run, and the rewards of that
  run, share one trace, and a trajectory id pasted into a trace backend finds its trace (as 32
  hex digits, the UUID without its dashes). Calls of one run that different gateway processes
  saw as separate trajectories before the stitcher merged them keep their first trajectory id.
- Span id = the call id's low 64 bits (random in a v7 UUID), so a reward naming a call can
  link to that call's span without any lookup.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import orjson
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from apprentice import __version__
from apprentice.settings import Settings, TracingSettings, resolve_secret
from gateway.tracing.items import CallItem, RewardItem

SCOPE = InstrumentationScope("apprentice.gateway", __version__)
OPERATION = "chat"
# The GenAI conventions' well-known provider names for LiteLLM's provider prefixes; others as is.
PROVIDER_NAMES = {
    "azure": "azure.ai.openai",
    "azure_ai": "azure.ai.inference",
    "bedrock": "aws.bedrock",
    "vertex_ai": "gcp.vertex_ai",
    "gemini": "gcp.gemini",
    "mistral": "mistral_ai",
    "xai": "x_ai",
    "watsonx": "ibm.watsonx.ai",
}
# A policy's own inference endpoints (vLLM or `apprentice serve-model`) serving its adapters.
POLICY_PROVIDER = "apprentice"
_SPAN_ID_MASK = (1 << 64) - 1
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def span_id_of(value: uuid.UUID) -> int:
    return (value.int & _SPAN_ID_MASK) or 1


def _server(url: str) -> tuple[str | None, int | None]:
    try:
        parts = urlsplit(url)
        return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80 if parts.scheme else None)
    except ValueError:
        return None, None


class Upstream:
    __slots__ = ("provider", "chat_server", "native_server", "native_protocols")

    def __init__(self, provider: str, api_base: str, native_api_base: str, native_protocols: frozenset[str]) -> None:
        self.provider = provider
        self.chat_server = _server(api_base)
        self.native_server = _server(native_api_base)
        self.native_protocols = native_protocols

    def server(self, protocol: str) -> tuple[str | None, int | None]:
        return self.native_server if protocol in self.native_protocols else self.chat_server


def upstreams(settings: Settings) -> dict[str, Upstream]:
    """The record's `upstream` (a model_name, or policy@endpoint) -> provider and server."""
    found: dict[str, Upstream] = {}
    for entry in settings.model_list:
        provider = entry.litellm_params.provider
        found.setdefault(
            entry.model_name,
            Upstream(
                PROVIDER_NAMES.get(provider, provider), entry.api_base, entry.native_api_base, entry.native_protocols
            ),
        )
    for policy in settings.policies:
        for endpoint in policy.endpoints:
            found[f"{policy.name}@{endpoint}"] = Upstream(POLICY_PROVIDER, endpoint, endpoint, frozenset())
    return found


def _error_fields(error: Any) -> dict[str, Any]:
    """An OpenAI-style error body (`{"error": {...}}`) or its inner object; {} otherwise."""
    if not isinstance(error, dict):
        return {}
    inner = error.get("error")
    return inner if isinstance(inner, dict) else error


def _error_type(item: CallItem) -> str:
    fields = _error_fields(item.error)
    for key in ("type", "code"):
        value = fields.get(key)
        if isinstance(value, str) and value:
            return value
    return str(item.status_code)


def _error_message(item: CallItem) -> str:
    message = _error_fields(item.error).get("message")
    if isinstance(message, str):
        return message[:500]
    if isinstance(item.error, str):
        return item.error[:500]
    return f"HTTP {item.status_code}"


def _json(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


class SpanBuilder:
    """Calls and rewards -> spans; reads only settings fixed at start (safe in the export thread)."""

    def __init__(self, settings: Settings, tracing: TracingSettings) -> None:
        self.resource = Resource.create({"service.name": tracing.service_name, "service.version": __version__})
        self.upstreams = upstreams(settings)
        self.wildcard = self.upstreams.get("*")
        self.policies = {policy.name for policy in settings.policies}

    def _upstream(self, name: str | None) -> Upstream | None:
        """Provider and server of a record's `upstream`: a model_name or a configured policy endpoint,
        a policy endpoint resolved from a DNS name at run time (`policy@http://10.1.2.3:8000/v1`, not
        known at start), else the wildcard deployment's."""
        if not name:
            return None
        known = self.upstreams.get(name)
        if known is not None:
            return known
        policy, at, endpoint = name.partition("@")
        if at and policy in self.policies:
            return Upstream(POLICY_PROVIDER, endpoint, endpoint, frozenset())
        return self.wildcard

    def call_span(self, item: CallItem) -> ReadableSpan:
        trace_id = uuid.UUID(item.trajectory_id).int
        context = SpanContext(trace_id, span_id_of(uuid.UUID(item.call_id)), is_remote=False, trace_flags=_SAMPLED)
        upstream = self._upstream(item.upstream)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": OPERATION,
            "gen_ai.request.model": item.model,
            "gen_ai.response.model": item.response_model,
            "gen_ai.response.id": item.response_id,
            "gen_ai.usage.input_tokens": item.prompt_tokens,
            "gen_ai.usage.output_tokens": item.completion_tokens,
            "gen_ai.request.temperature": item.temperature,
            "gen_ai.request.max_tokens": item.max_tokens,
            "gen_ai.request.top_p": item.top_p,
            "gen_ai.conversation.id": item.trajectory_id,
            "session.id": item.trajectory_id,
            "http.response.status_code": item.status_code,
            "apprentice.call_id": item.call_id,
            "apprentice.trajectory_id": item.trajectory_id,
            "apprentice.client_trajectory_id": item.client_trajectory_id,
            "apprentice.group_id": item.group_id,
            "apprentice.protocol": item.protocol,
            "apprentice.tenant": item.tenant,
            "apprentice.policy": item.policy,
            "apprentice.adapter_version": item.adapter_version_id,
            "apprentice.upstream": item.upstream,
            "apprentice.upstream.model": item.upstream_model,
            "apprentice.stream": item.stream,
            "apprentice.ttft_ms": item.ttft_ms,
        }
        if item.finish_reasons:
            attributes["gen_ai.response.finish_reasons"] = list(item.finish_reasons)
        if upstream is not None:
            attributes["gen_ai.provider.name"] = upstream.provider
            attributes["gen_ai.system"] = upstream.provider  # the name before semconv 1.37
            address, port = upstream.server(item.protocol)
            attributes["server.address"] = address
            attributes["server.port"] = port
        status = Status(StatusCode.UNSET)
        if item.status_code != 200:
            attributes["error.type"] = _error_type(item)
            status = Status(StatusCode.ERROR, _error_message(item))
        start = _ns(item.created_at)
        end = start + int(item.latency_ms * 1e6)
        events: list[Event] = []
        if item.input_messages is not None or item.output is not None:
            events.append(
                Event(
                    "gen_ai.client.inference.operation.details",
                    {
                        "gen_ai.operation.name": OPERATION,
                        "gen_ai.input.messages": _json(item.input_messages),
                        "gen_ai.output.messages": _json(item.output),
                    },
                    timestamp=end,
                )
            )
        return ReadableSpan(
            name=f"{OPERATION} {item.model}",
            context=context,
            parent=None,
            resource=self.resource,
            attributes={key: value for key, value in attributes.items() if value is not None},
            events=events,
            kind=SpanKind.CLIENT,
            status=status,
            start_time=start,
            end_time=end,
            instrumentation_scope=SCOPE,
        )

    def reward_span(self, item: RewardItem) -> ReadableSpan:
        """A zero-length span at the reward's arrival, in its trajectory's trace.

        Not an event on the call's span: that span was exported when the call ended, and a
        reward comes minutes or days later; OTLP cannot add to an exported span. A reward that
        names a call links to that call's span. A pending reward (its trajectory not stored
        yet) has a trace of its own, derived from the reward id.
        """
        trace_id = item.trajectory_id.int if item.trajectory_id is not None else item.reward_id.int
        context = SpanContext(trace_id, span_id_of(item.reward_id), is_remote=False, trace_flags=_SAMPLED)
        links: list[Link] = []
        if item.target_kind == "call" and item.trajectory_id is not None:
            try:
                call_id = uuid.UUID(item.target)
            except ValueError:
                call_id = None  # a response id: the call's span id is not derivable from it
            if call_id is not None:
                links.append(Link(SpanContext(trace_id, span_id_of(call_id), is_remote=True, trace_flags=_SAMPLED)))
        trajectory = str(item.trajectory_id) if item.trajectory_id is not None else None
        attributes: dict[str, Any] = {
            "apprentice.reward.id": str(item.reward_id),
            "apprentice.reward.name": item.name,
            "apprentice.reward.value": float(item.value),
            "apprentice.reward.source": item.source,
            "apprentice.reward.status": item.status,
            "apprentice.reward.target_kind": item.target_kind,
            "apprentice.reward.target": item.target,
            "apprentice.reward.comment": item.comment,
            "apprentice.trajectory_id": trajectory,
            "apprentice.group_id": item.group_id,
            "apprentice.tenant": item.tenant,
            "gen_ai.conversation.id": trajectory,
            "session.id": trajectory,
        }
        for name, value in item.metrics.items():
            attributes[f"apprentice.reward.metrics.{name}"] = float(value)
        at = _ns(item.received_at.timestamp())
        return ReadableSpan(
            name=f"reward {item.name}",
            context=context,
            parent=None,
            resource=self.resource,
            attributes={key: value for key, value in attributes.items() if value is not None},
            links=links,
            kind=SpanKind.INTERNAL,
            start_time=at,
            end_time=at,
            instrumentation_scope=SCOPE,
        )

    def span(self, item: CallItem | RewardItem) -> ReadableSpan:
        return self.call_span(item) if isinstance(item, CallItem) else self.reward_span(item)


class SpanExport:
    """Builds and posts one batch (blocking: run in the export thread)."""

    def __init__(self, settings: Settings, tracing: TracingSettings) -> None:
        self.builder = SpanBuilder(settings, tracing)
        headers: Mapping[str, str] | None = (
            {name: resolve_secret(value) or "" for name, value in tracing.headers.items()} if tracing.headers else None
        )
        self.endpoint = tracing.traces_endpoint()
        self.exporter = OTLPSpanExporter(endpoint=self.endpoint, headers=headers, timeout=tracing.export_timeout_s)

    def export(self, items: Sequence[CallItem | RewardItem]) -> bool:
        spans = [self.builder.span(item) for item in items]
        return self.exporter.export(spans) == SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.exporter.shutdown()
