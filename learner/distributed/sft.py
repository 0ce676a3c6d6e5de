"""Distillation (SFT) on several ranks: each rank takes its share of every optimizer step's segments.

The one-process loss of a step is sum(-log p over the step's loss tokens) / (the step's loss
tokens). Every rank holds all the step's segments, so each knows that denominator; each rank
backpropagates its own segments' sum divided by it, times the world size (DDP and FSDP average
gradients over ranks), and the reduced gradient is the one-process gradient. The step loop itself
(epochs, shuffling, learning rate, clipping) is learner/sft/trainer.py's, unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from learner.distributed.context import DistributedContext
from learner.distributed.sharding import split_step
from learner.distributed.wrapping import FullLogits, full_trainable_state, gradient_sync, padding_passes, wrap
from learner.grpo.tokens import Segment
from learner.grpo.trainer import NonFiniteLoss
from learner.sft.trainer import SFTConfig, SFTResult, batch, token_loss_sum, train_sft


def train_sft_distributed(
    model: Any,
    optimizer: torch.optim.Optimizer,
    segments: Sequence[Segment],
    config: SFTConfig,
    pad_token_id: int,
    context: DistributedContext,
) -> tuple[SFTResult, dict[str, torch.Tensor] | None]:
    """`train_sft` on this rank's shares; returns the result and, under FSDP, the whole trained LoRA
    weights (the model then holds shards) for rank 0 to save."""
    device = context.device()  # not the model's: under FSDP it is loaded on the CPU, its shards move
    wrapped = wrap(FullLogits(model), model, context)
    fsdp = context.strategy == "fsdp"
    if fsdp:  # the parameters are now shards: an AdamW with the lineage's settings over those
        params = [p for p in model.parameters() if p.requires_grad]
        # Not type(optimizer)(params, **defaults): AdamW's defaults hold `decoupled_weight_decay`,
        # which its constructor refuses (torch >= 2.8).
        settings = {key: optimizer.defaults[key] for key in ("lr", "betas", "eps", "weight_decay", "amsgrad")}
        optimizer = torch.optim.AdamW(params, **settings)
    step_backward = _ShareBackward(wrapped, context, config.micro_batch_size, pad_token_id, device, fsdp)
    result = train_sft(model, optimizer, segments, config, pad_token_id, step_backward=step_backward)
    return result, full_trainable_state(model) if fsdp else None


class _ShareBackward:
    """learner.sft.trainer.StepBackward for one rank: its share of the step, then the step's sums."""

    def __init__(
        self,
        wrapped: torch.nn.Module,
        context: DistributedContext,
        micro_batch_size: int,
        pad_token_id: int,
        device: torch.device,
        fsdp: bool,
    ) -> None:
        self.wrapped, self.context = wrapped, context
        self.micro_batch_size, self.pad_token_id = micro_batch_size, pad_token_id
        self.device, self.fsdp = device, fsdp

    def __call__(self, step: Sequence[Segment], step_tokens: int, number: int) -> float:
        rank, world = self.context.rank, self.context.world_size
        shares = split_step(range(len(step)), {i: len(s.input_ids) for i, s in enumerate(step)}, world)
        own = [step[i] for i in shares[rank]]
        passes: list[Sequence[Segment] | None] = [
            own[i : i + self.micro_batch_size] for i in range(0, len(own), self.micro_batch_size)
        ]
        count = padding_passes(len(own), [len(share) for share in shares], self.micro_batch_size, self.fsdp)
        passes += [None] * (count - len(passes))
        local, non_finite = 0.0, 0
        for index, micro in enumerate(passes):
            with gradient_sync(self.wrapped, self.fsdp, last=index == len(passes) - 1):
                if micro is None:  # nothing (more) here: a zero-weight pass joins the reduction
                    ids = torch.full((1, 2), self.pad_token_id, dtype=torch.long, device=self.device)
                    self.wrapped(ids).sum().mul(0.0).backward()
                    continue
                ids, mask = batch(micro, self.pad_token_id, self.device)
                loss_sum, _ = token_loss_sum(self.wrapped(ids), ids, mask)
                if not math.isfinite(float(loss_sum.detach())):
                    non_finite += 1  # reduced first, so that every rank aborts at this step
                (loss_sum * (world / step_tokens)).backward()
                local += float(loss_sum.detach())
        total, bad = self.context.all_reduce_sum([local, float(non_finite)])
        if bad > 0:
            raise NonFiniteLoss(f"SFT loss is not finite on {int(bad)} micro-batches at step {number}")
        return total
