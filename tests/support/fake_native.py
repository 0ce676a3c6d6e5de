"""The fake upstream's native Responses and Anthropic Messages endpoints.

Deterministic answers in each protocol's own shapes, non-streamed and streamed, so tests can
check that the gateway forwards them byte for byte and records them:
- POST /v1/responses: a `response` object with one output message ("native responses: <last
  user text>"); with tools, a function_call of the first tool instead; `previous_response_id`
  is echoed; an unknown previous id is a 400 as OpenAI answers it. Streams end with
  `response.completed`.
- POST /v1/messages: a `message` with one text block ("native messages: <last user text>"), or
  a tool_use block of the first tool; a request without `x-api-key` is a 401 in Anthropic's
  format. Streams send message_start ... message_stop.
- POST /v1/messages/count_tokens: {"input_tokens": words of the messages}.

A body the fake cannot read (not a JSON object, tools that are not objects, a text part whose
text is not a string, a previous response id that is not a string) is a 400 in the protocol's
error format, as the real APIs answer it, never a crash.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from aiohttp import web


def _last_text(items: Any) -> str:
    if isinstance(items, str):
        return items
    for item in reversed(items if isinstance(items, list) else []):
        if (
            not isinstance(item, dict)
            or item.get("role") not in (None, "user")
            or item.get("type") not in (None, "message")
        ):
            continue
        content = item.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            texts = [
                p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") in ("input_text", "text")
            ]
            if texts:
                return " ".join(texts)
    return ""


def _malformed(body: Any, conversation: str, *, named_tools: bool) -> str | None:
    """Why a body's fields that the fake reads are not of the type the real API requires, or None."""
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        return "previous_response_id must be a string"
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        return "tools must be an array"
    for index, tool in enumerate(tools or []):
        if not isinstance(tool, dict) or (named_tools and not isinstance(tool.get("name"), str)):
            return f"tools[{index}] must be an object" + (" with a string name" if named_tools else "")
    items = body.get(conversation)
    for position, item in enumerate(items if isinstance(items, list) else []):
        content = item.get("content") if isinstance(item, dict) else None
        for index, part in enumerate(content if isinstance(content, list) else []):
            if isinstance(part, dict) and not isinstance(part.get("text", ""), str):
                return f"{conversation}[{position}].content[{index}].text must be a string"
    return None


async def _read(request: web.Request) -> Any:
    """The request's JSON, or None when the body is not JSON."""
    try:
        return orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return None


def _openai_error(message: str) -> web.Response:
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    return web.Response(status=400, body=orjson.dumps({"error": error}), content_type="application/json")


def _anthropic_error(message: str) -> web.Response:
    error = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    return web.Response(status=400, body=orjson.dumps(error), content_type="application/json")


def _sse(event_type: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event_type.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class FakeNative:
    def __init__(self) -> None:
        self.responses: dict[str, dict[str, Any]] = {}
        self.counter = 0

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/responses", self.create_response)
        app.router.add_post("/v1/messages", self.create_message)
        app.router.add_post("/v1/messages/count_tokens", self.count_tokens)

    # ---- Responses ----------------------------------------------------------------------
    def _response(self, body: dict[str, Any]) -> dict[str, Any]:
        self.counter += 1
        response_id = f"resp_fake{self.counter:06d}"
        text = f"native responses: {_last_text(body.get('input'))}"
        if body.get("tools"):
            tool = body["tools"][0]
            output: list[dict[str, Any]] = [
                {
                    "type": "function_call",
                    "id": f"fc_fake{self.counter}",
                    "call_id": f"call_fake{self.counter}",
                    "name": tool.get("name", "tool"),
                    "arguments": '{"city": "Paris"}',
                    "status": "completed",
                }
            ]
        else:
            output = [
                {
                    "type": "message",
                    "id": f"msg_fake{self.counter}",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ]
        words = len(str(body.get("input")).split())
        return {
            "id": response_id,
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": body.get("model"),
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "previous_response_id": body.get("previous_response_id"),
            "usage": {
                "input_tokens": words,
                "output_tokens": len(text.split()),
                "total_tokens": words + len(text.split()),
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "metadata": body.get("metadata") or {},
            "temperature": body.get("temperature"),
            "top_p": body.get("top_p"),
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
        }

    async def create_response(self, request: web.Request) -> web.StreamResponse:
        body = await _read(request)
        refused = _malformed(body, "input", named_tools=False)
        if refused:
            return _openai_error(refused)
        previous = body.get("previous_response_id")
        if previous and previous not in self.responses:
            error = {
                "message": f"Previous response with id '{previous}' not found.",
                "type": "invalid_request_error",
                "param": "previous_response_id",
                "code": "previous_response_not_found",
            }
            return web.Response(status=400, body=orjson.dumps({"error": error}), content_type="application/json")
        response = self._response(body)
        self.responses[response["id"]] = response
        if not body.get("stream"):
            return web.Response(body=orjson.dumps(response), content_type="application/json")
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        sequence = 0

        async def send(event_type: str, **data: Any) -> None:
            nonlocal sequence
            await stream.write(_sse(event_type, {"type": event_type, "sequence_number": sequence, **data}))
            sequence += 1

        shell = {**response, "status": "in_progress", "output": [], "usage": None}
        await send("response.created", response=shell)
        item = response["output"][0]
        if item["type"] == "message":
            text = item["content"][0]["text"]
            await send(
                "response.output_item.added", output_index=0, item={**item, "content": [], "status": "in_progress"}
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            await send("response.content_part.added", item_id=item["id"], output_index=0, content_index=0, part=part)
            for word in text.split(" "):
                await send(
                    "response.output_text.delta",
                    item_id=item["id"],
                    output_index=0,
                    content_index=0,
                    delta=word + " ",
                    logprobs=[],
                )
            await send(
                "response.output_text.done", item_id=item["id"], output_index=0, content_index=0, text=text, logprobs=[]
            )
            await send(
                "response.content_part.done",
                item_id=item["id"],
                output_index=0,
                content_index=0,
                part=item["content"][0],
            )
        await send("response.output_item.done", output_index=0, item=item)
        await send("response.completed", response=response)
        await stream.write_eof()
        return stream

    # ---- Anthropic Messages --------------------------------------------------------------
    def _message(self, body: dict[str, Any]) -> dict[str, Any]:
        self.counter += 1
        if body.get("tools"):
            tool = body["tools"][0]
            content: list[dict[str, Any]] = [
                {
                    "type": "tool_use",
                    "id": f"toolu_fake{self.counter}",
                    "name": tool["name"],
                    "input": {"city": "Paris"},
                }
            ]
            stop = "tool_use"
        else:
            content = [{"type": "text", "text": f"native messages: {_last_text(body.get('messages'))}"}]
            stop = "end_turn"
        words = len(str(body.get("messages")).split())
        return {
            "id": f"msg_fake{self.counter:06d}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": words, "output_tokens": 7},
        }

    async def create_message(self, request: web.Request) -> web.StreamResponse:
        if not request.headers.get("x-api-key"):
            error = {
                "type": "error",
                "error": {"type": "authentication_error", "message": "x-api-key header is required"},
            }
            return web.Response(status=401, body=orjson.dumps(error), content_type="application/json")
        body = await _read(request)
        refused = _malformed(body, "messages", named_tools=True)
        if refused:
            return _anthropic_error(refused)
        message = self._message(body)
        if not body.get("stream"):
            return web.Response(body=orjson.dumps(message), content_type="application/json")
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        shell = {
            **message,
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": message["usage"]["input_tokens"], "output_tokens": 0},
        }
        await stream.write(_sse("message_start", {"type": "message_start", "message": shell}))
        for index, block in enumerate(message["content"]):
            if block["type"] == "text":
                await stream.write(
                    _sse(
                        "content_block_start",
                        {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
                    )
                )
                for word in block["text"].split(" "):
                    delta = {"type": "text_delta", "text": word + " "}
                    await stream.write(
                        _sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
                    )
            else:
                start = {**block, "input": {}}
                await stream.write(
                    _sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": start})
                )
                delta = {"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}
                await stream.write(
                    _sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
                )
            await stream.write(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
        await stream.write(
            _sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                    "usage": {"output_tokens": 7},
                },
            )
        )
        await stream.write(_sse("message_stop", {"type": "message_stop"}))
        await stream.write_eof()
        return stream

    async def count_tokens(self, request: web.Request) -> web.Response:
        body = await _read(request)
        refused = _malformed(body, "messages", named_tools=True)
        if refused:
            return _anthropic_error(refused)
        return web.Response(
            body=orjson.dumps({"input_tokens": len(str(body.get("messages")).split())}), content_type="application/json"
        )
