"""The loss against hand-computed values: clipping, truncated importance weights, k3 KL, aggregation."""

from __future__ import annotations

import math

import pytest
import torch

from learner.grpo.loss import aggregation_weights, grpo_loss, k3_kl, token_logprobs

log = math.log


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_clipped_ratio_with_asymmetric_eps():
    logp = t(log(0.5), log(0.3), log(0.6)).requires_grad_()
    old = t(log(0.4), log(0.4), log(0.4))
    # ratios 1.25 (A>0, inside), 0.75 (A<0, below 1-0.2: clipped), 1.5 (A>0, above 1+0.28: clipped)
    out = grpo_loss(logp, old, t(1.0, -1.0, 2.0), t(0.25, 0.25, 0.5), eps_low=0.2, eps_high=0.28)
    # pg = [-1.25, -min(-0.75, -0.8) = 0.8, -min(3.0, 2.56) = -2.56]
    assert out.per_token.tolist() == pytest.approx([-1.25, 0.8, -2.56])
    assert out.loss.item() == pytest.approx(0.25 * -1.25 + 0.25 * 0.8 + 0.5 * -2.56)
    assert out.clipped.tolist() == [False, True, True]
    out.loss.backward()
    # d/dlogp of -w*A*ratio on the unclipped token; clipped tokens get no gradient
    assert logp.grad.tolist() == pytest.approx([-0.25 * 1.0 * 1.25, 0.0, 0.0])


def test_negative_advantage_above_the_clip_range_still_gets_gradient():
    # PPO's min keeps the unclipped (pessimistic) term when A < 0 and the ratio grew
    logp = t(log(0.6)).requires_grad_()
    out = grpo_loss(logp, t(log(0.4)), t(-1.0), t(1.0), eps_low=0.2, eps_high=0.2)
    assert out.loss.item() == pytest.approx(1.5) and out.clipped.tolist() == [False]
    out.loss.backward()
    assert logp.grad.tolist() == pytest.approx([1.5])


def test_truncated_importance_weight_for_stale_data():
    logp = t(log(0.4), log(0.4)).requires_grad_()
    old = t(log(0.4), log(0.4))
    behaviour = t(log(0.1), log(0.5))  # weights 4 (capped at 2) and 0.8
    out = grpo_loss(
        logp, old, t(1.0, 1.0), t(0.5, 0.5), eps_low=0.2, eps_high=0.2, behaviour_logp=behaviour, tis_cap=2.0
    )
    assert out.tis.tolist() == pytest.approx([2.0, 0.8])
    assert out.loss.item() == pytest.approx(0.5 * -2.0 + 0.5 * -0.8)
    out.loss.backward()
    assert logp.grad.tolist() == pytest.approx([-1.0, -0.4]), "the weight scales the gradient, it is not trained"


def test_k3_kl_to_the_base_model():
    assert float(k3_kl(t(log(0.25)), t(log(0.5)))) == pytest.approx(2 - log(2) - 1)
    assert float(k3_kl(t(log(0.3)), t(log(0.3)))) == 0.0
    logp = t(log(0.25)).requires_grad_()
    out = grpo_loss(logp, t(log(0.25)), t(0.0), t(1.0), eps_low=0.2, eps_high=0.2, ref_logp=t(log(0.5)), kl_beta=0.1)
    assert out.loss.item() == pytest.approx(0.1 * (2 - log(2) - 1))
    out.loss.backward()
    # d/dlogp [exp(ref - logp) - (ref - logp) - 1] = 1 - exp(ref - logp) = 1 - 2
    assert logp.grad.tolist() == pytest.approx([0.1 * -1.0])


def test_aggregation_weights():
    assert aggregation_weights([2, 4], "token") == pytest.approx([1 / 6, 1 / 6])
    assert aggregation_weights([2, 4], "sequence") == pytest.approx([1 / 4, 1 / 8])
    assert aggregation_weights([2, 4], "dr_grpo") == pytest.approx([1 / 8, 1 / 8])
    # every trajectory's tokens sum to its share: sequence-level gives each trajectory 1/n
    assert 2 * aggregation_weights([2, 4], "sequence")[0] == pytest.approx(
        4 * aggregation_weights([2, 4], "sequence")[1]
    )


def test_token_logprobs_at_the_sampling_temperature():
    logits = torch.tensor([[2.0, 0.0, 0.0], [2.0, 0.0, 0.0]])
    got = token_logprobs(logits, torch.tensor([0, 0]), torch.tensor([2.0, 1.0]))
    assert got.tolist() == pytest.approx([1 - log(math.e + 2), 2 - log(math.e**2 + 2)], abs=1e-6)
