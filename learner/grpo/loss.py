"""The GRPO objective on the loss tokens of a batch, and how tokens are weighed.

Everything here works on flat vectors over loss tokens only (the assistant tokens), so masks
never reach the arithmetic and padding cannot leak into a mean.

Per token t of a trajectory with advantage A:
    ratio  = exp(logp - old)                        old: the policy this run started from
    pg     = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)
    tis    = min(exp(old - behaviour), tis_cap)     detached; 1 when behaviour == old
    kl     = exp(ref - logp) - (ref - logp) - 1     k3 estimator, ref = base model (adapter off)
    loss_t = tis * pg + kl_beta * kl
and the loss is sum_t w_t * loss_t, with w from `aggregation_weights`.

Why two reference policies: rewards arrive late, so a trajectory may have been sampled by an
older adapter version ("behaviour") than the one this run starts from ("old"). The clipped
ratio keeps each update close to `old` (PPO's trust region) and the truncated importance
weight corrects for sampling from `behaviour` without letting one unlikely token dominate
(decoupled PPO with TIS, as in AReaL and Yao et al. 2025). On fresh data behaviour == old up
to numerics and tis is about 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

Aggregation = Literal["token", "sequence", "dr_grpo"]


def aggregation_weights(token_counts: Sequence[int], kind: Aggregation) -> list[float]:
    """The weight of each loss token of each trajectory of one optimizer step.

    - "token": every token of the step weighs the same (sum / tokens; DAPO). Long answers get
      more say, short ones are not inflated.
    - "sequence": each trajectory weighs the same, its tokens share it (original GRPO).
    - "dr_grpo": sum / (trajectories x longest trajectory): no length normalisation at all.
    Computed over the whole step, so gradient accumulation is exact however the step is split
    into micro-batches.
    """
    counts = [int(c) for c in token_counts]
    n = len(counts)
    if n == 0 or sum(counts) == 0:
        return [0.0] * n
    if kind == "token":
        total = sum(counts)
        return [1.0 / total] * n
    if kind == "sequence":
        return [1.0 / (n * c) if c else 0.0 for c in counts]
    if kind == "dr_grpo":
        longest = max(counts)
        return [1.0 / (n * longest)] * n
    raise ValueError(f"unknown aggregation {kind!r}")


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits / T)[target] per row, in float32: the sampler's own definition.

    The inference server reports (and samples from) the temperature-scaled distribution, so
    the trainer must score tokens at the temperature each call was sampled at, or every
    ratio is off by a temperature-dependent amount.
    """
    scaled = logits.float() / temperatures.float().unsqueeze(-1)
    return torch.log_softmax(scaled, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar, already weighted: sum over micro-batches = the step's loss
    per_token: torch.Tensor  # unweighted loss_t, detached
    clipped: torch.Tensor  # bool per token: the clip was the binding term
    ratio: torch.Tensor  # detached
    tis: torch.Tensor  # detached
    kl: torch.Tensor | None  # detached k3 per token


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimate of KL(pi || ref) per token: unbiased, always >= 0."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    behaviour_logp: torch.Tensor | None = None,
    tis_cap: float | None = None,
    ref_logp: torch.Tensor | None = None,
    kl_beta: float = 0.0,
) -> LossOutput:
    """The clipped, importance-corrected GRPO loss over loss tokens (all arguments 1-D, aligned)."""
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped_ratio = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    pg = -torch.minimum(unclipped, clipped_ratio * advantages)
    if behaviour_logp is not None:
        tis = torch.exp(old_logp - behaviour_logp).detach()
        if tis_cap is not None:
            tis = torch.clamp(tis, max=tis_cap)
    else:
        tis = torch.ones_like(pg)
    per_token = tis * pg
    kl = None
    if ref_logp is not None and kl_beta > 0:
        kl = k3_kl(logp, ref_logp)
        per_token = per_token + kl_beta * kl
    with torch.no_grad():
        clipped = ((advantages > 0) & (ratio > 1.0 + eps_high)) | ((advantages < 0) & (ratio < 1.0 - eps_low))
    loss = (weights * per_token).sum()
    return LossOutput(
        loss=loss,
        per_token=per_token.detach(),
        clipped=clipped,
        ratio=ratio.detach(),
        tis=tis,
        kl=kl.detach() if kl is not None else None,
    )
