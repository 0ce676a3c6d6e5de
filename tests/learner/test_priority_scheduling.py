"""The local inference server schedules by vLLM's `priority` field (lower first, 0 by default):
a less urgent request starts only while no more urgent one waits or runs, and is abandoned (503)
when one arrives. The gateway's exploration samples (gateway/exploration) rely on it: they use
idle capacity only, so no client request waits for them.

Real HTTP through the official openai client, on the tiny random model (hundreds of tokens a second).
"""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

MESSAGES = [{"role": "user", "content": "Say something about the sea."}]
LOW = {"priority": 10, "ignore_eos": True}


async def _wait_running(engine, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while engine.num_running == 0:
        assert time.monotonic() < deadline, "the request never started"
        await asyncio.sleep(0.005)


def test_a_client_request_arriving_abandons_low_priority_work(tiny_server):
    engine = tiny_server.state.engine
    client = tiny_server.async_client()

    async def scenario() -> None:
        abandoned_before = engine.stats.abandoned
        low = asyncio.create_task(
            client.chat.completions.create(
                model="tiny", messages=MESSAGES, max_tokens=1800, temperature=1.0, n=2, extra_body=LOW
            )
        )
        await _wait_running(engine)
        answer = await client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8)
        assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == 8
        with pytest.raises(openai.APIStatusError) as failure:
            await low
        assert failure.value.status_code == 503 and "abandoned" in failure.value.message
        assert engine.stats.abandoned == abandoned_before + 1

    asyncio.run(scenario())


def test_low_priority_work_waits_while_a_client_request_runs(tiny_server):
    engine = tiny_server.state.engine
    client = tiny_server.async_client()
    done: dict[str, float] = {}

    async def timed(name: str, **kwargs) -> object:
        answer = await client.chat.completions.create(model="tiny", messages=MESSAGES, **kwargs)
        done[name] = time.monotonic()
        return answer

    async def scenario() -> None:
        served = asyncio.create_task(timed("client", max_tokens=300, extra_body={"ignore_eos": True}))
        await _wait_running(engine)
        low = asyncio.create_task(timed("low", max_tokens=4, extra_body=LOW))
        await asyncio.sleep(0.2)
        assert not low.done(), "the low-priority request did not start while the client's ran"
        assert engine.num_running == 1
        client_answer, low_answer = await asyncio.gather(served, low)
        assert low_answer.usage.completion_tokens == 4 and client_answer.usage.completion_tokens == 300
        assert done["low"] >= done["client"]

    asyncio.run(scenario())


def test_priority_zero_keeps_first_come_first_served(tiny_server):
    answer = tiny_server.client().chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=4, extra_body={"priority": 0}
    )
    assert answer.usage.completion_tokens == 4
