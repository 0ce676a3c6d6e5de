"""The OpenAPI document (`/openapi.json`, `/docs`): FastAPI's routes, and the endpoints served before it.

GatewayApp (gateway/app.py) hands `POST /v1/chat/completions`, `/v1/responses`, `/v1/messages`
and `/v1/messages/count_tokens` (with or without `/v1`) to plain ASGI handlers, and every other
`/v1/*` path FastAPI does not route to passthrough.py, before FastAPI sees the request; FastAPI's
own document would list none of them. This module documents them without routing them: their
operations are declared on `router`, an APIRouter that is never included in the app, and
`install` replaces the app's `openapi()` with one that runs FastAPI's generator over these
declarations and the app's own routes together.

Why not FastAPI routes "for documentation only": GatewayApp gives FastAPI any `/v1/*` request
one of its routes matches, by path alone (`_fastapi_handles`), so a route for `POST
/v1/embeddings` would take embeddings away from the passthrough, and one for `POST
/v1/chat/completions` would send `GET /v1/chat/completions` to FastAPI's 405 instead of the
upstream. Kept off the app, a declaration cannot change which handler answers, and cannot answer
twice; its body raises should anything ever call it.

The wire types are each endpoint's (`<endpoint>/protocol.py`); what is here is what the
document says about them: statuses and error formats, headers, streams. After generation,
`_complete` adds what FastAPI's generator cannot say:

- a streamed answer's `text/event-stream` content beside the `application/json` answer: its
  schema is one server-sent event as OpenAPI 3.1 tools read it (`{data, event, id, retry}`,
  schemathesis among them), whose `data` is a JSON text (`contentMediaType`) holding the
  protocol's event or error body (`contentSchema`), or chat's literal `[DONE]` (`EventStream`);
- 400 in OpenAI's format where FastAPI wrote 422 (`HTTPValidationError`): the app answers a
  request FastAPI finds invalid with 400 and OpenAI's error body (app.py, `validation_error`);
- OpenAI's error body on the app's own error statuses that name none (every error of a FastAPI
  route is written in OpenAI's format by the app's exception handlers);
- the answers of routes that return raw bodies (`GET /v1/models`, `GET /v1/responses/{id}`,
  its input items), when the route declares none itself;
- `NUL_FREE` on the strings of every FastAPI route's parameters and request fields, and
  `NulFreeJson` (any JSON value, NUL in none of its strings and keys) for their free-form values
  and the keys of their objects: what the app's one NUL check refuses (gateway/http/query_text.py);
- OpenAPI links (`LINKS`) from the answers that name a policy, version, trajectory, response,
  reward or key to the operations that take it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Header, Security
from fastapi.openapi.utils import get_openapi
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from gateway.endpoints.chat_completions.protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    OpenAIError,
)
from gateway.endpoints.embeddings.protocol import EmbeddingList, EmbeddingsRequest
from gateway.endpoints.messages.protocol import (
    AnthropicError,
    CountTokensRequest,
    Message,
    MessagesRequest,
    MessageStreamEvent,
    TokenCount,
)
from gateway.endpoints.models.protocol import ModelList
from gateway.endpoints.paths import CHAT_COMPLETIONS, COUNT_TOKENS, MESSAGES, RESPONSES, SERVED_FIRST
from gateway.endpoints.responses.protocol import (
    InputItemList,
    ResponseObject,
    ResponsesRequest,
    ResponseStreamEvent,
)
from gateway.http.documented import ANTHROPIC_KEY, ERROR_DESCRIPTIONS, GATEWAY_KEY
from gateway.http.query_text import NUL_FREE

REF = "#/components/schemas/"
WITHOUT_V1 = "without /v1"

TAGS: list[dict[str, Any]] = [
    {
        "name": "chat completions",
        "description": "OpenAI's chat completions, forwarded (byte for byte to OpenAI-compatible upstreams) and "
        "recorded: each call joins its run's trajectory.",
    },
    {
        "name": "responses",
        "description": "OpenAI's Responses API: forwarded as it is to an upstream that speaks it (`openai/` "
        "deployments, or `protocols: [responses]`), translated to chat completions for a policy or any other "
        "deployment; recorded either way, and readable back from the record.",
    },
    {
        "name": "messages",
        "description": "Anthropic's Messages API (`ANTHROPIC_BASE_URL` is the gateway's root, without /v1): "
        "forwarded as it is to an upstream that speaks it (`anthropic/` deployments, or `protocols: [messages]`), "
        "translated to chat completions otherwise; recorded either way. Every answer, errors included, is in "
        "Anthropic's format.",
    },
    {
        "name": "openai",
        "description": "The rest of OpenAI's API. Embeddings, and any other `/v1/*` path not listed here "
        "(moderations, files, ...), are forwarded unchanged to the deployment of the `model` they name, or to "
        "`default_upstream`, with the deployment's own key, and are not recorded.",
    },
    {
        "name": WITHOUT_V1,
        "description": "The same endpoints for clients whose base URL leaves out `/v1`.",
    },
]

# ---- what the declarations share --------------------------------------------------------

Bearer = Annotated[HTTPAuthorizationCredentials | None, Security(GATEWAY_KEY)]
XApiKey = Annotated[str | None, Security(ANTHROPIC_KEY)]
# A run's and a group's name: at most 256 characters, not blank (request.py refuses others with 400).
NAME_LENGTH = 256
NOT_BLANK = r"\S"
TrajectoryId = Annotated[
    str | None,
    Header(
        alias="X-Trajectory-Id",
        description="The client's name for its run: the call joins that trajectory. "
        "Without it, calls are stitched into runs by their content. The value the gateway returned works too.",
        max_length=NAME_LENGTH,
        pattern=NOT_BLANK,
    ),
]
GroupId = Annotated[
    str | None,
    Header(
        alias="X-Group-Id",
        description="The task group of the run (runs of one task, compared with each other in training).",
        max_length=NAME_LENGTH,
        pattern=NOT_BLANK,
    ),
]
TaskFamily = Annotated[
    str | None,
    Header(
        alias="X-Task-Family",
        description="The run's task family (apprentice.grouping.task_family): runs of different prompts that one "
        "baseline compares, e.g. one agent's tickets. Without it: the system prompt and tools, else the policy.",
        max_length=NAME_LENGTH,
        pattern=NOT_BLANK,
    ),
]
AnthropicVersion = Annotated[
    str | None,
    Header(
        alias="anthropic-version",
        description="Passed to an upstream that speaks Messages (`2023-06-01` when absent); otherwise not needed.",
    ),
]
AnthropicBeta = Annotated[
    str | None, Header(alias="anthropic-beta", description="Passed to an upstream that speaks Messages.")
]

CALL_HEADERS: dict[str, Any] = {
    "X-Trajectory-Id": {
        "description": "The run this call belongs to: the client's own name when it gave one, else the gateway's id.",
        "schema": {"type": "string"},
    },
    "X-Apprentice-Trajectory-Id": {
        "description": "The gateway's id of the run, always (rewards and the trajectory API accept either).",
        "schema": {"type": "string", "format": "uuid"},
    },
    "X-Apprentice-Call-Id": {"description": "The gateway's id of this call.", "schema": {"type": "string"}},
}
RECORDED = (
    " The call is recorded and answered with `X-Trajectory-Id`, `X-Apprentice-Trajectory-Id` and "
    "`X-Apprentice-Call-Id` (an upstream's error too, once the call was routed)."
)

ERRORS: dict[int, str] = {
    400: "The request is malformed (not a JSON object, a required field missing or of the wrong type; the "
    "message and `param` name the field), or the upstream's own 400.",
    401: ERROR_DESCRIPTIONS[401],
    404: "The model is not served here (the message lists the models that are).",
    413: ERROR_DESCRIPTIONS[413],
    429: "The key's rate limit (see `Retry-After`), or the upstream's after the gateway's retries.",
    502: "No upstream answered, or one answered with something unusable.",
    503: "The key store is unreachable for a key not yet known, or the upstream is unavailable.",
    504: "The upstream timed out.",
}
UPSTREAM_STATUSES = " Other statuses an upstream answers with come through with its error."


def _errors(model: type[BaseModel], statuses: Iterable[int], fmt: str) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": model, "description": f"{ERRORS[status]} ({fmt} format)"} for status in statuses}


OPENAI_ERRORS = _errors(OpenAIError, (400, 401, 404, 413, 429, 502, 503, 504), "OpenAI's")
ANTHROPIC_ERRORS = _errors(AnthropicError, (400, 401, 404, 413, 429, 502, 503, 504), "Anthropic's")


@dataclass(frozen=True)
class EventStream:
    """What the events of a streamed answer carry: each event's `data` is a JSON text holding one
    of `payloads` (the protocol's event, or the error body a stream broken off mid-way ends with);
    `done`: the stream ends with the literal `data: [DONE]` (chat completions) rather than an
    event of its own. `name` is the component the document declares for one event."""

    name: str
    payloads: tuple[type[BaseModel], ...]
    done: bool = False
    event: str = "The event's type, when the protocol names it (`event: <type>`, the `type` of its data)."


CHAT_EVENTS = EventStream(
    "ChatCompletionServerSentEvent",
    (ChatCompletionChunk, OpenAIError),
    done=True,
    event="Not sent by OpenAI's chat streams (read as `message`).",
)
RESPONSE_EVENTS = EventStream("ResponseServerSentEvent", (ResponseStreamEvent,))
MESSAGE_EVENTS = EventStream("MessageServerSentEvent", (MessageStreamEvent, AnthropicError))

# The events of each streamed operation, by (path, method): `_complete` adds its content.
STREAMS: dict[tuple[str, str], EventStream] = {}


class DocumentationOnly(RuntimeError):
    """A declaration here was called: GatewayApp serves its path before FastAPI (see the module docstring)."""


def _declare(
    served_at: tuple[str, ...],
    endpoint: Callable[..., Any],
    *,
    tag: str,
    summary: str,
    description: str,
    ok: dict[str, Any],
    errors: dict[int | str, dict[str, Any]],
    stream: EventStream | None = None,
) -> None:
    """Declare `POST` on each path (the first is the /v1 one, the others its aliases) on `router`."""
    for position, path in enumerate(served_at):
        router.add_api_route(
            path,
            endpoint,
            methods=["POST"],
            tags=[tag] if position == 0 else [WITHOUT_V1],
            summary=summary if position == 0 else f"{summary} (as POST {served_at[0]})",
            description=description,
            response_model=None,
            responses={200: ok, **errors},
        )
        if stream is not None:
            STREAMS[(path, "post")] = stream


def _never() -> DocumentationOnly:
    return DocumentationOnly("this operation is documented here and served by GatewayApp's ASGI handlers")


router = APIRouter()  # never included in an app: see the module docstring

# ---- the operations ----------------------------------------------------------------------


async def create_chat_completion(
    body: ChatCompletionRequest,
    key: Bearer,
    trajectory: TrajectoryId = None,
    group: GroupId = None,
    family: TaskFamily = None,
) -> None:
    raise _never()


_declare(
    CHAT_COMPLETIONS,
    create_chat_completion,
    tag="chat completions",
    summary="Create a chat completion",
    description="OpenAI's chat completions: everything the API allows, and fields the gateway does not know, "
    "reach the upstream as sent; the gateway only removes `metadata.trajectory_id`, `metadata.group_id` and "
    "`metadata.task_family`, asks "
    "for usage on streams, and sets a policy's adapter, temperature and token capture (removed from the answer). "
    "With `stream: true` the answer is server-sent events, `data: <chunk>` each, ended by `data: [DONE]`."
    + RECORDED
    + UPSTREAM_STATUSES,
    ok={"model": ChatCompletion, "description": "The completion, or its event stream.", "headers": CALL_HEADERS},
    errors=OPENAI_ERRORS,
    stream=CHAT_EVENTS,
)


async def create_response(
    body: ResponsesRequest,
    key: Bearer,
    trajectory: TrajectoryId = None,
    group: GroupId = None,
    family: TaskFamily = None,
) -> None:
    raise _never()


_declare(
    RESPONSES,
    create_response,
    tag="responses",
    summary="Create a model response",
    description="OpenAI's Responses API. An upstream that speaks it (`openai/` deployments, or a `model_list` "
    "entry with `protocols: [responses]`) gets the request as it is (with the client's `OpenAI-Organization`, "
    "`OpenAI-Project` and `OpenAI-Beta`) and answers it; for a policy, or any other deployment, the request is "
    "translated to chat completions and the answer back, so a policy records the exact tokens it trains on. "
    "`previous_response_id` continues that response's conversation and trajectory (an unknown one is a 400). "
    "With `stream: true` the answer is server-sent events, `event: <type>` and `data: <event>` each, ended by "
    "`response.completed` (or `response.incomplete`, `response.failed`)." + RECORDED + UPSTREAM_STATUSES,
    ok={"model": ResponseObject, "description": "The response, or its event stream.", "headers": CALL_HEADERS},
    errors=OPENAI_ERRORS,
    stream=RESPONSE_EVENTS,
)


async def create_message(
    body: MessagesRequest,
    api_key: XApiKey,
    key: Bearer,
    version: AnthropicVersion = None,
    beta: AnthropicBeta = None,
    trajectory: TrajectoryId = None,
    group: GroupId = None,
    family: TaskFamily = None,
) -> None:
    raise _never()


_declare(
    MESSAGES,
    create_message,
    tag="messages",
    summary="Create a message",
    description="Anthropic's Messages API. An upstream that speaks it (`anthropic/` deployments, or a `model_list` "
    "entry with `protocols: [messages]`) gets the request as it is, with the deployment's own key and the "
    "client's `anthropic-version` and `anthropic-beta`; for a policy, or any other deployment, the request is "
    "translated to chat completions and the answer back, so a policy records the exact tokens it trains on. "
    "Runs are stitched by their content like chat runs. With `stream: true` the answer is server-sent events, "
    "`event: <type>` and `data: <event>` each, ended by `message_stop` (or an `error` event)."
    + RECORDED
    + UPSTREAM_STATUSES,
    ok={"model": Message, "description": "The message, or its event stream.", "headers": CALL_HEADERS},
    errors=ANTHROPIC_ERRORS,
    stream=MESSAGE_EVENTS,
)


async def count_message_tokens(
    body: CountTokensRequest,
    api_key: XApiKey,
    key: Bearer,
    version: AnthropicVersion = None,
    beta: AnthropicBeta = None,
) -> None:
    raise _never()


_declare(
    COUNT_TOKENS,
    count_message_tokens,
    tag="messages",
    summary="Count the tokens of a message",
    description="Forwarded to an upstream that speaks Messages; otherwise counted with the model endpoint's own "
    "tokenizer when it offers vLLM's `/tokenize` (a policy), else estimated at one token per four bytes of text. "
    "Not recorded.",
    ok={
        "model": TokenCount,
        "description": "The count.",
        "headers": {
            "X-Apprentice-Token-Count": {
                "description": "How the gateway counted: `tokenizer` or `estimate` (absent when the upstream did).",
                "schema": {"type": "string", "enum": ["tokenizer", "estimate"]},
            }
        },
    },
    errors={status: ANTHROPIC_ERRORS[status] for status in (400, 401, 404, 413, 429, 502, 503)},
)


async def create_embeddings(body: EmbeddingsRequest, key: Bearer) -> None:
    raise _never()


_declare(
    ("/v1/embeddings",),
    create_embeddings,
    tag="openai",
    summary="Create embeddings",
    description="Forwarded unchanged (by passthrough.py) to the deployment of `model`, or to `default_upstream`, "
    "with the deployment's own key; the upstream's answer, errors included, comes back as it is. Not recorded.",
    ok={"model": EmbeddingList, "description": "The upstream's answer."},
    errors={
        400: {"description": "The upstream refused the request (its own error body)."},
        401: OPENAI_ERRORS[401],
        404: {"model": OpenAIError, "description": "No OpenAI-compatible upstream for this model (OpenAI's format)."},
        413: OPENAI_ERRORS[413],
        429: OPENAI_ERRORS[429],
        502: {"model": OpenAIError, "description": "The upstream did not answer (OpenAI's format)."},
        503: OPENAI_ERRORS[503],
    },
)

# Routes of the app that answer raw bodies: their answers, documented here when they declare none.
ANSWERS: dict[tuple[str, str], tuple[type[BaseModel], tuple[int, ...]]] = {
    ("/v1/models", "get"): (ModelList, (401, 429, 503)),
    ("/v1/responses/{response_id}", "get"): (ResponseObject, ()),
    ("/v1/responses/{response_id}/input_items", "get"): (InputItemList, (400,)),
}


@dataclass(frozen=True)
class ResourceLink:
    """An OpenAPI link: the answer of `source` (method, path, status) names a resource, which
    `targets` (link name: method, path) take as the parameter `parameter` (`value`, a runtime
    expression), or in their body (`body`)."""

    source: tuple[str, str, str]
    targets: dict[str, tuple[str, str]]
    parameter: str | None = None
    value: str = ""
    body: dict[str, str] | None = None


_POLICY_OPERATIONS = {
    "Policy": ("get", "/v1/admin/policies/{policy}"),
    "Versions": ("get", "/v1/admin/policies/{policy}/versions"),
    "Rollback": ("post", "/v1/admin/policies/{policy}/rollback"),
    "Pause": ("post", "/v1/admin/policies/{policy}/pause"),
    "Resume": ("post", "/v1/admin/policies/{policy}/resume"),
    "JudgeAgreement": ("get", "/v1/admin/policies/{policy}/judge/agreement"),
    "Judge": ("get", "/v1/admin/policies/{policy}/judge"),
    "Teacher": ("get", "/v1/admin/policies/{policy}/teacher"),
}
_VERSION_OPERATIONS = {
    "Version": ("get", "/v1/admin/versions/{version}"),
    "Approve": ("post", "/v1/admin/versions/{version}/approve"),
    "Reject": ("post", "/v1/admin/versions/{version}/reject"),
    "Promote": ("post", "/v1/admin/versions/{version}/promote"),
}
_TRAJECTORY_OPERATIONS = {
    "Trajectory": ("get", "/v1/trajectories/{trajectory_id}"),
    "DeleteTrajectory": ("delete", "/v1/trajectories/{trajectory_id}"),
}
_RESPONSE_OPERATIONS = {
    "Response": ("get", "/v1/responses/{response_id}"),
    "InputItems": ("get", "/v1/responses/{response_id}/input_items"),
}
_RECORDED_TRAJECTORY = "$response.header.X-Apprentice-Trajectory-Id"

# Where an answer names a policy, a version, a trajectory, a response, a reward or a key, and the
# operations that take it: a client (and the stateful fuzzer, tests/test_schemathesis.py) follows
# them to reach those operations with real ids.
LINKS: list[ResourceLink] = [
    ResourceLink(("get", "/v1/admin/policies", "200"), _POLICY_OPERATIONS, "policy", "$response.body#/data/0/name"),
    ResourceLink(
        ("get", "/v1/admin/policies/{policy}/versions", "200"),
        _VERSION_OPERATIONS,
        "version",
        "$response.body#/data/0/id",
    ),
    ResourceLink(
        ("get", "/v1/admin/policies/{policy}/versions", "200"),
        {"RollbackTo": ("post", "/v1/admin/policies/{policy}/rollback")},
        "policy",
        "$request.path.policy",
        body={"version_id": "$response.body#/data/0/id"},
    ),
    *[
        ResourceLink(("post", path, "200"), _TRAJECTORY_OPERATIONS, "trajectory_id", _RECORDED_TRAJECTORY)
        for path in (*CHAT_COMPLETIONS, *MESSAGES)
    ],
    ResourceLink(
        ("get", "/v1/trajectories", "200"), _TRAJECTORY_OPERATIONS, "trajectory_id", "$response.body#/data/0/id"
    ),
    *[
        ResourceLink(("post", path, "200"), _RESPONSE_OPERATIONS, "response_id", "$response.body#/id")
        for path in RESPONSES
    ],
    ResourceLink(
        ("post", "/v1/rewards", "200"),
        {"Reward": ("get", "/v1/rewards/{reward_id}")},
        "reward_id",
        "$response.body#/id",
    ),
    ResourceLink(
        ("post", "/v1/admin/keys", "201"),
        {"KeyLimits": ("put", "/v1/admin/keys/{key_id}/limits"), "RevokeKey": ("delete", "/v1/admin/keys/{key_id}")},
        "key_id",
        "$response.body#/id",
    ),
]


def _links(spec: dict[str, Any]) -> None:
    """`LINKS` into the answers of the document, naming their targets by operationId."""
    paths: dict[str, dict[str, Any]] = spec["paths"]
    for link in LINKS:
        method, path, status = link.source
        links = paths[path][method]["responses"][status].setdefault("links", {})
        for name, (target_method, target_path) in link.targets.items():
            declared: dict[str, Any] = {"operationId": paths[target_path][target_method]["operationId"]}
            if link.parameter is not None:
                declared["parameters"] = {link.parameter: link.value}
            if link.body is not None:
                declared["requestBody"] = link.body
            links[name] = declared


# ---- the document ------------------------------------------------------------------------


def install(app: FastAPI) -> None:
    """Make the app's `/openapi.json` (and `/docs`) document every endpoint the gateway serves."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def document(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document of the app's routes and of the operations declared here."""
    served = {(path, method) for path, method in _operations(app.routes)}
    declared = set(_operations(router.routes))
    if served & declared:
        raise ValueError(f"declared here and routed by FastAPI too: {sorted(served & declared)}")
    undocumented = {(path, "post") for path in SERVED_FIRST} - served - declared
    if undocumented:
        raise ValueError(f"served before FastAPI but documented nowhere: {sorted(undocumented)}")
    spec = get_openapi(
        title=app.title,
        version=app.version,
        openapi_version=app.openapi_version,
        summary=app.summary,
        description=app.description,
        routes=[*router.routes, *app.routes],
        tags=TAGS,
        servers=app.servers,
        separate_input_output_schemas=app.separate_input_output_schemas,
    )
    _complete(spec)
    _nul_free(spec, declared)
    _links(spec)
    return spec


def _operations(routes: Iterable[Any]) -> Iterable[tuple[str, str]]:
    """(path, method) of every documented operation. FastAPI keeps an included router as one route
    object that holds the router's own (its `original_router`); the app includes every router
    without a prefix, so their paths are the app's."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from _operations(included.routes)
            continue
        if getattr(route, "include_in_schema", False):
            for method in getattr(route, "methods", None) or ():
                yield route.path_format, method.lower()


def _complete(spec: dict[str, Any]) -> None:
    """What FastAPI's generator leaves out (see the module docstring)."""
    paths: dict[str, dict[str, Any]] = spec["paths"]
    for (path, method), events in STREAMS.items():
        content = paths[path][method]["responses"]["200"]["content"]
        content["text/event-stream"] = {"schema": _event_component(spec, events)}
    for (path, method), (answer, statuses) in ANSWERS.items():
        responses = paths[path][method]["responses"]
        json_content = responses["200"].setdefault("content", {}).setdefault("application/json", {})
        if not json_content.get("schema"):
            json_content["schema"] = _component(spec, answer)
        for status in statuses:
            responses.setdefault(str(status), {"description": ERRORS[status]})
    openai_error = _component(spec, OpenAIError)
    for path_item in paths.values():
        for operation in path_item.values():
            responses = operation["responses"]
            validation = responses.pop("422", None)
            if validation is not None:
                responses.setdefault("400", {"description": "The request is malformed (`param` names the field)."})
            for status, response in responses.items():
                if status[0] in "45" and not response.get("content"):
                    response["content"] = {"application/json": {"schema": openai_error}}
    schemas = spec["components"]["schemas"]
    for name in ("HTTPValidationError", "ValidationError"):  # FastAPI's 422 body, now unused
        others = {other: schema for other, schema in schemas.items() if other != name}
        if f'"{REF}{name}"' not in json.dumps([paths, others]):
            schemas.pop(name, None)


NUL_FREE_JSON = "NulFreeJson"
_NUL_FREE_JSON_REF = {"$ref": REF + NUL_FREE_JSON}
# What the app's NUL check (gateway/http/query_text.py) lets through in a free-form value: any
# JSON, NUL in none of its strings, at any depth, nor in its objects' keys.
NUL_FREE_JSON_SCHEMA: dict[str, Any] = {
    "title": NUL_FREE_JSON,
    "description": "Any JSON value without the NUL character (\\u0000) in its strings or object keys, at any "
    "depth: a request holding one is refused with 400 naming where it is.",
    "anyOf": [
        {"type": "string", "pattern": NUL_FREE},
        {"type": ["number", "boolean", "null"]},
        {"type": "array", "items": _NUL_FREE_JSON_REF},
        {"type": "object", "propertyNames": {"pattern": NUL_FREE}, "additionalProperties": _NUL_FREE_JSON_REF},
    ],
}
# Keywords that say nothing about which values a schema allows: a schema of these alone is any JSON.
_ANNOTATIONS = {"title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly"}


def _nul_free(spec: dict[str, Any], declared: set[tuple[str, str]]) -> None:
    """The app's routes refuse NUL in every parameter and request field, and anywhere in their
    JSON bodies, object keys included (gateway/http/query_text.py): their strings say so with
    `NUL_FREE` where they have no pattern of their own, their free-form values (an object's
    undeclared properties, an array of anything, `Any`) are `NulFreeJson`. The operations
    declared here (chat, responses, messages) take NUL in what they forward and keep no such rule."""
    schemas: dict[str, Any] = spec.setdefault("components", {}).setdefault("schemas", {})
    schemas[NUL_FREE_JSON] = NUL_FREE_JSON_SCHEMA
    operations = [
        (path, method, operation) for path, item in spec["paths"].items() for method, operation in item.items()
    ]
    declared_refs = {
        ref
        for path, method, operation in operations
        if (path, method) in declared
        for ref in _reachable_refs(operation, schemas)
    }
    body_refs: set[str] = set()
    for path, method, operation in operations:
        if (path, method) in declared:
            continue
        for parameter in operation.get("parameters", []):
            if parameter.get("in") in ("path", "query", "header"):
                _strings_nul_free(parameter.get("schema", {}))
        for content in operation.get("requestBody", {}).get("content", {}).values():
            schema = content.get("schema", {})
            _strings_nul_free(schema)
            body_refs |= _reachable_refs(schema, schemas)
    shared = body_refs & declared_refs
    if shared:
        raise ValueError(f"request schemas shared with the forwarded protocols, which take NUL: {sorted(shared)}")
    for ref in body_refs:
        _strings_nul_free(schemas[ref[len(REF) :]])


def _strings_nul_free(schema: Any) -> None:
    """`NUL_FREE` on every plain string of a schema (those without a pattern, format, enum or
    const), `NulFreeJson` for its free-form values and `NUL_FREE` on its object keys, nested
    ones included; references are left to the caller."""
    if isinstance(schema, list):
        for item in schema:
            _strings_nul_free(item)
        return
    if not isinstance(schema, dict):
        return
    if schema.get("type") == "string" and not {"pattern", "format", "enum", "const"} & set(schema):
        schema["pattern"] = NUL_FREE
    if schema.get("type") == "object":
        schema.setdefault("propertyNames", {"pattern": NUL_FREE})
        if "patternProperties" in schema and "additionalProperties" not in schema:
            # pydantic writes a dict's key constraint as patternProperties: a key matching none is refused
            schema["additionalProperties"] = False
        elif schema.get("additionalProperties", True) is True:
            schema["additionalProperties"] = dict(_NUL_FREE_JSON_REF)
    if schema.get("type") == "array" and schema.get("items", True) is True:
        schema["items"] = dict(_NUL_FREE_JSON_REF)
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        _strings_nul_free(schema.get(key))
    for key in ("items", "additionalProperties", "not"):
        _strings_nul_free(schema.get(key))
    for value in (schema.get("properties") or {}).values():
        _strings_nul_free(value)
    for key in ("properties", "patternProperties"):
        values = schema.get(key) or {}
        for name, value in values.items():
            if _free_form(value):
                values[name] = {**value, **_NUL_FREE_JSON_REF}
    for key in ("items", "additionalProperties"):
        if _free_form(schema.get(key)):
            schema[key] = {**schema[key], **_NUL_FREE_JSON_REF}
    for key in ("anyOf", "oneOf", "prefixItems"):
        branches = schema.get(key) or []
        for index, branch in enumerate(branches):
            if _free_form(branch):
                branches[index] = {**branch, **_NUL_FREE_JSON_REF}


def _free_form(schema: Any) -> bool:
    """Whether a schema allows any JSON value (`{}`, `Any`: annotations at most)."""
    return isinstance(schema, dict) and set(schema) <= _ANNOTATIONS


def _reachable_refs(value: Any, schemas: dict[str, Any], found: set[str] | None = None) -> set[str]:
    """Every component reference reachable from a part of the document, through other components."""
    found = set() if found is None else found
    if isinstance(value, list):
        for item in value:
            _reachable_refs(item, schemas, found)
    elif isinstance(value, dict):
        ref = value.get("$ref")
        if isinstance(ref, str) and ref.startswith(REF) and ref not in found:
            found.add(ref)
            _reachable_refs(schemas.get(ref[len(REF) :]), schemas, found)
        for item in value.values():
            _reachable_refs(item, schemas, found)
    return found


def _component(spec: dict[str, Any], model: type[BaseModel]) -> dict[str, str]:
    """A reference to the model's schema, added to the document's components (with the models it
    uses), written as FastAPI writes its own (no null values: `"default": null` left out)."""
    refs, definitions = models_json_schema([(model, "serialization")], ref_template=REF + "{model}")
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in _without_nulls(definitions.get("$defs", {})).items():
        if schemas.setdefault(name, schema) != schema:
            raise ValueError(f"two different schemas are named {name} in the OpenAPI document")
    return dict(refs[(model, "serialization")])


def _event_component(spec: dict[str, Any], stream: EventStream) -> dict[str, str]:
    """A reference to the schema of one server-sent event of `stream`, added to the components.

    OpenAPI 3.1 has a `text/event-stream` schema describe each event as an object of its fields
    (`data`, `event`, `id`, `retry`; OpenAPI 3.2 calls it `itemSchema`), not the JSON its data
    holds: the data is a string whose content is JSON, said with `contentMediaType` and
    `contentSchema`, which validators that read event streams (schemathesis) check."""
    payloads = [_component(spec, payload) for payload in stream.payloads]
    data: dict[str, Any] = {
        "type": "string",
        "description": "A JSON text: " + " or ".join(f"`{payload.__name__}`" for payload in stream.payloads) + ".",
        "contentMediaType": "application/json",
        "contentSchema": payloads[0] if len(payloads) == 1 else {"anyOf": payloads},
    }
    if stream.done:
        data = {"anyOf": [{"const": "[DONE]", "description": "The stream's last event."}, data]}
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    schemas[stream.name] = {
        "title": stream.name,
        "type": "object",
        "description": "One server-sent event of the stream (its fields, as `text/event-stream` carries them).",
        "properties": {
            "data": data,
            "event": {"type": "string", "description": stream.event},
            "id": {"type": "string"},
            "retry": {"type": "integer", "minimum": 0},
        },
        "required": ["data"],
    }
    return {"$ref": REF + stream.name}


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value
