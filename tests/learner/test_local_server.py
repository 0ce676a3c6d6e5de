"""The local inference server through the official `openai` client, on the tiny random model."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
import torch

MESSAGES = [{"role": "user", "content": "Say something about the sea."}]


def chat(server, **kwargs):
    kwargs.setdefault("model", "tiny")
    kwargs.setdefault("messages", MESSAGES)
    kwargs.setdefault("max_tokens", 8)
    return server.client().chat.completions.create(**kwargs)


def test_models_lists_the_base(tiny_server, tiny_model_dir):
    models = tiny_server.client().models.list().data
    assert [m.id for m in models] == ["tiny"]
    assert models[0].root == str(tiny_model_dir) and models[0].max_model_len == 2048


def test_plain_completion_with_token_ids(tiny_server, tiny_model_dir):
    from transformers import AutoTokenizer

    response = chat(tiny_server, temperature=0, extra_body={"return_token_ids": True})
    choice = response.choices[0]
    assert response.object == "chat.completion" and response.model == "tiny"
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason == "length" and len(choice.token_ids) == 8
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rendered = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert response.prompt_token_ids == tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert choice.message.content == tokenizer.decode(choice.token_ids, skip_special_tokens=True)
    assert response.usage.prompt_tokens == len(response.prompt_token_ids)
    assert response.usage.completion_tokens == 8
    # without the flag, no ids (vLLM answers null)
    plain = chat(tiny_server, temperature=0)
    assert plain.prompt_token_ids is None and plain.choices[0].token_ids is None
    assert plain.choices[0].message.content == choice.message.content  # greedy is deterministic


def test_stream_sends_the_same_tokens(tiny_server):
    whole = chat(tiny_server, temperature=0, max_tokens=10, extra_body={"return_token_ids": True})
    stream = chat(
        tiny_server,
        temperature=0,
        max_tokens=10,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].prompt_token_ids == whole.prompt_token_ids
    content = [c for c in chunks if c.choices and c.choices[0].token_ids]
    assert len(content) == 10  # one chunk per generated token, sent as it is generated
    assert [t for c in content for t in c.choices[0].token_ids] == whole.choices[0].token_ids
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert content[-1].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10


def test_logprobs_match_a_forward_pass(tiny_server, tiny_model_dir):
    """The reported logprob of each sampled token is log_softmax(logits / T) of the same model."""
    from transformers import AutoModelForCausalLM

    temperature = 0.7
    response = chat(
        tiny_server,
        temperature=temperature,
        top_p=0.95,
        max_tokens=12,
        seed=3,
        logprobs=True,
        top_logprobs=3,
        extra_body={"return_token_ids": True},
    )
    choice = response.choices[0]
    entries = choice.logprobs.content
    assert len(entries) == len(choice.token_ids) == 12
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ids = torch.tensor([response.prompt_token_ids + choice.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(response.prompt_token_ids) - 1 : -1]
    expected = torch.log_softmax(logits / temperature, dim=-1)
    sampled = expected.gather(1, torch.tensor(choice.token_ids).unsqueeze(-1)).squeeze(-1)
    reported = torch.tensor([e.logprob for e in entries])
    assert torch.allclose(reported, sampled, atol=1e-4), (reported - sampled).abs().max()
    for row, entry in enumerate(entries):
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob == pytest.approx(expected[row].max().item(), abs=1e-4)
        assert entry.logprob <= entry.top_logprobs[0].logprob + 1e-6
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token


def test_n_and_seed(tiny_server):
    first = chat(tiny_server, temperature=1.0, n=2, seed=11, extra_body={"return_token_ids": True})
    again = chat(tiny_server, temperature=1.0, n=2, seed=11, extra_body={"return_token_ids": True})
    other = chat(tiny_server, temperature=1.0, n=2, seed=12, extra_body={"return_token_ids": True})
    assert [c.index for c in first.choices] == [0, 1]
    ids = [c.token_ids for c in first.choices]
    assert ids[0] != ids[1]
    assert ids == [c.token_ids for c in again.choices]
    assert ids != [c.token_ids for c in other.choices]
    assert first.usage.completion_tokens == 16


def test_choices_of_one_prompt_share_one_prefill_row_and_decode_as_their_own(tiny_server, tiny_model_dir):
    """n choices (and runs of one prompt admitted together) prefill the prompt once; each choice's
    copied cache row then decodes exactly what the model gives its own tokens."""
    from transformers import AutoModelForCausalLM

    stats = tiny_server.state.engine.stats
    rows_before, prefills_before = stats.prefill_rows, stats.prefills
    response = chat(tiny_server, temperature=1.0, n=3, seed=5, logprobs=True, extra_body={"return_token_ids": True})
    assert stats.prefills - prefills_before == 1 and stats.prefill_rows - rows_before == 1
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    assert len({tuple(c.token_ids) for c in response.choices}) == 3
    for choice in response.choices:
        ids = torch.tensor([response.prompt_token_ids + choice.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(response.prompt_token_ids) - 1 : -1]
        expected = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(choice.token_ids).unsqueeze(-1)).squeeze(-1)
        reported = torch.tensor([e.logprob for e in choice.logprobs.content])
        assert torch.allclose(reported, expected, atol=1e-4), (reported - expected).abs().max()


def test_stop_string_cuts_the_text(tiny_server):
    greedy = chat(tiny_server, temperature=0, max_tokens=12).choices[0].message.content
    stop = greedy[len(greedy) // 2 : len(greedy) // 2 + 3]
    response = chat(tiny_server, temperature=0, max_tokens=12, stop=[stop])
    choice = response.choices[0]
    assert choice.finish_reason == "stop" and choice.stop_reason == stop
    assert choice.message.content == greedy[: greedy.index(stop)]


def test_tools_go_through_the_chat_template(tiny_server):
    template = (
        "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }}{% endfor %}</tools>{% endif %}"
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"
    )
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    with_tools = chat(
        tiny_server,
        temperature=0,
        max_tokens=1,
        tools=tools,
        extra_body={"return_token_ids": True, "chat_template": template},
    )
    without = chat(
        tiny_server, temperature=0, max_tokens=1, extra_body={"return_token_ids": True, "chat_template": template}
    )
    grown = len(with_tools.prompt_token_ids) - len(without.prompt_token_ids)
    assert grown > 3 and with_tools.prompt_token_ids[-len(without.prompt_token_ids) :] == without.prompt_token_ids


def test_errors_look_like_vllm(tiny_server):
    with pytest.raises(openai.NotFoundError) as missing:
        chat(tiny_server, model="no-such-model")
    assert missing.value.body["message"] == "The model `no-such-model` does not exist."
    with pytest.raises(openai.BadRequestError) as bad:
        chat(tiny_server, temperature=-1)
    assert bad.value.status_code == 400 and "temperature" in bad.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        chat(tiny_server, top_logprobs=2)  # top_logprobs needs logprobs, as in vLLM
    with pytest.raises(openai.BadRequestError) as too_long:
        chat(tiny_server, max_tokens=5000)
    assert "maximum context length is 2048" in too_long.value.body["message"]


async def test_concurrent_requests_are_batched_and_do_not_block(tiny_server):
    client = tiny_server.async_client()
    stats = tiny_server.state.engine.stats
    before_steps, before_tokens = stats.steps, stats.tokens
    stats.max_batch_size = 0

    async def one(seed: int):
        return await client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=24,
            temperature=1.0,
            seed=seed,
            extra_body={"return_token_ids": True},
        )

    solo = await one(5)
    tasks = [asyncio.create_task(one(seed)) for seed in range(8)]
    await asyncio.sleep(0.05)
    async with httpx.AsyncClient() as http:  # the server answers while it generates
        started = time.monotonic()
        models = await http.get(f"{tiny_server.base_url}/v1/models")
        assert models.status_code == 200 and time.monotonic() - started < 2.0
    results = await asyncio.gather(*tasks)
    assert all(len(r.choices[0].token_ids) == 24 for r in results)
    assert stats.max_batch_size >= 4  # decoded together, not one after another
    assert stats.steps - before_steps < (stats.tokens - before_tokens) / 2
    # a seeded request samples the same tokens whether alone or in a batch
    assert results[5].choices[0].token_ids == solo.choices[0].token_ids
    await client.close()


def test_a_client_that_goes_away_frees_its_seat(tiny_server):
    engine = tiny_server.state.engine
    before = engine.stats.tokens
    stream = chat(tiny_server, max_tokens=1500, temperature=1.0, stream=True)
    for number, _ in enumerate(stream):
        if number == 3:
            break
    stream.close()
    deadline = time.monotonic() + 10
    while engine.num_running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.num_running == 0
    assert engine.stats.tokens - before < 1000  # stopped early, not decoded to max_tokens
    assert chat(tiny_server, temperature=0).choices[0].finish_reason == "length"
