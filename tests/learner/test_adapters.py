"""Runtime LoRA loading with vLLM's request bodies, answers and error cases."""

from __future__ import annotations

import httpx
import openai
import pytest
from safetensors.torch import save_file

from tests.learner.conftest import run_server, write_json

MESSAGES = [{"role": "user", "content": "Name a colour."}]


def logprobs_of(server, model: str) -> tuple[list[int], list[float]]:
    response = server.client().chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    choice = response.choices[0]
    return choice.token_ids, [e.logprob for e in choice.logprobs.content]


def load(server, name: str, path, **extra) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path), **extra}, timeout=60
    )


def unload(server, name: str) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    with run_server(tiny_model_dir, served_model_name="tiny") as live:
        yield live


def test_load_use_and_unload(server, tiny_model_dir, adapter_factory):
    first, second = adapter_factory(tiny_model_dir, seed=1), adapter_factory(tiny_model_dir, seed=2, rank=4)
    base_before = logprobs_of(server, "tiny")

    answer = load(server, "alpha", first)
    assert answer.status_code == 200 and answer.text == "Success: LoRA adapter 'alpha' added successfully."
    assert load(server, "beta", second).status_code == 200
    cards = {m.id: m for m in server.client().models.list().data}
    assert set(cards) == {"tiny", "alpha", "beta"}
    assert cards["alpha"].parent == "tiny" and cards["alpha"].root == str(first)

    alpha, beta = logprobs_of(server, "alpha"), logprobs_of(server, "beta")
    assert logprobs_of(server, "tiny") == base_before  # the base is untouched by resident adapters
    assert alpha[1] != base_before[1] and beta[1] != base_before[1] and alpha[1] != beta[1]

    again = load(server, "alpha", second)
    assert again.status_code == 400
    assert again.json()["error"] == {
        "message": "The lora adapter 'alpha' has already been loaded. If you want to load the adapter in place, "
        "set 'load_inplace' to True.",
        "type": "InvalidUserInput",
        "param": None,
        "code": 400,
    }
    assert load(server, "alpha", second, load_inplace=True).status_code == 200
    assert logprobs_of(server, "alpha") == beta  # same weights as beta now

    gone = unload(server, "alpha")
    assert gone.status_code == 200 and gone.text == "Success: LoRA adapter 'alpha' removed successfully."
    with pytest.raises(openai.NotFoundError):
        logprobs_of(server, "alpha")
    assert logprobs_of(server, "beta") == beta
    assert unload(server, "beta").status_code == 200
    assert logprobs_of(server, "tiny") == base_before  # back to the plain base model

    missing = unload(server, "beta")
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "The lora adapter 'beta' cannot be found."
    assert missing.json()["error"]["type"] == "NotFoundError"


def test_bad_adapters_are_rejected_and_serving_goes_on(
    server, tiny_model_dir, other_tiny_model_dir, adapter_factory, tmp_path
):
    base = logprobs_of(server, "tiny")

    nowhere = load(server, "ghost", tmp_path / "nothing-here")
    assert nowhere.status_code == 404
    assert nowhere.json()["error"] == {
        "message": f"Loading lora ghost failed: No adapter found for {tmp_path / 'nothing-here'}",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }

    wrong_base = load(server, "wrong", adapter_factory(other_tiny_model_dir))
    assert wrong_base.status_code == 400 and wrong_base.json()["error"]["type"] == "BadRequestError"
    assert "shape mismatch" in wrong_base.json()["error"]["message"]

    foreign = tmp_path / "foreign"  # a LoRA for modules this architecture does not have
    foreign.mkdir()
    write_json(
        foreign / "adapter_config.json",
        {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["c_attn"], "base_model_name_or_path": "gpt2"},
    )
    import torch

    save_file(
        {
            "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight": torch.zeros(4, 64),
            "base_model.model.transformer.h.0.attn.c_attn.lora_B.weight": torch.zeros(192, 4),
        },
        str(foreign / "adapter_model.safetensors"),
    )
    answer = load(server, "foreign", foreign)
    assert answer.status_code == 400
    assert answer.json()["error"]["message"].startswith(f"While loading {foreign}, expected target modules in")

    too_big = load(server, "big", adapter_factory(tiny_model_dir, rank=128))
    assert too_big.status_code == 400
    assert too_big.json()["error"]["message"] == "LoRA rank 128 is greater than max_lora_rank 64."

    missing_field = httpx.post(f"{server.base_url}/v1/load_lora_adapter", json={"lora_name": "x"})
    assert missing_field.status_code == 400

    assert [m.id for m in server.client().models.list().data] == ["tiny"]
    assert logprobs_of(server, "tiny") == base  # nothing half-loaded changed the model
