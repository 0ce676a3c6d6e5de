"""Reading a chat completion request: just enough validation to route and record it.

Everything else the OpenAI API allows (and fields it does not know yet) is passed through
untouched; the upstream remains the judge of its own parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from apprentice import grouping
from gateway.http.errors import GatewayError

# Keys of `metadata` that belong to Apprentice and are removed before forwarding.
METADATA_TRAJECTORY = "trajectory_id"
METADATA_GROUP = "group_id"
METADATA_FAMILY = grouping.METADATA_FAMILY


@dataclass(slots=True)
class ChatRequest:
    body: dict[str, Any]
    raw: bytes  # the bytes to forward when nothing had to change
    modified: bool
    model: str
    stream: bool
    client_trajectory_id: str | None
    group_id: str | None
    # The task family the client named (X-Task-Family or metadata.task_family); None: derived.
    task_family: str | None = None

    @property
    def messages(self) -> list[Any]:
        return self.body["messages"]

    @classmethod
    def translated(
        cls,
        body: dict[str, Any],
        client_trajectory_id: str | None,
        group_id: str | None,
        task_family: str | None = None,
    ) -> ChatRequest:
        """A chat request built by the gateway from another protocol's request; the names are the
        client's, already checked (gateway/endpoints/translating.py, ClientNames.of)."""
        return cls(
            body=body,
            raw=orjson.dumps(body),
            modified=False,
            model=body["model"],
            stream=bool(body.get("stream")),
            client_trajectory_id=client_trajectory_id,
            group_id=group_id,
            task_family=task_family,
        )

    def family(self, policy: str | None) -> str:
        """The run's task family (apprentice.grouping.task_family: the one definition)."""
        return grouping.task_family(policy, self.messages, self.body.get("tools"), self.task_family)

    def forward_bytes(self, overrides: dict[str, Any]) -> bytes:
        """The body for an upstream: the client's own bytes unless something must change."""
        changed = {k: v for k, v in overrides.items() if self.body.get(k, _ABSENT) != v}
        if not self.modified and not changed:
            return self.raw
        return orjson.dumps({**self.body, **changed})


_ABSENT = object()


def optional_name(value: Any, field: str) -> str | None:
    """A name the client gives its run, group or task family (a header or metadata field): None
    when absent, else the stripped text; blank or over 256 characters is a 400 naming `field`."""
    if value is None:
        return None
    if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value).strip():
        text = str(value).strip()
        if len(text) > 256:
            raise GatewayError(400, f"{field} is longer than 256 characters", param=field)
        return text
    raise GatewayError(400, f"{field} must be a non-empty string", param=field)


def parse_model_request(raw: bytes) -> dict[str, Any]:
    """A JSON object naming a model (any OpenAI endpoint's body), or a 400 in OpenAI's error format."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise GatewayError(
            400,
            f"We could not parse the JSON body of your request ({exc}). The body must be a JSON object.",
            code="invalid_json",
        ) from None
    if not isinstance(body, dict):
        raise GatewayError(400, "The request body must be a JSON object.", code="invalid_json")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise GatewayError(
            400,
            "you must provide a model parameter (a non-empty string)",
            param="model",
            code="missing_required_parameter" if model is None else "invalid_type",
        )
    return body


def parse_chat_request(
    raw: bytes, header_trajectory: str | None, header_group: str | None, header_family: str | None = None
) -> ChatRequest:
    body = parse_model_request(raw)
    model = body["model"]
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise GatewayError(
            400,
            "messages must be a non-empty array of message objects",
            param="messages",
            code="missing_required_parameter" if messages is None else "invalid_type",
        )
    for position, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise GatewayError(
                400,
                f"messages[{position}] must be an object with a string 'role'",
                param=f"messages[{position}]",
                code="invalid_type",
            )
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise GatewayError(400, "stream must be a boolean", param="stream", code="invalid_type")

    modified = False
    trajectory = optional_name(header_trajectory, "X-Trajectory-Id")
    group = optional_name(header_group, "X-Group-Id")
    family = optional_name(header_family, grouping.FAMILY_HEADER)
    metadata = body.get("metadata")
    ours = (METADATA_TRAJECTORY, METADATA_GROUP, METADATA_FAMILY)
    if isinstance(metadata, dict) and any(name in metadata for name in ours):
        metadata = dict(metadata)
        trajectory = trajectory or optional_name(metadata.pop(METADATA_TRAJECTORY, None), "metadata.trajectory_id")
        group = group or optional_name(metadata.pop(METADATA_GROUP, None), "metadata.group_id")
        family = family or optional_name(metadata.pop(METADATA_FAMILY, None), "metadata.task_family")
        body = dict(body)
        if metadata:
            body["metadata"] = metadata
        else:
            del body["metadata"]
        modified = True
    return ChatRequest(
        body=body,
        raw=raw,
        modified=modified,
        model=model,
        stream=bool(stream),
        client_trajectory_id=trajectory,
        group_id=group,
        task_family=family,
    )
