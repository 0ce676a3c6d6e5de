"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API, recorded.

Clients that read ANTHROPIC_BASE_URL send `x-api-key` (a gateway key here; `Authorization:
Bearer` works too) and `anthropic-version`, and read errors in Anthropic's format, which every
answer of these endpoints uses. Two ways through, chosen by where the model goes:
- an upstream that speaks Messages itself (`anthropic/` deployments, or any with
  `protocols: [messages]`) gets the client's bytes as they are (gateway/endpoints/native.py),
  with the deployment's own key;
- a policy (our endpoints speak chat completions only) or any other deployment gets the call
  translated to chat completions, run through the chat pipeline (recorded with exact token
  ids: what the learner trains on) and answered as a Messages object or event stream.

count_tokens: forwarded to an upstream that speaks Messages; otherwise the endpoint's own
tokenizer when it offers vLLM's `/tokenize`, else an estimate of one token per four bytes of
the text (translate.count_tokens_text), said so in the `x-apprentice-token-count` header.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from gateway.auth.keys import KeyInfo
from gateway.endpoints.chat_completions.request import ChatRequest
from gateway.endpoints.messages.errors import MessagesError, error_body
from gateway.endpoints.messages.translate import count_tokens_text, estimate_tokens, to_chat_request
from gateway.endpoints.messages.wire import MessagesWire
from gateway.endpoints.native import NativeProtocol
from gateway.endpoints.translating import ClientNames, Refusal, TranslatingEndpoint
from gateway.http.asgi import JSON_HEADERS, Receive, Scope, Send, header, send_response
from gateway.http.errors import GatewayError
from gateway.trajectories.stitching import MessageKeys, continuation_keys, request_keys, uuid7
from gateway.upstreams.routing import RoutePlan, UpstreamTarget

PROTOCOL = "messages"
DEFAULT_VERSION = "2023-06-01"
PASSED_HEADERS = ("anthropic-version", "anthropic-beta")


async def send_messages_error(
    send: Send, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await send_response(send, status, error_body(status, message), [*JSON_HEADERS, *(headers or [])])


def with_api_key(scope: Scope) -> Scope:
    """The scope with `x-api-key` as a bearer key, so the gateway's key check reads it."""
    api_key = header(scope, b"x-api-key")
    if api_key is None or header(scope, b"authorization") is not None:
        return scope
    return {**scope, "headers": [*scope["headers"], (b"authorization", f"Bearer {api_key}".encode("latin-1"))]}


def parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise MessagesError(400, f"invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise MessagesError(400, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise MessagesError(400, "model: Field required" if model is None else "model: Input should be a valid string")
    return body


def _conversation(body: dict[str, Any]) -> list[Any]:
    """A Messages request's conversation as stitching hashes it: the system prompt, the messages."""
    given = body.get("messages")
    messages: list[Any] = given if isinstance(given, list) else []
    system = body.get("system")
    return [{"role": "system", "content": system}, *messages] if system else list(messages)


class MessagesNative(NativeProtocol):
    name = PROTOCOL
    path = "/messages"

    def headers(self, target: UpstreamTarget, client_headers: dict[str, str]) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "anthropic-version": DEFAULT_VERSION}
        headers.update({k: v for k, v in client_headers.items() if k in PASSED_HEADERS})
        if target.api_key:
            headers["x-api-key"] = target.api_key
        return headers

    def answer_from_events(self, events: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The message a stream's events add up to (content blocks joined, stop reason, usage)."""
        message: dict[str, Any] | None = None
        partial: dict[int, str] = {}
        for event in events:
            kind = event.get("type")
            if kind == "message_start" and isinstance(event.get("message"), dict):
                message = {**event["message"], "content": []}
            elif message is None:
                continue
            elif kind == "content_block_start":
                message["content"].append(dict(event.get("content_block") or {}))
            elif kind == "content_block_delta" and message["content"]:
                block, delta = message["content"][event.get("index", -1)], event.get("delta") or {}
                if delta.get("type") == "text_delta":
                    block["text"] = block.get("text", "") + delta.get("text", "")
                elif delta.get("type") == "input_json_delta":
                    index = event.get("index", -1)
                    partial[index] = partial.get(index, "") + delta.get("partial_json", "")
                elif delta.get("type") == "thinking_delta":
                    block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
            elif kind == "message_delta":
                message.update(event.get("delta") or {})
                message["usage"] = {**(message.get("usage") or {}), **(event.get("usage") or {})}
        if message is not None:
            for index, text in partial.items():
                try:
                    message["content"][index]["input"] = orjson.loads(text) if text else {}
                except (orjson.JSONDecodeError, IndexError):
                    continue
        return message

    def usage(self, answer: dict[str, Any]) -> tuple[int | None, int | None]:
        usage = answer.get("usage") or {}
        return usage.get("input_tokens"), usage.get("output_tokens")

    def keys(self, tenant: str, model: str, body: dict[str, Any]) -> MessageKeys:
        return request_keys(tenant, model, _conversation(body))

    def continuation(self, keys: MessageKeys, tenant: str, answer: dict[str, Any]) -> list[bytes]:
        return continuation_keys(keys, [{"role": "assistant", "content": answer.get("content")}])

    async def send_error(self, send: Send, error: GatewayError, headers: list[tuple[bytes, bytes]]) -> None:
        await send_messages_error(send, error.status, error.message, headers)


NATIVE = MessagesNative()


class MessagesEndpoint(TranslatingEndpoint):
    native = NATIVE
    protocol_errors = (MessagesError,)

    async def authenticate(self, scope: Scope) -> KeyInfo:
        return await self.state.authenticate(with_api_key(scope))

    def parse(self, raw: bytes) -> dict[str, Any]:
        return parse_body(raw)

    async def translate(
        self,
        key: KeyInfo,
        body: dict[str, Any],
        created_at: float,
        named: ClientNames,
    ) -> tuple[ChatRequest, MessagesWire]:
        chat_body = to_chat_request(body)
        chat_body["model"] = body["model"]
        request = ChatRequest.translated(chat_body, named.trajectory, named.group, named.family)
        return request, MessagesWire(body, message_id=f"msg_{uuid7().hex}")

    async def send_refusal(self, send: Send, error: Refusal) -> None:
        await send_messages_error(send, error.status, error.message)

    async def count_tokens(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            key, raw, body, plan = await self.accept(scope, receive)
            if self.speaks_natively(plan):
                target = plan.targets[0]
                client_headers = {k.decode().lower(): v.decode("latin-1") for k, v in scope["headers"]}
                answer = await self._post(
                    target.native_api_base + "/messages/count_tokens", raw, NATIVE.headers(target, client_headers)
                )
                await send_response(send, answer[0], answer[1], JSON_HEADERS)
                return
            to_chat_request({**body, "max_tokens": body.get("max_tokens", 1)})  # validates like /v1/messages
            count, how = await self._count(plan, body)
        except (GatewayError, MessagesError) as error:
            await send_messages_error(send, error.status, error.message)
            return
        except ConnectionResetError:
            return
        await send_response(
            send,
            200,
            orjson.dumps({"input_tokens": count}),
            [*JSON_HEADERS, (b"x-apprentice-token-count", how.encode())],
        )

    async def _count(self, plan: RoutePlan, body: dict[str, Any]) -> tuple[int, str]:
        """(tokens, "tokenizer" or "estimate"): the endpoint's tokenizer when it has vLLM's /tokenize."""
        if plan.policy is not None and plan.targets:
            target = plan.targets[0]
            chat = to_chat_request({**body, "max_tokens": body.get("max_tokens", 1)})
            root = target.api_base[: -len("/v1")] if target.api_base.endswith("/v1") else target.api_base
            payload = orjson.dumps(
                {"model": target.upstream_model, "messages": chat["messages"], "tools": chat.get("tools")}
            )
            try:
                status, answer = await self._post(root + "/tokenize", payload, target.headers())
                if status == 200:
                    return int(orjson.loads(answer)["count"]), "tokenizer"
            except (GatewayError, KeyError, ValueError, TypeError):
                pass
        return estimate_tokens(count_tokens_text(body)), "estimate"

    async def _post(self, url: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        try:
            async with self.state.http.post(
                url, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=30)
            ) as response:
                return response.status, await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise GatewayError(502, f"upstream did not answer: {type(exc).__name__}: {exc}") from exc
