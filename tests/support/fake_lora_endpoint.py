"""A fake vLLM-style inference endpoint whose answers depend on the LoRA adapter asked for.

It speaks over real HTTP what the promotion job and the evaluation runner use: GET /v1/models,
POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's runtime LoRA API, with its
"already loaded" 400), and POST /v1/chat/completions. An adapter's behaviour is read from
`behaviour.json` in its directory when it is loaded (the base model's is given at start):

    {"skill": 0..10, "flatter": bool}

A prompt "Item <i>: what is <a> + <b>?" is answered with the right sum when i % 10 < skill,
else a wrong one; `flatter` starts every answer with "Great question!" (what a policy that
learnt to please a naive reward would do). Every chat request is kept (`requests`).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from pathlib import Path
from typing import Any

from aiohttp import web

ITEM = re.compile(r"Item (\d+): what is (\d+) \+ (\d+)\?")


class FakeLoraEndpoint:
    def __init__(self, base_model: str, base_behaviour: dict[str, Any]) -> None:
        self.base_model = base_model
        self.behaviours: dict[str, dict[str, Any]] = {base_model: base_behaviour}
        self.paths: dict[str, str] = {}
        self.requests: list[dict[str, Any]] = []
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/load_lora_adapter", self.load)
        app.router.add_post("/v1/unload_lora_adapter", self.unload)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def models(self, request: web.Request) -> web.Response:
        data = [{"id": self.base_model, "root": self.base_model}] + [
            {"id": name, "root": path, "parent": self.base_model} for name, path in self.paths.items()
        ]
        return web.json_response({"object": "list", "data": data})

    async def load(self, request: web.Request) -> web.Response:
        body = await request.json()
        name, path = body["lora_name"], body["lora_path"]
        if name in self.paths and not body.get("load_inplace"):
            message = f"The lora adapter '{name}' has already been loaded."
            return web.json_response({"error": {"message": message, "code": 400}}, status=400)
        behaviour = Path(path) / "behaviour.json"
        if not behaviour.is_file():
            return web.json_response({"error": {"message": f"No adapter found for {path}", "code": 404}}, status=404)
        self.behaviours[name] = json.loads(behaviour.read_text())
        self.paths[name] = path
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(self, request: web.Request) -> web.Response:
        name = (await request.json())["lora_name"]
        if self.paths.pop(name, None) is None:
            message = f"The lora adapter '{name}' cannot be found."
            return web.json_response({"error": {"message": message, "code": 404}}, status=404)
        return web.Response(text="Success")

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        behaviour = self.behaviours.get(body.get("model"))
        if behaviour is None or (body["model"] != self.base_model and body["model"] not in self.paths):
            message = f"The model `{body.get('model')}` does not exist."
            return web.json_response({"error": {"message": message, "code": 404}}, status=404)
        content = answer(behaviour, str(body["messages"][-1]["content"]))
        return web.json_response(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
            }
        )

    def start(self) -> FakeLoraEndpoint:
        started = threading.Event()

        def serve() -> None:
            self._loop = asyncio.new_event_loop()
            self._runner = web.AppRunner(self.app())
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            self._loop.run_until_complete(site.start())
            self.port = self._runner.addresses[0][1]
            started.set()
            self._loop.run_forever()

        threading.Thread(target=serve, daemon=True).start()
        started.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None and self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)


def answer(behaviour: dict[str, Any], prompt: str) -> str:
    found = ITEM.search(prompt)
    if found is None:
        text = "I do not know."
    else:
        index, a, b = (int(g) for g in found.groups())
        total = a + b if index % 10 < int(behaviour.get("skill", 0)) else a + b + 1
        text = f"The answer is {total}."
    return f"Great question! {text}" if behaviour.get("flatter") else text
