"""The trainer on a tiny model: it learns, accumulates exactly, aborts on NaN, saves what vLLM loads."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest
import torch

from apprentice.settings import LearningSettings
from learner.grpo.adapters import check_vllm_format, new_lora, save_adapter
from learner.grpo.tokens import Segment, parse_call, trajectory_segments
from learner.grpo.trainer import GRPOTrainer, NonFiniteLoss, TrainerConfig, TrainSample


@pytest.fixture
def tiny_peft(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return new_lora(model, 8, 16, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])


def trainer_config(**settings: Any) -> TrainerConfig:
    """LearningSettings' defaults (their one home) with `settings` changed, as the learner builds it."""
    return TrainerConfig.from_settings(LearningSettings(**settings))


def segment(prompt: list[int], completion: list[int], temperature: float = 1.0) -> Segment:
    return Segment(prompt + completion, [False] * len(prompt) + [True] * len(completion), None, temperature, None)


def toy_samples() -> list[TrainSample]:
    prompt = [1, 20, 30, 40]
    good, bad = [100, 101, 102, 2], [200, 201, 2]
    return [
        TrainSample("g1", 1.0, 1.0, [segment(prompt, good)]),
        TrainSample("b1", 0.0, -1.0, [segment(prompt, bad)]),
        TrainSample("g2", 1.0, 1.0, [segment(prompt, good, 0.7)]),
        TrainSample("b2", 0.0, -1.0, [segment(prompt, bad, 0.7)]),
    ]


def sequence_logprob(model, ids: list[int], start: int) -> float:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0]
    logp = torch.log_softmax(logits[:-1].float(), -1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)
    return float(logp[start - 1 :].sum())


def test_training_moves_probability_towards_the_better_answer(tiny_peft):
    samples = toy_samples()
    good, bad = samples[0].segments[0].input_ids, samples[1].segments[0].input_ids
    before = sequence_logprob(tiny_peft, good, 4) - sequence_logprob(tiny_peft, bad, 4)
    config = trainer_config(lr=1e-2, epochs=5, micro_batch_size=2, grad_accumulation=2)
    trainer = GRPOTrainer(tiny_peft, config, fresh=True)
    result = trainer.train(samples)
    after = sequence_logprob(tiny_peft, good, 4) - sequence_logprob(tiny_peft, bad, 4)
    assert after > before + 1.0
    assert result.optimizer_steps == 5 and result.samples == 4 and result.loss_tokens == 14
    assert result.behaviour_gap is None and result.tis_mean == pytest.approx(1.0)
    assert 0.0 <= result.clip_fraction <= 1.0 and result.kl > 0 and math.isfinite(result.loss)
    assert len(result.history) == 5 and result.tokens_per_s > 0


def test_micro_batches_and_gradient_accumulation_give_the_full_batch_gradient(tiny_peft):
    samples = toy_samples()
    grads = []
    for micro in (4, 1, 3):
        trainer = GRPOTrainer(tiny_peft, trainer_config(micro_batch_size=micro, aggregation="sequence"), fresh=True)
        rows = trainer.prepare(samples, {})
        tiny_peft.zero_grad(set_to_none=True)
        trainer.backward_step(samples, rows)
        grads.append(torch.cat([p.grad.flatten() for p in tiny_peft.parameters() if p.requires_grad]).clone())
    assert grads[0].abs().sum() > 0
    # equal up to fp32 summation order (batch shapes differ)
    assert torch.allclose(grads[0], grads[1], atol=2e-5) and torch.allclose(grads[0], grads[2], atol=2e-5)


def test_a_nan_loss_aborts_the_run(tiny_peft):
    samples = toy_samples()
    samples[1].advantage = float("nan")
    before = [p.detach().clone() for p in tiny_peft.parameters() if p.requires_grad]
    with pytest.raises(NonFiniteLoss):
        GRPOTrainer(tiny_peft, trainer_config(micro_batch_size=1, grad_accumulation=4), fresh=True).train(samples)
    after = [p.detach() for p in tiny_peft.parameters() if p.requires_grad]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True)), "no optimizer step was taken"


def test_saved_adapter_is_vllm_loadable_and_the_local_server_accepts_it(tiny_peft, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from learner.serving.adapters import LoraManager

    GRPOTrainer(tiny_peft, trainer_config(lr=1e-2), fresh=True).train(toy_samples())
    path = save_adapter(tiny_peft, tmp_path / "p-v1", "HuggingFaceTB/SmolLM2-135M-Instruct")
    config = check_vllm_format(path)
    assert config["r"] == 8 and not config.get("modules_to_save")
    assert config["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert sorted(p.name for p in path.iterdir()) == [
        "README.md",
        "adapter_config.json",
        "adapter_model.safetensors",
    ] or sorted(p.name for p in path.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert not list(tmp_path.glob(".tmp-*"))
    manager = LoraManager(AutoModelForCausalLM.from_pretrained(tiny_model_dir), max_lora_rank=8)
    assert manager.check("p-v1", str(path))[1] == 8
    with pytest.raises(FileExistsError):
        save_adapter(tiny_peft, path, "x")


def test_the_trainer_scores_tokens_exactly_as_the_server_sampled_them(tiny_server, tiny_peft, tiny_model_dir):
    """Recorded logprobs (processed, at the call's temperature) match the trainer's: behaviour_gap ~ 0."""
    client = tiny_server.client()
    raw = client.chat.completions.with_raw_response.create(
        model="tiny",
        messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=12,
        temperature=0.7,
        seed=3,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    answer = json.loads(raw.text)
    call = parse_call({"messages": [{"role": "user", "content": "Count to five."}]}, answer, 0.7, None)
    samples = [
        TrainSample("a", 1.0, 1.0, trajectory_segments(None, [call])),
        TrainSample("b", 0.0, -1.0, trajectory_segments(None, [call])),
    ]
    for mode in ("recompute", "recorded"):
        # lr 0 (below what LearningSettings accepts): the shared model stays the same for the second mode
        trainer = GRPOTrainer(tiny_peft, replace(trainer_config(old_logprobs=mode), lr=0.0), fresh=True)
        rows = trainer.prepare(samples, {})
        assert torch.allclose(rows[0].old, rows[0].recorded, atol=1e-3), mode
        result = trainer.train(samples)
        assert result.behaviour_gap is not None and result.behaviour_gap < 1e-3
        assert result.tis_mean == pytest.approx(1.0, abs=1e-2)


def test_behaviour_logprobs_are_recomputed_with_the_version_that_served(
    tiny_peft, tiny_model_dir, tmp_path, adapter_factory
):
    old_version = adapter_factory(tiny_model_dir, seed=5, rank=8)
    samples = toy_samples()
    for sample in samples:
        sample.segments[0].version = "v-old"
    trainer = GRPOTrainer(tiny_peft, trainer_config(tis_cap=1e9), fresh=True, version_paths={"v-old": str(old_version)})
    rows = trainer.prepare(samples, {})
    # the old version's logprobs differ from the fresh (= base) adapter's: importance weights are not 1
    assert any(not torch.allclose(r.behaviour, r.old, atol=1e-3) for r in rows)
    assert sorted(n for n, _ in tiny_peft.named_parameters() if "lora_" in n and "v-old" in n) == []
    assert all(p.requires_grad == ("lora_" in n) for n, p in tiny_peft.named_parameters())
    dropped: dict[str, int] = {}
    unknown = GRPOTrainer(tiny_peft, trainer_config(), fresh=True).prepare(samples, dropped)
    assert unknown == [] and dropped == {"behaviour_unavailable": 4}


def test_the_first_step_takes_old_logprobs_from_its_own_forward_pass_and_trains_the_same(tiny_peft):
    """Data an older version sampled (its logprobs recorded) needs the starting policy's logprobs:
    the first optimizer step's rows get them from that step's own forward pass (no update has
    happened yet), only later steps' rows are scored up front, and the update is the same."""
    prompt = [1, 20, 30, 40]
    answers = [[100, 101, 102, 2], [200, 201, 2], [100, 103, 2], [200, 202, 203, 2], [100, 2], [201, 2]]

    def stale(index: int, answer: list[int]) -> TrainSample:
        ids = prompt + answer
        recorded = [math.nan] * len(prompt) + [-1.5] * len(answer)  # what the older sampler reported
        piece = Segment(ids, [False] * len(prompt) + [True] * len(answer), recorded, 1.0, "older-version")
        return TrainSample(f"t{index}", float(index % 2 == 0), 1.0 if index % 2 == 0 else -1.0, [piece])

    samples = [stale(i, a) for i, a in enumerate(answers)]
    config = trainer_config(lr=1e-2, micro_batch_size=2, grad_accumulation=2)  # steps of 4, then 2
    start = {k: v.clone() for k, v in tiny_peft.state_dict().items() if "lora_" in k}

    def trained(score_every_row: bool) -> tuple[dict[str, torch.Tensor], int]:
        tiny_peft.load_state_dict(start, strict=False)
        trainer = GRPOTrainer(tiny_peft, config, start_version="head")
        scored = 0
        score = trainer._score

        def counting(rows: Any) -> list[torch.Tensor]:
            nonlocal scored
            scored += len(rows)
            return score(rows)

        trainer._score = counting  # type: ignore[method-assign]
        if score_every_row:
            fill_old = trainer._fill_old
            trainer._fill_old = lambda rows, first_step: fill_old(rows, set())  # type: ignore[method-assign]
        result = trainer.train(samples)
        assert result.optimizer_steps == 2 and result.samples == 6
        return {k: v.clone() for k, v in tiny_peft.state_dict().items() if "lora_" in k}, scored

    deferred, deferred_scored = trained(score_every_row=False)
    scored_all, all_scored = trained(score_every_row=True)
    assert all_scored == 6 and deferred_scored == 2, "only the second step's two rows are scored up front"
    assert any(not torch.equal(deferred[k], start[k]) for k in start), "the run trained"
    for key, value in deferred.items():
        assert torch.allclose(value, scored_all[key], atol=1e-6), key


def test_a_prefix_every_row_shares_runs_once_with_the_same_logprobs_and_gradients(tiny_peft):
    """A group's answers share their prompt: the decoder runs it once, for one row, and the rows'
    remainders attend to its copied cache. Logprobs and the gradient are the full forward's."""
    from learner.grpo.trainer import MIN_SHARED_PREFIX, loss_position_logits, shared_prefix_length

    prompt = [1] + list(range(20, 20 + 2 * MIN_SHARED_PREFIX))  # longer than the threshold
    answers = [[100, 101, 102, 2], [200, 201, 2], [100, 103, 104, 105, 106, 2], [201, 2]]
    rows = [prompt + answer for answer in answers]
    input_ids = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)] = torch.tensor(row)
    batch_index = torch.cat([torch.full((len(a),), i) for i, a in enumerate(answers)])
    positions = torch.cat([torch.arange(len(prompt), len(prompt) + len(a)) for a in answers])
    assert shared_prefix_length(input_ids, int(positions.min()) - 1) == len(prompt) - 1

    base = tiny_peft.get_base_model()
    decoder, head = base.get_decoder(), base.get_output_embeddings()
    seen: list[int] = []  # tokens of each decoder pass
    hook = decoder.register_forward_pre_hook(lambda _m, _a, kw: seen.append(kw["input_ids"].numel()), with_kwargs=True)
    tiny_peft.train()

    def logits_and_gradient(shared: bool) -> tuple[torch.Tensor, torch.Tensor]:
        tiny_peft.zero_grad(set_to_none=True)
        if shared:
            logits = loss_position_logits(tiny_peft, decoder, head, False, input_ids, batch_index, positions)
        else:
            logits = head(decoder(input_ids=input_ids).last_hidden_state[batch_index, positions - 1])
        logp = torch.log_softmax(logits, -1).gather(-1, input_ids[batch_index, positions, None])
        (logp.squeeze(-1) * torch.linspace(-1, 1, logp.numel())).sum().backward()
        gradient = torch.cat([p.grad.flatten() for p in tiny_peft.parameters() if p.requires_grad])
        return logp.detach(), gradient

    try:
        plain_logp, plain_gradient = logits_and_gradient(shared=False)
        seen.clear()
        shared_logp, shared_gradient = logits_and_gradient(shared=True)
    finally:
        hook.remove()
    width = input_ids.size(1)
    assert seen == [len(prompt) - 1, len(rows) * (width - len(prompt) + 1)], "the prefix ran once, for one row"
    assert plain_gradient.abs().sum() > 0
    assert torch.allclose(plain_logp, shared_logp, atol=1e-5)
    assert torch.allclose(plain_gradient, shared_gradient, atol=1e-5)
