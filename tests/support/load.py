"""Background load for durability tests: concurrent chat calls, plain and streamed, that
remember the id of every call the client saw complete."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx


class LoadRunner:
    def __init__(self, base_url: str, *, concurrency: int = 8, api_key: str = "x", max_seconds: float = 120.0) -> None:
        self.base_url = base_url
        self.concurrency = concurrency
        self.api_key = api_key
        self.max_seconds = max_seconds
        self.completed: list[str] = []
        self.completed_at: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def start(self) -> LoadRunner:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def wait_for_completed(self, count: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.completed) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {len(self.completed)} calls completed, wanted {count}")
            time.sleep(0.02)

    async def _one(self, client: httpx.AsyncClient, worker: int, i: int) -> None:
        body = {"model": "fake-model", "messages": [{"role": "user", "content": f"load {worker} {i}"}]}
        if i % 3 == 0:
            body["stream"] = True
            async with client.stream("POST", "/chat/completions", json=body) as response:
                if response.status_code != 200:
                    self.failures += 1
                    return
                text = b"".join([chunk async for chunk in response.aiter_bytes()])
                if not text.rstrip().endswith(b"data: [DONE]"):
                    self.failures += 1
                    return
                call_id = response.headers["x-apprentice-call-id"]
        else:
            response = await client.post("/chat/completions", json=body)
            if response.status_code != 200 or not response.json().get("choices"):
                self.failures += 1
                return
            call_id = response.headers["x-apprentice-call-id"]
        self.completed.append(call_id)
        self.completed_at.append(time.monotonic())

    async def _worker(self, client: httpx.AsyncClient, worker: int) -> None:
        i = 0
        deadline = time.monotonic() + self.max_seconds
        while not self._stop.is_set() and time.monotonic() < deadline:
            i += 1
            try:
                await self._one(client, worker, i)
            except (httpx.HTTPError, KeyError, ValueError):
                self.failures += 1
                await asyncio.sleep(0.05)

    async def _main(self) -> None:
        async with httpx.AsyncClient(
            base_url=self.base_url, timeout=10.0, headers={"Authorization": f"Bearer {self.api_key}"}
        ) as client:
            await asyncio.gather(*(self._worker(client, w) for w in range(self.concurrency)))
