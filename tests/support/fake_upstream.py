"""A fake OpenAI-compatible upstream for tests and benchmarks.

It stands in for a paid API or a GPU server. Its answers are deterministic and controlled by
the request, so tests can check that the gateway forwards and records them faithfully:

- `model` "fail-<status>" answers that status with an OpenAI error body;
  "slow-<ms>" waits that long before answering.
- `tools` (unless `tool_choice` is "none") makes the answer a call of the first tool.
- `n`, `logprobs`/`top_logprobs`, `stream` with `stream_options.include_usage`, and vLLM's
  `return_token_ids` are honoured.
- Header `X-Fake-Chunks` sets how many content chunks a stream has (default 20). The body
  field `fake_stream` (passed through by the gateway like any unknown field) shapes a
  stream further: `chunks`, `line_ending: "crlf"` (as sse-starlette writes), `chunk_delay_ms`
  between writes, and `split_done_ms`: the final `data: [DONE]` written in two parts that
  far apart.
- `model` "judge-..." answers as an LLM judge would (tests/support/fake_judge.py).
- `model` "teacher-..." answers by a hidden rule, as a hosted teacher would (tests/support/fake_teacher.py).
- `model` "agent-..." is a scripted tool-using model: each offered tool once per user turn, then
  text quoting the results (tests/support/fake_agent.py); whole or streamed.
- `/v1/responses` and `/v1/messages` answer natively (tests/support/fake_native.py).
- Under `/chat-only/v1` only chat completions and models are served, as by a server that speaks
  no Responses or Messages (`FakeUpstreamProcess.chat_only_api_base`).
- `GET /_requests` returns the bodies received (newest last); `DELETE /_requests` clears them.

What the gateway forwards unread, a fuzzer's bodies included, the fake refuses as OpenAI would
when it cannot read it (a 400 in OpenAI's format: `_out_of_range`, `_malformed`), never with a
crash: a 500 from the fake would read as the gateway's own server error.

Run it alone with `python -m tests.support.fake_upstream --port 9100`.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import jsonschema
import orjson
from aiohttp import web

from gateway.endpoints.chat_completions.protocol import SEED_BOUND
from gateway.endpoints.embeddings.protocol import EmbeddingsRequest
from tests.support.fake_agent import agent_message
from tests.support.fake_judge import judge_content
from tests.support.fake_native import FakeNative
from tests.support.fake_teacher import teacher_completion

EMBEDDINGS_REQUEST = jsonschema.Draft202012Validator(EmbeddingsRequest.model_json_schema())
DEFAULT_CHUNKS = 20
CHAT_ONLY_PREFIX = "/chat-only"
ANSWER_WORDS = 20


def _error(status: int, message: str, err_type: str = "invalid_request_error") -> web.Response:
    body = {"error": {"message": message, "type": err_type, "param": None, "code": None}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


# OpenAI's bounds on the fields that size an answer (n, top_logprobs) or a stream (fake_stream).
_BOUNDS = {"n": (1, 128), "top_logprobs": (0, 20)}
_STREAM_BOUNDS = {"chunks": (0, 10_000), "chunk_delay_ms": (0, 10_000), "split_done_ms": (0, 10_000)}


def _out_of_range(body: dict[str, Any]) -> str | None:
    """Why a request's sizing fields are refused, or None."""
    shape = body.get("fake_stream")
    checks = [(body, _BOUNDS, "")]
    if shape is not None:
        if not isinstance(shape, dict):
            return "fake_stream must be an object"
        checks.append((shape, _STREAM_BOUNDS, "fake_stream."))
    for fields, bounds, prefix in checks:
        for name, (low, high) in bounds.items():
            value = fields.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
                return f"{prefix}{name} must be a number from {low} to {high}"
    return None


def _malformed(body: dict[str, Any]) -> str | None:
    """Why a chat request's fields that the fake reads are not of the type OpenAI requires (and
    the gateway's document declares), or None: each a 400 there, a crash here if read as they are."""
    seed = body.get("seed")
    # An integer as JSON Schema reads one (12409.0 is one) within the bounds the document declares
    # (protocol.SEED_BOUND says which, and why they are compared in doubles).
    integral = isinstance(seed, int) or (isinstance(seed, float) and seed.is_integer())
    within = integral and -float(SEED_BOUND) <= float(seed) <= float(SEED_BOUND)
    if seed is not None and (isinstance(seed, bool) or not within):
        return f"seed must be an integer from {-SEED_BOUND} to {SEED_BOUND}"
    if body.get("stream_options") is not None and not isinstance(body["stream_options"], dict):
        return "stream_options must be an object"
    for position, message in enumerate(body["messages"]):
        if not isinstance(message, dict):
            return f"messages[{position}] must be an object"
        content = message.get("content")
        for index, part in enumerate(content if isinstance(content, list) else []):
            if not isinstance(part, dict) or not isinstance(part.get("text", ""), str):
                return f"messages[{position}].content[{index}] must be an object whose text is a string"
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        return "tools must be an array"
    for index, tool in enumerate(tools or []):
        function = tool.get("function", {"name": ""}) if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return f"tools[{index}] must be an object whose function has a string name"
    return None


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") in ("user", "tool"):
            content = message.get("content")
            if isinstance(content, list):
                return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


def _answer_words(body: dict[str, Any], choice_index: int) -> list[str]:
    seed = body.get("seed")
    prefix = _last_user_text(body.get("messages", []))[:40].split()
    words = [f"w{(i + choice_index + (seed or 0)) % 97}" for i in range(ANSWER_WORDS - len(prefix))]
    return prefix + words


def _token_logprobs(tokens: list[str], top: int) -> dict[str, Any]:
    content = []
    for i, token in enumerate(tokens):
        entry: dict[str, Any] = {"token": token, "logprob": -0.1 * (i % 5), "bytes": list(token.encode())}
        entry["top_logprobs"] = [
            {"token": token if k == 0 else f"alt{k}", "logprob": -0.1 * (i % 5) - k, "bytes": None} for k in range(top)
        ]
        content.append(entry)
    return {"content": content, "refusal": None}


def _tool_call(body: dict[str, Any], choice_index: int) -> dict[str, Any]:
    tool = body["tools"][0]
    name = tool.get("function", {}).get("name", "tool")
    return {
        "id": f"call_{choice_index}_{abs(hash(name)) % 10_000}",
        "type": "function",
        "function": {"name": name, "arguments": orjson.dumps({"query": "weather", "n": choice_index}).decode()},
    }


def _wants_tool(body: dict[str, Any]) -> bool:
    return bool(body.get("tools")) and body.get("tool_choice") != "none"


class FakeUpstream:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.counter = 0
        self.native = FakeNative()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        self.native.routes(app)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_get("/v1/models", self.models)
        # A server that speaks chat completions only (an older vLLM, llama.cpp, Ollama): under
        # /chat-only/v1 there is no /responses nor /messages, which answer 404 as such servers do.
        app.router.add_post(CHAT_ONLY_PREFIX + "/v1/chat/completions", self.chat)
        app.router.add_get(CHAT_ONLY_PREFIX + "/v1/models", self.models)
        app.router.add_get("/_requests", self.list_requests)
        app.router.add_delete("/_requests", self.clear_requests)
        return app

    async def list_requests(self, request: web.Request) -> web.Response:
        return web.Response(
            body=orjson.dumps({"requests": self.requests, "headers": self.headers}), content_type="application/json"
        )

    async def clear_requests(self, request: web.Request) -> web.Response:
        self.requests.clear()
        self.headers.clear()
        return web.Response(status=204)

    async def models(self, request: web.Request) -> web.Response:
        data = [{"id": "fake-model", "object": "model", "created": 0, "owned_by": "fake"}]
        return web.Response(body=orjson.dumps({"object": "list", "data": data}), content_type="application/json")

    async def embeddings(self, request: web.Request) -> web.Response:
        # Refused as OpenAI refuses it: a body its schema does not allow is a 400 (the gateway
        # forwards embeddings unread, so what a client may send is the upstream's to judge).
        try:
            body = orjson.loads(await request.read())
            EMBEDDINGS_REQUEST.validate(body)
        except (orjson.JSONDecodeError, jsonschema.ValidationError) as exc:
            return _error(400, f"invalid embeddings request: {str(exc).splitlines()[0]}")
        inputs = body.get("input")
        inputs = inputs if isinstance(inputs, list) else [inputs]
        data = [{"object": "embedding", "index": i, "embedding": [0.1 * (i + 1), 0.2, 0.3]} for i in range(len(inputs))]
        answer = {
            "object": "list",
            "data": data,
            "model": body.get("model"),
            "usage": {"prompt_tokens": len(inputs), "total_tokens": len(inputs)},
        }
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return _error(400, "fake upstream: body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "fake upstream: body is not a JSON object")
        if len(self.requests) > 10_000:
            del self.requests[:5_000], self.headers[:5_000]
        self.requests.append(body)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        model = str(body.get("model", ""))
        if model.startswith("fail-") and model[5:].isdigit() and 400 <= int(model[5:]) <= 599:
            status = int(model[5:])
            return _error(
                status, f"fake upstream failure {status}", "server_error" if status >= 500 else "invalid_request_error"
            )
        if model.startswith("slow-") and model[5:].isdigit():
            await asyncio.sleep(min(int(model[5:]), 60_000) / 1000)
        if not isinstance(body.get("messages"), list):
            return _error(400, "messages must be a list")
        refused = _malformed(body) or _out_of_range(body)
        if refused:  # as OpenAI refuses them: what a fuzzer sends must not take the fake down
            return _error(400, refused)
        self.counter += 1
        completion_id = f"chatcmpl-fake{self.counter:08d}"
        if model.startswith("judge-"):
            return web.Response(body=orjson.dumps(self._judge(body, completion_id)), content_type="application/json")
        if model.startswith("teacher-"):
            answer = teacher_completion(body, completion_id)
            return web.Response(body=orjson.dumps(answer), content_type="application/json")
        if model.startswith("agent-"):
            return await self._agent(request, body, completion_id)
        if body.get("stream"):
            return await self._stream(request, body, completion_id)
        return web.Response(body=orjson.dumps(self._complete(body, completion_id)), content_type="application/json")

    async def _agent(self, request: web.Request, body: dict[str, Any], completion_id: str) -> web.StreamResponse:
        message = agent_message(body, self.counter)
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        answered = len(str(message.get("content") or message.get("tool_calls")).split())
        prompt = sum(len(str(m.get("content") or "").split()) + 3 for m in body["messages"])
        usage = {"prompt_tokens": prompt, "completion_tokens": answered, "total_tokens": prompt + answered}
        base = {"id": completion_id, "created": int(time.time()), "model": body.get("model")}
        if not body.get("stream"):
            choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
            answer = {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
            return web.Response(body=orjson.dumps(answer), content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": 0, **call} for call in message["tool_calls"]]
        chunks = [
            [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}],
            [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}],
        ]
        for choices in chunks:
            chunk = {**base, "object": "chat.completion.chunk", "choices": choices}
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        if (body.get("stream_options") or {}).get("include_usage"):
            chunk = {**base, "object": "chat.completion.chunk", "choices": [], "usage": usage}
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _usage(self, body: dict[str, Any], n: int) -> dict[str, int]:
        prompt = sum(len(str(m.get("content") or "").split()) + 3 for m in body["messages"])
        return {
            "prompt_tokens": prompt,
            "completion_tokens": ANSWER_WORDS * n,
            "total_tokens": prompt + ANSWER_WORDS * n,
        }

    def _judge(self, body: dict[str, Any], completion_id: str) -> dict[str, Any]:
        content = judge_content(body)
        prompt = sum(len(str(m.get("content") or "").split()) for m in body["messages"])
        completion = len(content.split())
        return {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }

    def _complete(self, body: dict[str, Any], completion_id: str) -> dict[str, Any]:
        n = int(body.get("n") or 1)
        choices = []
        for index in range(n):
            words = _answer_words(body, index)
            message: dict[str, Any] = {"role": "assistant", "content": " ".join(words), "refusal": None}
            finish = "stop"
            if _wants_tool(body):
                message = {"role": "assistant", "content": None, "tool_calls": [_tool_call(body, index)]}
                finish = "tool_calls"
            choice: dict[str, Any] = {"index": index, "message": message, "finish_reason": finish, "logprobs": None}
            if body.get("logprobs"):
                choice["logprobs"] = _token_logprobs(words, int(body.get("top_logprobs") or 0))
            if body.get("return_token_ids"):
                choice["token_ids"] = [100 + i for i in range(len(words))]
            choices.append(choice)
        answer: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": choices,
            "usage": self._usage(body, n),
            "system_fingerprint": "fp_fake",
        }
        if body.get("return_token_ids"):
            answer["prompt_token_ids"] = list(range(1, 11))
        return answer

    async def _stream(self, request: web.Request, body: dict[str, Any], completion_id: str) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        n = int(body.get("n") or 1)
        shape = body.get("fake_stream") or {}
        chunks = max(1, int(shape.get("chunks") or request.headers.get("X-Fake-Chunks", DEFAULT_CHUNKS)))
        created = int(time.time())
        base = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": body.get("model"),
            "system_fingerprint": "fp_fake",
        }
        if (body.get("stream_options") or {}).get("include_usage"):
            base["usage"] = None
        end = b"\r\n\r\n" if shape.get("line_ending") == "crlf" else b"\n\n"
        delay_s = float(shape.get("chunk_delay_ms") or 0) / 1000
        split_done_ms = shape.get("split_done_ms")

        async def send(choices: list[dict[str, Any]], **extra: Any) -> None:
            await response.write(b"data: " + orjson.dumps({**base, "choices": choices, **extra}) + end)
            if delay_s:
                await asyncio.sleep(delay_s)

        for index in range(n):
            await send(
                [
                    {
                        "index": index,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ]
            )
        for index in range(n):
            if _wants_tool(body):
                call = _tool_call(body, index)
                arguments = call["function"]["arguments"]
                half = len(arguments) // 2
                await send(
                    [
                        {
                            "index": index,
                            "delta": {
                                "tool_calls": [
                                    {
                                        "index": 0,
                                        "id": call["id"],
                                        "type": "function",
                                        "function": {"name": call["function"]["name"], "arguments": arguments[:half]},
                                    }
                                ]
                            },
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ]
                )
                await send(
                    [
                        {
                            "index": index,
                            "delta": {"tool_calls": [{"index": 0, "function": {"arguments": arguments[half:]}}]},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ]
                )
                await send([{"index": index, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}])
                continue
            words = _answer_words(body, index)
            per_chunk = max(1, -(-len(words) // chunks))
            for start in range(0, len(words), per_chunk):
                piece = words[start : start + per_chunk]
                text = (" " if start else "") + " ".join(piece)
                choice: dict[str, Any] = {
                    "index": index,
                    "delta": {"content": text},
                    "logprobs": None,
                    "finish_reason": None,
                }
                if body.get("logprobs"):
                    choice["logprobs"] = _token_logprobs(piece, int(body.get("top_logprobs") or 0))
                if body.get("return_token_ids"):
                    choice["token_ids"] = [100 + start + i for i in range(len(piece))]
                await send([choice])
            await send([{"index": index, "delta": {}, "logprobs": None, "finish_reason": "stop"}])
        if (body.get("stream_options") or {}).get("include_usage"):
            await send([], usage=self._usage(body, n))
        if split_done_ms is not None:
            await response.write(b"data: [DO")
            await asyncio.sleep(float(split_done_ms) / 1000)
            await response.write(b"NE]" + end)
        else:
            await response.write(b"data: [DONE]" + end)
        await response.write_eof()
        return response


async def start_fake_upstream(host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, FakeUpstream, int]:
    """Start the fake upstream in the running event loop; returns the runner, the state and the port."""
    fake = FakeUpstream()
    runner = web.AppRunner(fake.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, fake, bound_port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(FakeUpstream().app(), host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
