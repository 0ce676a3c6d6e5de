"""A simulated inference endpoint with continuous batching and vLLM-style priority, for
bench/exploration_latency.py: decode steps take a fixed time (asyncio.sleep, like a GPU that
the CPU only waits for), so a busy shared CPU does not decide the figures.

Each step every running sequence gains a token; a request with `n` answers is n sequences.
Scheduling follows the local server's rules (learner/serving/engine.py, "Priority"): most
urgent first, a less urgent request starts only while nothing more urgent waits or runs, and a
more urgent arrival abandons the running less urgent ones (503). `busy_s` is the time with a
batch running. Answers carry `prompt_token_ids`, `token_ids` and logprobs as vLLM's do.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import orjson
from aiohttp import web


@dataclass(eq=False)
class _Request:
    priority: int
    n: int
    max_tokens: int
    arrival: float
    done: asyncio.Future[int]
    tokens: int = 0


@dataclass
class PriorityEndpoint:
    step_s: float = 0.02
    max_batch: int = 16
    busy_s: float = 0.0
    abandoned: int = 0
    waiting: list[_Request] = field(default_factory=list)
    running: list[_Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._wake = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.on_startup.append(self._start)
        return app

    async def _start(self, app: web.Application) -> None:
        app["loop_task"] = asyncio.create_task(self._loop())

    async def chat(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        item = _Request(
            int(body.get("priority") or 0),
            int(body.get("n") or 1),
            int(body.get("max_tokens") or 16),
            time.monotonic(),
            asyncio.get_running_loop().create_future(),
        )
        self.waiting.append(item)
        self._wake.set()
        try:
            tokens = await item.done
        except RuntimeError as exc:
            error = {"error": {"message": str(exc), "type": "ServiceUnavailableError", "code": 503}}
            return web.Response(status=503, body=orjson.dumps(error), content_type="application/json")
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": " ".join(f"t{j}" for j in range(tokens))},
                "finish_reason": "length",
                "token_ids": list(range(100, 100 + tokens)),
                "logprobs": {"content": [{"token": f"t{j}", "logprob": -0.5, "bytes": None} for j in range(tokens)]},
            }
            for i in range(item.n)
        ]
        answer = {
            "id": "chatcmpl-sim",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": choices,
            "usage": {"prompt_tokens": 10, "completion_tokens": tokens * item.n, "total_tokens": 10 + tokens * item.n},
            "prompt_token_ids": list(range(1, 11)),
        }
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    def _schedule(self) -> None:
        urgent = min((r.priority for r in self.waiting), default=None)
        if urgent is not None:
            for victim in [r for r in self.running if r.priority > urgent]:
                self.running.remove(victim)
                self.abandoned += 1
                victim.done.set_exception(RuntimeError(f"abandoned for a request of priority {urgent}"))
        room = self.max_batch - sum(r.n for r in self.running)
        floor = min((r.priority for r in self.running), default=None)
        for item in sorted(self.waiting, key=lambda r: (r.priority, r.arrival)):
            if item.n > room or (floor is not None and item.priority > floor):
                break
            self.waiting.remove(item)
            self.running.append(item)
            room -= item.n
            floor = item.priority if floor is None else min(floor, item.priority)

    async def _loop(self) -> None:
        while True:
            self._schedule()
            if not self.running:
                self._wake.clear()
                await self._wake.wait()
                continue
            started = time.monotonic()
            await asyncio.sleep(self.step_s)
            self.busy_s += time.monotonic() - started
            for item in list(self.running):
                item.tokens += 1
                if item.tokens >= item.max_tokens:
                    self.running.remove(item)
                    item.done.set_result(item.tokens)
