"""/openapi.json documents every endpoint the gateway serves, the ones answered before FastAPI
(chat completions, responses, messages, count_tokens, the forwarded embeddings) included, and
documenting them changes nothing about which handler answers."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import pytest
import requests
import schemathesis

from apprentice.settings import Settings
from gateway import app as gateway_app
from gateway.endpoints import openapi
from gateway.endpoints import paths as served_first

OPENAI, ANTHROPIC = "OpenAIError", "AnthropicError"
REF = "#/components/schemas/"
# Every (method, path) GatewayApp answers before FastAPI, with its error format and whether it streams.
HOT: dict[tuple[str, str], tuple[str, bool]] = {
    **{("post", path): (OPENAI, True) for path in served_first.CHAT_COMPLETIONS},
    **{("post", path): (OPENAI, True) for path in served_first.RESPONSES},
    **{("post", path): (ANTHROPIC, True) for path in served_first.MESSAGES},
    **{("post", path): (ANTHROPIC, False) for path in served_first.COUNT_TOKENS},
    ("post", "/v1/embeddings"): (OPENAI, False),  # forwarded by the passthrough
}
RECORDED = {path for (_, path) in HOT if "count_tokens" not in path and "embeddings" not in path}
CALL_HEADERS = {"X-Trajectory-Id", "X-Apprentice-Trajectory-Id", "X-Apprentice-Call-Id"}


def _app() -> gateway_app.GatewayApp:
    return gateway_app.create_app(Settings(), "postgresql://unused@127.0.0.1/unused", check_schema_on_start=False)


@pytest.fixture
def gateway(start_gateway, fake_upstream):
    policy = {
        "name": "agent",
        "base_model": "fake-model",
        "endpoints": [fake_upstream.api_base],
        "record_tokens": False,
    }
    return start_gateway(policies=[policy])


def _resolve(spec: dict[str, Any], ref: str) -> dict[str, Any]:
    assert ref.startswith(REF), ref
    return spec["components"]["schemas"][ref[len(REF) :]]


def _refs(value: Any) -> list[str]:
    """Every `$ref` in a document."""
    if isinstance(value, list):
        return [ref for item in value for ref in _refs(item)]
    if not isinstance(value, dict):
        return []
    own = [value["$ref"]] if isinstance(value.get("$ref"), str) else []
    return own + [ref for item in value.values() for ref in _refs(item)]


def _validator(spec: dict[str, Any], ref: str) -> jsonschema.Draft202012Validator:
    """Validates instances against a documented schema, its references resolved in the document."""
    return jsonschema.Draft202012Validator({"$ref": ref, "components": spec["components"]})


def _schema_ref(operation: dict[str, Any], status: str, media_type: str = "application/json") -> str:
    return operation["responses"][status]["content"][media_type]["schema"]["$ref"]


def _stream(path: str, body: bytes) -> schemathesis.Response:
    """A 200 event stream of `path` as schemathesis reads one (the call headers the document requires included)."""
    headers = {
        "Content-Type": "text/event-stream; charset=utf-8",
        "X-Trajectory-Id": "run-1",
        "X-Apprentice-Trajectory-Id": "00000000-0000-0000-0000-000000000001",
        "X-Apprentice-Call-Id": "call-1",
    }
    request = requests.Request("POST", "http://gateway" + path).prepare()
    return schemathesis.Response(
        200, {name: [value] for name, value in headers.items()}, body, request, elapsed=0.0, verify=True
    )


def test_every_served_path_is_documented_with_bodies_errors_headers_and_streams(gateway):
    answer = httpx.get(gateway.url + "/openapi.json")
    assert answer.status_code == 200
    spec = answer.json()
    assert spec["openapi"].startswith("3.1")
    paths = spec["paths"]

    # Every FastAPI route, and every path GatewayApp serves before FastAPI.
    fastapi_routes = {(m, p) for p, m in openapi._operations(_app().fastapi.routes)}
    documented = {(method, path) for path, item in paths.items() for method in item}
    assert fastapi_routes | set(HOT) | {("get", "/v1/models")} <= documented

    for (method, path), (error_model, streamed) in HOT.items():
        operation = paths[path][method]
        body = operation["requestBody"]
        assert body["required"] is True
        request_schema = _resolve(spec, body["content"]["application/json"]["schema"]["$ref"])
        assert "model" in request_schema["required"] and request_schema["additionalProperties"] is True
        assert "200" in operation["responses"] and _schema_ref(operation, "200")
        assert ("text/event-stream" in operation["responses"]["200"]["content"]) is streamed
        if streamed:  # one event, as OpenAPI 3.1 reads a stream: its fields, the data a JSON text
            event = _resolve(spec, _schema_ref(operation, "200", "text/event-stream"))
            assert event["required"] == ["data"] and set(event["properties"]) == {"data", "event", "id", "retry"}
        for status in ("401", "404", "413", "502"):
            assert _schema_ref(operation, status) == REF + error_model, (path, status)
        if path in RECORDED:
            names = {parameter["name"] for parameter in operation["parameters"] if parameter["in"] == "header"}
            assert {"X-Trajectory-Id", "X-Group-Id"} <= names
            assert CALL_HEADERS <= set(operation["responses"]["200"]["headers"])
        if error_model == ANTHROPIC:
            names = {parameter["name"] for parameter in operation["parameters"]}
            assert "anthropic-version" in names
            assert {"AnthropicApiKey": []} in operation["security"]
    anthropic_key = spec["components"]["securitySchemes"]["AnthropicApiKey"]
    assert (anthropic_key["type"], anthropic_key["in"], anthropic_key["name"]) == ("apiKey", "header", "x-api-key")

    # The two error formats, as each protocol's clients read them.
    openai_error = _resolve(spec, _resolve(spec, REF + OPENAI)["properties"]["error"]["$ref"])
    assert set(openai_error["properties"]) == {"message", "type", "param", "code"}
    anthropic = _resolve(spec, REF + ANTHROPIC)
    assert anthropic["properties"]["type"]["const"] == "error"
    assert set(_resolve(spec, anthropic["properties"]["error"]["$ref"])["properties"]) == {"type", "message"}

    models = paths["/v1/models"]["get"]
    assert _schema_ref(models, "200") == REF + "ModelList" and _schema_ref(models, "401") == REF + OPENAI

    # Errors are answered in a protocol's own format everywhere, never as FastAPI's 422.
    for path, item in paths.items():
        for method, operation in item.items():
            assert "422" not in operation["responses"], (method, path)
            for status, response in operation["responses"].items():
                if status[0] in "45":
                    assert response["content"]["application/json"]["schema"], (method, path, status)

    # The document is well formed: every reference resolves, every schema is a valid JSON schema.
    for ref in _refs(spec):
        _resolve(spec, ref)
    for schema in spec["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)
    try:
        from openapi_spec_validator import validate
    except ImportError:  # not a dependency: checked where it is installed
        pass
    else:
        validate(spec)

    assert httpx.get(gateway.url + "/docs").status_code == 200


def test_documented_endpoints_still_reach_their_handlers_and_answer_as_documented(gateway):
    spec = httpx.get(gateway.url + "/openapi.json").json()
    paths = spec["paths"]
    # Streams are judged as the fuzzer judges them (tests/test_schemathesis.py): every event's data
    # against the `contentSchema` of the document's event.
    fuzzer = schemathesis.openapi.from_dict(spec)
    chat = {"model": "fake-model", "messages": [{"role": "user", "content": "Hello"}]}
    responses = {"model": "agent", "input": "Hello"}
    messages = {"model": "agent", "max_tokens": 32, "messages": [{"role": "user", "content": "Hello"}]}
    bodies: dict[str, dict[str, Any]] = {
        **{path: chat for path in served_first.CHAT_COMPLETIONS},
        **{path: responses for path in served_first.RESPONSES},
        **{path: messages for path in served_first.MESSAGES},
        **{path: {k: v for k, v in messages.items() if k != "max_tokens"} for path in served_first.COUNT_TOKENS},
        "/v1/embeddings": {"model": "fake-model", "input": ["a", "b"]},
    }
    with httpx.Client(base_url=gateway.url, headers={"x-api-key": "any", "anthropic-version": "2023-06-01"}) as client:
        for (method, path), (error_model, streamed) in HOT.items():
            operation = paths[path][method]
            answer = client.post(path, json=bodies[path])
            assert answer.status_code == 200, (path, answer.text)
            _validator(spec, _schema_ref(operation, "200")).validate(answer.json())
            if path in RECORDED:  # the ASGI handler answered: it recorded the call
                assert CALL_HEADERS <= {name.title() for name in answer.headers}, path
            elif "count_tokens" in path:  # the gateway counted (the passthrough would have asked the upstream)
                assert answer.headers["x-apprentice-token-count"] in ("tokenizer", "estimate")
            else:  # forwarded by the passthrough, not recorded
                assert answer.json()["data"][1]["index"] == 1 and "x-apprentice-call-id" not in answer.headers

            if "embeddings" not in path:  # (an unknown model's embeddings go to the default upstream)
                refused = client.post(path, json={**bodies[path], "model": "no-such-model"})
                assert refused.status_code == 404, (path, refused.text)
                _validator(spec, REF + error_model).validate(refused.json())

            if streamed:
                stream = client.post(path, json={**bodies[path], "stream": True})
                assert stream.status_code == 200, (path, stream.text)
                assert stream.headers["content-type"].startswith("text/event-stream")
                data = [line[5:].strip() for line in stream.text.splitlines() if line.startswith("data:")]
                assert data and (data[-1] == "[DONE]") == ("chat" in path), (path, data[-1:])
                fuzzer[path]["POST"].validate_response(stream)


def test_each_streamed_event_carries_its_protocols_json_or_done_as_its_data():
    """The event-stream schema constrains each event's data (what schemathesis checks of a stream):
    a chunk, an error body or `[DONE]` for chat; Responses and Messages events, which end with an
    event of their own (no `[DONE]`); anything else is a violation."""
    fuzzer = schemathesis.openapi.from_dict(_app().fastapi.openapi())
    chunk = b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[]}'
    error = b'{"error":{"message":"broke","type":"upstream_error","param":null,"code":"stream_interrupted"}}'
    conforming = {
        "/v1/chat/completions": b"data: " + chunk + b"\n\ndata: " + error + b"\n\ndata: [DONE]\n\n",
        "/v1/responses": b'event: response.created\ndata: {"type":"response.created","sequence_number":0}\n\n',
        "/messages": b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
        b'event: error\ndata: {"type":"error","error":{"type":"api_error","message":"broke"}}\n\n',
    }
    violating = {
        "/chat/completions": b'data: {"id":5}\n\n',
        "/v1/chat/completions": b"data: not json\n\n",
        "/responses": b"data: [DONE]\n\n",
        "/v1/messages": b'event: message_stop\ndata: {"stop":true}\n\n',
    }
    for path, body in conforming.items():
        fuzzer[path]["POST"].validate_response(_stream(path, body))
    for path, body in violating.items():
        assert not fuzzer[path]["POST"].is_valid_response(_stream(path, body)), path


def _integer_bounds(node: Any, path: str = "") -> list[tuple[str, float]]:
    """Every `minimum`/`maximum` of an integer schema in a schema document, with where it is."""
    found: list[tuple[str, float]] = []
    if isinstance(node, dict):
        if node.get("type") == "integer":
            found += [(f"{path}/{key}", node[key]) for key in ("minimum", "maximum") if key in node]
        for key, value in node.items():
            found += _integer_bounds(value, f"{path}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _integer_bounds(value, f"{path}/{index}")
    return found


def test_every_integer_bound_is_a_64_bit_integer_as_the_document_writes_it():
    """The document writes its bounds as JSON numbers that readers take as doubles: the chat seed's
    maximum 2**63 - 1 came out as 9.223372036854776e+18, which is 2**63, and a fuzzer (schemathesis,
    seed 306907011) sent 9223372036854776000 as a valid seed, which the upstream refuses. Every
    integer bound, as written, must be an integer of 64 bits."""
    document = json.loads(json.dumps(_app().fastapi.openapi()))
    bounds = _integer_bounds(document)
    assert any("seed" in path for path, _ in bounds)
    wrong = [(path, value) for path, value in bounds if value != int(value) or not -(2**63) <= value < 2**63]
    assert not wrong, wrong


def test_documentation_never_routes_a_request():
    """GatewayApp gives FastAPI a /v1/* request whenever one of its routes matches the path: a
    documented operation must not be one, whatever the method, or the passthrough and the hot
    handlers would lose requests to it."""
    app = _app()
    routed = {path for _, path in openapi._operations(app.fastapi.routes)}
    for _, path in HOT:
        assert path not in routed
        for method in ("GET", "POST", "PUT", "DELETE"):
            scope = {"type": "http", "path": path, "method": method, "headers": [], "query_string": b""}
            assert not app._fastapi_handles(scope), (method, path)
    assert not {id(route) for route in openapi.router.routes} & {id(route) for route in app.fastapi.router.routes}
    document = app.fastapi.openapi()
    assert app.fastapi.openapi() is document  # built once
    assert json.dumps(document)  # plain JSON


def test_keys_bounds_and_allow_are_documented_as_the_gateway_enforces_them(gateway):
    """What schemathesis checks on every run (tests/test_schemathesis.py), here in a few seconds:
    each operation names the key it takes, a 405 lists every method of its path, and the request
    headers the gateway bounds are bounded in the document."""
    spec = httpx.get(gateway.url + "/openapi.json").json()
    unauthenticated = {"/healthz", "/readyz", "/metrics"}
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            if path in unauthenticated:
                assert "security" not in operation, (method, path)
                continue
            schemes = {name for requirement in operation["security"] for name in requirement}
            admin = path.startswith("/v1/admin/") or (method, path) in {
                ("get", "/v1/trajectories"),
                ("get", "/v1/rewards/pending"),
            }
            assert "401" in operation["responses"], (method, path)
            if admin:
                assert schemes == {"AdminKey"} and "403" in operation["responses"], (method, path, schemes)
            else:
                assert schemes and "AdminKey" not in schemes, (method, path, schemes)
    assert "text/plain" in spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]

    chat = spec["paths"]["/v1/chat/completions"]["post"]
    headers = {parameter["name"]: parameter["schema"] for parameter in chat["parameters"]}
    for name in ("X-Trajectory-Id", "X-Group-Id"):
        [text] = [schema for schema in headers[name]["anyOf"] if schema["type"] == "string"]
        assert (text["maxLength"], text["pattern"]) == (256, r"\S"), name
    rewards = spec["paths"]["/v1/rewards"]["post"]
    key = next(parameter for parameter in rewards["parameters"] if parameter["name"] == "Idempotency-Key")
    assert (key["schema"]["minLength"], key["schema"]["maxLength"]) == (1, 200)

    too_long = httpx.post(
        gateway.base_url + "/chat/completions",
        json={"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]},
        headers={"X-Trajectory-Id": "x" * 257},
    )
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "X-Trajectory-Id"

    # A path two routes serve lists both methods; the hot paths without /v1 take POST only.
    options = httpx.request("OPTIONS", gateway.base_url + "/trajectories/0")
    assert options.status_code == 405
    assert set(options.headers["allow"].split(", ")) >= {"GET", "DELETE"}
    assert options.json()["error"]["type"] == "invalid_request_error"
    for path in ("/chat/completions", "/responses", "/messages", "/messages/count_tokens"):
        wrong = httpx.get(gateway.url + path)
        assert (wrong.status_code, wrong.headers["allow"]) == (405, "POST"), path
