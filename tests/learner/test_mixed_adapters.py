"""Several adapters and the base model in one running batch (issue 11).

While a canary serves part of a policy's traffic, the promoted version and the candidate must
decode in the same steps rather than take turns, and sharing a batch must not change what
either of them answers: greedy tokens are the same as alone, logprobs equal within float noise.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
import torch

from tests.learner.conftest import run_server

PROMPTS = [
    [{"role": "user", "content": "Say something about the sea."}],
    [{"role": "user", "content": "Name a colour, then explain at some length why you like it so much."}],
    [{"role": "user", "content": "Hi"}],
]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def server(tiny_model_dir, adapter_factory):
    with run_server(tiny_model_dir, served_model_name="tiny") as live:
        for name, seed, rank in (("alpha", 1, 8), ("beta", 2, 4)):
            path = adapter_factory(tiny_model_dir, seed=seed, rank=rank)
            body = {"lora_name": name, "lora_path": str(path)}
            assert httpx.post(f"{live.base_url}/v1/load_lora_adapter", json=body, timeout=60).status_code == 200
        yield live


async def ask(client, model: str, prompt: int, max_tokens: int = MAX_TOKENS, **kwargs):
    kwargs.setdefault("temperature", 0)
    response = await client.chat.completions.create(
        model=model,
        messages=PROMPTS[prompt],
        max_tokens=max_tokens,
        logprobs=True,
        extra_body={"return_token_ids": True, "ignore_eos": True},
        **kwargs,
    )
    return [(c.token_ids, [e.logprob for e in c.logprobs.content]) for c in response.choices]


# (model, prompt, extra arguments): both adapters and the base, several prompt lengths, a seeded
# sampled request and one with n = 2, so that rows of one request sit next to other adapters' rows
JOBS = [
    ("alpha", 0, {}),
    ("beta", 0, {}),
    ("tiny", 0, {}),
    ("alpha", 1, {}),
    ("beta", 2, {}),
    ("tiny", 1, {}),
    ("beta", 1, {"temperature": 1.0, "seed": 7}),
    ("alpha", 2, {"temperature": 0.8, "seed": 3, "n": 2}),
]


async def test_a_mixed_batch_answers_as_each_adapter_alone(server):
    client = server.async_client()
    stats = server.state.engine.stats
    alone = [await ask(client, model, prompt, **extra) for model, prompt, extra in JOBS]
    # the adapters really differ on this prompt, so a row run with the wrong adapter would show
    assert len({tuple(alone[i][0][0]) for i in range(3)}) == 3

    steps, tokens, mixed = stats.steps, stats.tokens, stats.mixed_steps
    together = await asyncio.gather(*[ask(client, model, prompt, **extra) for model, prompt, extra in JOBS])
    await client.close()

    for job, solo, shared in zip(JOBS, alone, together, strict=True):
        assert [ids for ids, _ in shared] == [ids for ids, _ in solo], job
        for (_, solo_logprobs), (_, shared_logprobs) in zip(solo, shared, strict=True):
            assert torch.allclose(torch.tensor(shared_logprobs), torch.tensor(solo_logprobs), atol=1e-4), job
    # decoded together: far fewer steps than tokens, most of them with several adapters at once
    generated = stats.tokens - tokens
    assert generated == MAX_TOKENS * sum(extra.get("n", 1) for _, _, extra in JOBS)
    assert stats.steps - steps < generated / 3
    assert stats.mixed_steps - mixed >= MAX_TOKENS - 1


async def test_two_adapters_share_the_steps(server):
    """A canary at 50%: as many requests for each of two adapters, decoded in the same steps."""
    client = server.async_client()
    stats = server.state.engine.stats
    stats.max_batch_size = 0
    steps, mixed = stats.steps, stats.mixed_steps
    answers = await asyncio.gather(
        *[ask(client, ("alpha", "beta")[i % 2], 0, temperature=1.0, seed=i) for i in range(8)]
    )
    await client.close()
    assert all(len(ids) == MAX_TOKENS for answer in answers for ids, _ in answer)
    # one after the other would take 2 x 4 x MAX_TOKENS steps, adapter by adapter 2 x MAX_TOKENS
    assert stats.steps - steps < 2 * MAX_TOKENS
    assert stats.mixed_steps - mixed >= MAX_TOKENS - 1
    assert stats.max_batch_size >= 6


async def test_unloading_an_adapter_waits_for_its_running_requests(server, tiny_model_dir, adapter_factory):
    """Its running requests finish as they would have; the ones that come after it are refused."""
    path = adapter_factory(tiny_model_dir, seed=5)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        assert (
            await http.post("/v1/load_lora_adapter", json={"lora_name": "gamma", "lora_path": str(path)})
        ).status_code == 200
        client = server.async_client()
        long = 300  # long enough for the unload to arrive while both decode
        reference = await ask(client, "gamma", 1, max_tokens=long)
        running = [asyncio.create_task(ask(client, model, 1, max_tokens=long)) for model in ("gamma", "beta")]
        engine = server.state.engine
        deadline = asyncio.get_running_loop().time() + 30
        while engine.num_running < 2 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.002)
        assert engine.num_running == 2
        unloaded = await http.post("/v1/unload_lora_adapter", json={"lora_name": "gamma"})
        assert unloaded.status_code == 200
        gamma, beta = await asyncio.gather(*running)
        assert [ids for ids, _ in gamma] == [ids for ids, _ in reference]  # gamma to the end, unchanged
        assert len(beta[0][0]) == long
        with pytest.raises(openai.NotFoundError):
            await ask(client, "gamma", 1)
        await client.close()


async def test_an_adapter_no_running_request_uses_comes_and_goes_without_draining_the_batch(
    server, tiny_model_dir, adapter_factory
):
    """A new canary loaded, an old version unloaded, while other adapters decode: the change
    runs at the next step boundary, not after the batch drains, new requests keep joining, and
    what the running requests answer does not change."""
    path = adapter_factory(tiny_model_dir, seed=9)
    engine = server.state.engine
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        client = server.async_client()
        long = 300
        references = [await ask(client, model, 1, max_tokens=long) for model in ("alpha", "tiny")]
        running = [asyncio.create_task(ask(client, model, 1, max_tokens=long)) for model in ("alpha", "tiny")]
        deadline = asyncio.get_running_loop().time() + 30
        while engine.num_running < 2 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.002)
        assert engine.num_running == 2

        loaded = await http.post("/v1/load_lora_adapter", json={"lora_name": "delta", "lora_path": str(path)})
        assert loaded.status_code == 200
        assert engine.num_running == 2 and not any(task.done() for task in running), "loaded without a drain"
        short = await ask(client, "delta", 0, max_tokens=4)  # joins the running batch
        assert len(short[0][0]) == 4 and not any(task.done() for task in running)
        unloaded = await http.post("/v1/unload_lora_adapter", json={"lora_name": "delta"})
        assert unloaded.status_code == 200
        assert engine.num_running == 2 and not any(task.done() for task in running), "unloaded without a drain"

        answers = await asyncio.gather(*running)
        for answer, reference in zip(answers, references, strict=True):
            assert [ids for ids, _ in answer] == [ids for ids, _ in reference]
        with pytest.raises(openai.NotFoundError):
            await ask(client, "delta", 1)
        await client.close()
