"""The sampler's maths, without a server: what is drawn and which logprob is reported."""

from __future__ import annotations

import math

import torch

from learner.serving.sampling import SamplingParams, make_generator, processed_logprobs, sample_row


def draws(logprobs: torch.Tensor, params: SamplingParams, count: int = 4000) -> torch.Tensor:
    generator = make_generator(0, 0, torch.device("cpu"))
    counts = torch.zeros(logprobs.numel())
    for _ in range(count):
        counts[sample_row(logprobs, params, generator)] += 1
    return counts / count


def test_draws_follow_the_tempered_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    params = SamplingParams(max_tokens=1, temperature=0.5)
    logprobs = processed_logprobs(logits, torch.tensor([0.5]))[0]
    assert torch.allclose(logprobs, torch.log_softmax(logits[0] / 0.5, -1))
    assert torch.allclose(draws(logprobs, params), logprobs.exp(), atol=0.03)


def test_top_p_draws_only_from_the_nucleus_and_greedy_takes_the_argmax():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logprobs = probs.log()
    nucleus = draws(logprobs, SamplingParams(max_tokens=1, top_p=0.8))
    assert nucleus[2] == 0 and nucleus[3] == 0
    assert math.isclose(float(nucleus[0]), 0.5 / 0.8, abs_tol=0.03)
    greedy = SamplingParams(max_tokens=1, temperature=0.0)
    assert (
        sample_row(
            processed_logprobs(torch.tensor([[0.1, 3.0, 0.2]]), torch.tensor([0.0]))[0],
            greedy,
            make_generator(None, 0, torch.device("cpu")),
        )
        == 1
    )


def test_a_seed_gives_the_same_draws_and_each_choice_its_own():
    logprobs = torch.log_softmax(torch.randn(1000), -1)
    params = SamplingParams(max_tokens=1)

    def sequence(seed: int, index: int) -> list[int]:
        generator = make_generator(seed, index, torch.device("cpu"))
        return [sample_row(logprobs, params, generator) for _ in range(20)]

    assert sequence(7, 0) == sequence(7, 0)
    assert sequence(7, 0) != sequence(7, 1)
