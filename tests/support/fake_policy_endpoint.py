"""An inference endpoint whose adapters are known to be better or worse: the canary's A/B, end to end.

It speaks what the promotion job and the gateway need of a vLLM endpoint: chat completions,
`GET /v1/models` (the base and every loaded adapter), `POST /v1/load_lora_adapter` and
`/v1/unload_lora_adapter`. Each answer is "correct" or "wrong", drawn with probability
`base_rates[prompt] + effects[model]` (clipped to [0, 1]): prompts of unequal difficulty, and
versions whose effect on every prompt is set beforehand. It runs in a thread of the test process.

With `distinct_answers` each answer also carries a number of its own ("correct #17"), as sampled
text does: two runs of one prompt then differ after their first answer, and a run's next call can
be told apart from another's by its content alone.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

from aiohttp import web

from apprentice.processes import free_port


class FakePolicyEndpoint:
    def __init__(
        self,
        base_model: str,
        base_rates: dict[str, float],
        effects: dict[str, float],
        seed: int = 0,
        *,
        distinct_answers: bool = False,
    ) -> None:
        self.base_model = base_model
        self.distinct_answers = distinct_answers
        self.base_rates = base_rates
        self.effects = effects
        self.loaded: set[str] = set()
        self.served: dict[str, int] = {}
        self.rng = random.Random(seed)
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> FakePolicyEndpoint:
        self._thread.start()
        if not self._started.wait(30):
            raise RuntimeError("the fake policy endpoint did not start")
        return self

    def __exit__(self, *_: Any) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/load_lora_adapter", self._load)
        app.router.add_post("/v1/unload_lora_adapter", self._unload)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._started.set()
        self._loop.run_forever()

    async def _models(self, request: web.Request) -> web.Response:
        data = [{"id": self.base_model, "object": "model", "root": None}] + [
            {"id": name, "object": "model", "root": f"/adapters/{name}"} for name in sorted(self.loaded)
        ]
        return web.json_response({"object": "list", "data": data})

    async def _load(self, request: web.Request) -> web.Response:
        self.loaded.add((await request.json())["lora_name"])
        return web.Response(text="Success: LoRA adapter loaded.")

    async def _unload(self, request: web.Request) -> web.Response:
        self.loaded.discard((await request.json())["lora_name"])
        return web.Response(text="Success: LoRA adapter unloaded.")

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        model = body["model"]
        if model != self.base_model and model not in self.loaded:
            return web.json_response({"error": {"message": f"The model `{model}` does not exist."}}, status=404)
        self.served[model] = self.served.get(model, 0) + 1
        prompt = body["messages"][0]["content"]
        p = min(1.0, max(0.0, self.base_rates.get(prompt, 0.5) + self.effects.get(model, 0.0)))
        content = "correct" if self.rng.random() < p else "wrong"
        if self.distinct_answers:
            content += f" #{sum(self.served.values())}"
        return web.json_response(
            {
                "id": f"chatcmpl-{self.rng.getrandbits(64):x}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
            }
        )
