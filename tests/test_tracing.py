"""OpenTelemetry traces (docs/tracing.md): calls and rewards reach an OTLP/HTTP collector as spans
with the GenAI semantic conventions, off the hot path; a collector that is down costs spans, not
calls; a gateway without tracing never loads the SDK.

The collector is in-process (a thread serving POST /v1/traces) and decodes what arrives with the
OTLP protobuf definitions; the gateway is a real process in front of the fake upstream.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from prometheus_client import REGISTRY

from apprentice.settings import ConfigError, Settings, TracingSettings
from gateway.store.rewards import NewReward, StoredReward
from gateway.tracing.exporter import CallTracer
from gateway.tracing.items import call_item, finish_reasons
from gateway.tracing.spans import SpanBuilder
from tests.conftest import count_rows, wait_for
from tests.support.post_endpoint import PostEndpoint, Reply
from tests.support.processes import REPO_ROOT, free_port

SPAN_KIND_INTERNAL = 1
SPAN_KIND_CLIENT = 3
STATUS_ERROR = 2


# ---- an in-process OTLP/HTTP collector ---------------------------------------------------
def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


class Collector:
    """Receives OTLP/HTTP protobuf exports; `spans` are decoded into plain dicts."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.requests = 0
        self.lock = threading.Lock()
        self.headers: list[dict[str, str]] = []
        self.endpoint_server: PostEndpoint | None = None

    def answer(self, path: str, headers: dict[str, str], body: bytes) -> Reply:
        content_type = {k.lower(): v for k, v in headers.items()}.get("content-type")
        if path != "/v1/traces" or content_type != "application/x-protobuf":
            return 404, "text/plain", b""
        self.receive(ExportTraceServiceRequest.FromString(body), headers)
        return 200, "application/x-protobuf", ExportTraceServiceResponse().SerializeToString()

    @property
    def endpoint(self) -> str:
        assert self.endpoint_server is not None, "start() the collector first"
        return self.endpoint_server.base_url

    def receive(self, request: ExportTraceServiceRequest, headers: dict[str, str]) -> None:
        decoded = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    decoded.append(
                        {
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "kind": span.kind,
                            "start": span.start_time_unix_nano,
                            "end": span.end_time_unix_nano,
                            "attributes": _attributes(span.attributes),
                            "status": span.status.code,
                            "status_message": span.status.message,
                            "events": [(event.name, _attributes(event.attributes)) for event in span.events],
                            "links": [(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                            "resource": resource,
                            "scope": scope_spans.scope.name,
                        }
                    )
        with self.lock:
            self.requests += 1
            self.spans.extend(decoded)
            self.headers.append({k.lower(): v for k, v in headers.items()})

    def named(self, prefix: str) -> list[dict[str, Any]]:
        with self.lock:
            return [span for span in self.spans if span["name"].startswith(prefix)]

    def start(self) -> None:
        self.endpoint_server = PostEndpoint(self.answer)

    def stop(self) -> None:
        if self.endpoint_server is not None:
            self.endpoint_server.close()


@pytest.fixture
def collector() -> Iterator[Collector]:
    running = Collector()
    running.start()
    yield running
    running.stop()


def chat(gateway: Any, content: str, *, run: str, model: str = "fake-model", stream: bool = False) -> httpx.Response:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0.7,
        "max_tokens": 50,
    }
    if stream:
        body["stream"] = True
    return httpx.post(gateway.base_url + "/chat/completions", json=body, headers={"X-Trajectory-Id": run}, timeout=30)


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " "))


def metrics_text(gateway: Any) -> str:
    return httpx.get(gateway.url + "/metrics", timeout=10).text


# ---- against a real gateway --------------------------------------------------------------
def test_calls_and_rewards_reach_the_collector_as_genai_spans(start_gateway, fake_upstream, collector, db):
    entries = [
        {
            "model_name": "fake-model",
            "litellm_params": {"model": "openai/fake-model", "api_base": fake_upstream.api_base},
        },
        {"model_name": "broken", "litellm_params": {"model": "openai/fail-502", "api_base": fake_upstream.api_base}},
    ]
    gateway = start_gateway(
        model_list=entries,
        tracing={"otlp_endpoint": collector.endpoint, "export_interval_s": 0.1, "headers": {"x-team": "agents"}},
    )
    whole = chat(gateway, "what is two plus two", run="run-42")
    streamed = chat(gateway, "and three plus three", run="run-42", stream=True)
    failed = chat(gateway, "this one fails", run="run-43", model="broken")
    assert whole.status_code == streamed.status_code == 200 and failed.status_code == 502
    trajectory = whole.headers["x-apprentice-trajectory-id"]
    assert streamed.headers["x-apprentice-trajectory-id"] == trajectory, "one run, one trajectory"
    call_ids = [whole.headers["x-apprentice-call-id"], streamed.headers["x-apprentice-call-id"]]
    usage = whole.json()["usage"]

    calls = wait_for(lambda: len(collector.named("chat ")) >= 3 and collector.named("chat "), message="3 call spans")
    by_call = {span["attributes"]["apprentice.call_id"]: span for span in calls}
    first, second = by_call[call_ids[0]], by_call[call_ids[1]]
    for span in (first, second):
        attributes = span["attributes"]
        assert span["name"] == "chat fake-model" and span["kind"] == SPAN_KIND_CLIENT
        assert span["trace_id"] == uuid.UUID(trajectory).hex, "the trace id is the trajectory id"
        assert span["parent_span_id"] == ""
        assert span["span_id"] == f"{uuid.UUID(attributes['apprentice.call_id']).int & (2**64 - 1):016x}"
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.provider.name"] == attributes["gen_ai.system"] == "openai"
        assert attributes["gen_ai.request.model"] == "fake-model"
        assert attributes["gen_ai.response.model"] == "fake-model"
        assert attributes["gen_ai.conversation.id"] == attributes["session.id"] == trajectory
        assert attributes["gen_ai.response.finish_reasons"] == ["stop"]
        assert attributes["gen_ai.request.temperature"] == 0.7 and attributes["gen_ai.request.max_tokens"] == 50
        assert attributes["gen_ai.usage.input_tokens"] > 0 and attributes["gen_ai.usage.output_tokens"] > 0
        assert attributes["http.response.status_code"] == 200
        assert attributes["server.address"] == "127.0.0.1" and attributes["server.port"] == fake_upstream.port
        assert attributes["apprentice.protocol"] == "chat.completions" and attributes["apprentice.tenant"] == "local"
        assert attributes["apprentice.client_trajectory_id"] == "run-42"
        assert span["status"] == 0 and span["end"] > span["start"]
        assert span["resource"]["service.name"] == "apprentice-gateway" and span["scope"] == "apprentice.gateway"
        assert span["events"] == [], "no message content unless include_content"
    assert first["attributes"]["gen_ai.response.id"] == whole.json()["id"]
    assert first["attributes"]["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert first["attributes"]["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert first["attributes"]["apprentice.stream"] is False and second["attributes"]["apprentice.stream"] is True
    assert "apprentice.ttft_ms" in second["attributes"]
    error = next(span for span in calls if span["attributes"]["gen_ai.request.model"] == "broken")
    assert error["status"] == STATUS_ERROR and error["attributes"]["http.response.status_code"] == 502
    assert error["attributes"]["error.type"] and error["trace_id"] != first["trace_id"]
    assert all(headers.get("x-team") == "agents" for headers in collector.headers), "configured headers are sent"

    # Rewards: a span in the trajectory's trace; one naming a call links to that call's span.
    wait_for(lambda: count_rows(db, "SELECT count(*) FROM calls") >= 3, message="the calls stored")
    answer = httpx.post(
        gateway.base_url + "/rewards",
        json={
            "rewards": [
                {"trajectory_id": trajectory, "reward": 0.75, "name": "reward", "metrics": {"steps": 2}},
                {"call_id": call_ids[1], "reward": 1.0, "name": "helpful"},
            ]
        },
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    stored = answer.json()["data"]
    rewards = wait_for(lambda: len(collector.named("reward ")) >= 2 and collector.named("reward "), message="rewards")
    by_name = {span["name"]: span for span in rewards}
    whole_run = by_name["reward reward"]
    assert whole_run["attributes"]["apprentice.reward.value"] == 0.75
    assert whole_run["attributes"]["apprentice.reward.name"] == "reward"
    assert whole_run["attributes"]["apprentice.reward.source"] == "key"
    assert whole_run["attributes"]["apprentice.reward.id"] == stored[0]["id"]
    assert whole_run["attributes"]["apprentice.reward.metrics.steps"] == 2.0
    assert whole_run["kind"] == SPAN_KIND_INTERNAL and whole_run["start"] == whole_run["end"]
    assert [reward["status"] for reward in stored] == ["linked", "linked"]
    assert whole_run["trace_id"] == first["trace_id"]
    assert whole_run["attributes"]["gen_ai.conversation.id"] == trajectory
    on_call = by_name["reward helpful"]
    assert on_call["trace_id"] == first["trace_id"]
    assert on_call["links"] == [(first["trace_id"], second["span_id"])], "linked to the call's span"

    text = metrics_text(gateway)
    assert metric(text, "apprentice_tracing_exported_total") >= 5
    assert metric(text, "apprentice_tracing_dropped_total") == 0
    ready = httpx.get(gateway.url + "/readyz", timeout=10).json()
    assert ready["checks"]["workers"]["tracing-exporter"]["ok"] is True


def test_a_collector_that_is_down_costs_spans_not_calls(start_gateway):
    dead = f"http://127.0.0.1:{free_port()}"
    # The worker would export only after a minute: the queue of two fills, the rest is dropped.
    gateway = start_gateway(
        tracing={
            "otlp_endpoint": dead,
            "queue_size": 2,
            "export_interval_s": 60,
            "export_timeout_s": 0.5,
            "shutdown_timeout_s": 1,
        }
    )
    for index in range(5):
        answer = chat(gateway, f"call {index}", run=f"run-{index}")
        assert answer.status_code == 200, answer.text
    text = metrics_text(gateway)
    assert metric(text, "apprentice_tracing_dropped_total") == 3
    assert metric(text, "apprentice_tracing_exported_total") == 0
    assert httpx.get(gateway.url + "/readyz", timeout=10).status_code == 200
    assert gateway.stop(timeout=20) == 0, "shutdown is bounded when the collector is down"
    assert "spans not exported at shutdown" in gateway.log_text() or "final export stopped" in gateway.log_text()


def test_what_is_queued_is_exported_at_shutdown(start_gateway, collector):
    gateway = start_gateway(tracing={"export_interval_s": 60}, env={"OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint})
    answer = chat(gateway, "one call", run="run-shutdown")
    assert answer.status_code == 200
    assert collector.named("chat ") == [], "nothing before the interval"
    gateway.stop()
    spans = collector.named("chat ")
    assert [span["attributes"]["apprentice.call_id"] for span in spans] == [answer.headers["x-apprentice-call-id"]]


def test_without_tracing_the_gateway_does_not_load_opentelemetry(database_url, tmp_path):
    """The API alone is imported by FastAPI itself; the SDK and the exporter stay out."""
    script = f"""
import asyncio, sys
from apprentice.settings import Settings
import gateway.app  # noqa: F401 (the whole app, as the server imports it)
from gateway.state import GatewayState

async def main(tracing):
    settings = Settings(database_url={database_url!r}, data_dir={str(tmp_path)!r}, tracing=tracing)
    state = GatewayState(settings, settings.database_url)
    await state.start()
    await state.stop()
    return sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter")))

print(asyncio.run(main(None)))
print(asyncio.run(main({{"otlp_endpoint": "http://127.0.0.1:9"}})))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    without, with_tracing = done.stdout.strip().splitlines()[-2:]
    assert without == "[]"
    assert "opentelemetry.sdk.trace" in with_tracing, "the check above would see the SDK"


# ---- units -------------------------------------------------------------------------------
def test_finish_reasons_of_each_protocol():
    assert finish_reasons({"choices": [{"finish_reason": "stop"}, {"finish_reason": "length"}]}) == ("stop", "length")
    assert finish_reasons({"type": "message", "stop_reason": "end_turn"}) == ("end_turn",)
    assert finish_reasons({"object": "response", "status": "completed"}) == ("stop",)
    incomplete = {"object": "response", "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
    assert finish_reasons(incomplete) == ("max_output_tokens",)
    assert finish_reasons(None) == ()


def test_endpoint_from_the_setting_or_the_standard_variables(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert TracingSettings(otlp_endpoint="http://c:4318/").traces_endpoint() == "http://c:4318/v1/traces"
    assert TracingSettings(otlp_endpoint="http://c:4318/v1/traces").traces_endpoint() == "http://c:4318/v1/traces"
    with pytest.raises(ConfigError):
        TracingSettings().traces_endpoint()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://base:4318")
    assert TracingSettings().traces_endpoint() == "http://base:4318/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4318/custom")
    assert TracingSettings().traces_endpoint() == "http://traces:4318/custom"


def _record(**changes: Any) -> dict[str, Any]:
    record = {
        "id": "0190e0f8-6d1c-7a3b-8c4d-5e6f708192a3",
        "trajectory_id": "0190e0f8-6d1c-7000-8000-0000000000aa",
        "protocol": "messages",
        "tenant": "t1",
        "model": "claude",
        "upstream": "claude",
        "upstream_model": "claude-x",
        "created_at": 1_700_000_000.0,
        "latency_ms": 250.0,
        "status_code": 200,
        "request": {"messages": [{"role": "user", "content": "secret"}], "max_tokens": 64},
        "response": {"id": "msg_1", "model": "claude-x", "stop_reason": "end_turn", "content": []},
        "response_id": "msg_1",
        "prompt_tokens": 3,
        "completion_tokens": 4,
    }
    return {**record, **changes}


def test_span_of_a_native_messages_call_and_content_only_when_asked():
    settings = Settings(
        model_list=[
            {"model_name": "claude", "litellm_params": {"model": "anthropic/claude-x", "api_key": "k"}},
        ],
        tracing={"otlp_endpoint": "http://127.0.0.1:9"},
    )
    builder = SpanBuilder(settings, settings.tracing)
    span = builder.call_span(call_item(_record(), include_content=False))
    attributes = dict(span.attributes or {})
    assert span.name == "chat claude"
    assert span.context.trace_id == uuid.UUID(_record()["trajectory_id"]).int
    assert attributes["gen_ai.provider.name"] == "anthropic" and attributes["server.address"] == "api.anthropic.com"
    assert list(attributes["gen_ai.response.finish_reasons"]) == ["end_turn"]
    assert attributes["gen_ai.request.max_tokens"] == 64 and attributes["apprentice.protocol"] == "messages"
    assert span.end_time - span.start_time == 250_000_000
    assert not span.events
    with_content = builder.call_span(call_item(_record(), include_content=True))
    (event,) = with_content.events
    assert event.name == "gen_ai.client.inference.operation.details"
    assert json.loads(event.attributes["gen_ai.input.messages"]) == [{"role": "user", "content": "secret"}]


def test_span_of_a_call_to_an_endpoint_resolved_from_a_dns_name():
    """The record names the address the name resolved to, which the settings never listed."""
    settings = Settings(
        model_list=[{"model_name": "*", "litellm_params": {"model": "openai/*", "api_key": "k"}}],
        policies=[{"name": "agent", "base_model": "b", "endpoints": ["dns+http://vllm.ns.svc:8000/v1"]}],
        tracing={"otlp_endpoint": "http://127.0.0.1:9"},
    )
    builder = SpanBuilder(settings, settings.tracing)
    record = _record(upstream="agent@http://10.1.2.3:8000/v1", protocol="chat.completions")
    attributes = dict(builder.call_span(call_item(record, include_content=False)).attributes or {})
    assert attributes["server.address"] == "10.1.2.3" and attributes["server.port"] == 8000
    assert attributes["gen_ai.provider.name"] != "openai", "not the wildcard deployment's provider"


def test_a_full_queue_drops_and_counts_without_waiting():
    settings = Settings(tracing={"otlp_endpoint": "http://127.0.0.1:9", "queue_size": 2, "batch_size": 100})
    tracer = CallTracer(settings, settings.tracing)
    before = REGISTRY.get_sample_value("apprentice_tracing_dropped_total") or 0.0
    for _ in range(5):
        tracer.offer(_record())
    assert tracer.queued == 2
    assert (REGISTRY.get_sample_value("apprentice_tracing_dropped_total") or 0.0) - before == 3
    received = datetime.now(timezone.utc)
    new = NewReward(
        id=uuid.uuid4(),
        tenant="t1",
        target_kind="trajectory",
        target="x",
        target_trajectory_id=None,
        target_call=None,
        name="r",
        value=1.0,
        metrics={},
        comment=None,
        group_id=None,
        idempotency_key=None,
        source="key",
        api_key_id=None,
        observed_at=None,
    )
    stored = StoredReward(
        id=new.id,
        status="pending",
        trajectory_id=None,
        target_kind="trajectory",
        target="x",
        name="r",
        value=1.0,
        metrics={},
        comment=None,
        group_id=None,
        idempotency_key=None,
        observed_at=received,
        received_at=received,
        linked_at=None,
        superseded_at=None,
        reject_reason=None,
    )
    tracer.offer_rewards([new], [stored])
    assert tracer.queued == 2, "rewards share the bound"
    tracer.export.shutdown()
