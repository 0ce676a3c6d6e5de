"""Supervised fine-tuning of the lineage's LoRA: cross-entropy on the assistant turns only.

A distillation run (learner/jobs/distill.py) hands this the teacher's chosen trajectories as
`Segment`s (learner/grpo/tokens.py renders them with the policy's own chat template: the loss
mask covers every assistant turn, tool calls included, and nothing else). Each optimizer step
covers `micro_batch_size x grad_accumulation` segments; the loss is the mean over all loss
tokens of the step (every teacher token weighs the same, as the RL trainer's "token"
aggregation), computed exactly across micro-batches by weighting each micro-batch's token sum
by 1 / (the step's loss tokens).

The optimizer is the lineage's own (PolicyTrainer.optimizer): SFT and RL runs continue one
optimization. Its learning rate is set to the distillation's for the run and put back after,
since SFT moves the weights much further per step than GRPO's clipped updates should.
A NaN or infinite loss raises NonFiniteLoss (the run is aborted, no candidate).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from learner.grpo.tokens import Segment
from learner.grpo.trainer import NonFiniteLoss


@dataclass(frozen=True)
class SFTConfig:
    lr: float
    epochs: int
    max_steps: int | None
    micro_batch_size: int
    grad_accumulation: int
    max_grad_norm: float
    max_seq_len: int
    seed: int = 0


@dataclass
class SFTResult:
    samples: int = 0  # segments trained on
    dropped_too_long: int = 0
    loss_tokens: int = 0  # loss tokens per epoch
    optimizer_steps: int = 0
    loss: float | None = None  # the last epoch's token-mean cross-entropy
    first_loss: float | None = None  # the first step's
    losses: list[float] = field(default_factory=list)  # per step

    def as_metrics(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "dropped_too_long": self.dropped_too_long,
            "loss_tokens": self.loss_tokens,
            "optimizer_steps": self.optimizer_steps,
            "loss": self.loss,
            "first_loss": self.first_loss,
            "losses": [round(v, 5) for v in self.losses],
        }


def batch(segments: Sequence[Segment], pad_token_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and the matching 0/1 mask of the loss positions (no attention mask: under
    causal attention no real token sees the padding after it)."""
    length = max(len(s.input_ids) for s in segments)
    ids = torch.full((len(segments), length), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(segments), length), dtype=torch.bool)
    for i, segment in enumerate(segments):
        ids[i, : len(segment.input_ids)] = torch.tensor(segment.input_ids, dtype=torch.long)
        mask[i, : len(segment.loss_mask)] = torch.tensor(segment.loss_mask, dtype=torch.bool)
    return ids.to(device), mask.to(device)


def _token_loss_sum(model: Any, segments: Sequence[Segment], pad_token_id: int) -> tuple[torch.Tensor, int]:
    """Sum of -log p(token) over the loss positions of `segments`, and how many there are."""
    device = next(model.parameters()).device
    ids, mask = batch(segments, pad_token_id, device)
    return token_loss_sum(model(input_ids=ids).logits, ids, mask)


def token_loss_sum(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Sum of -log p(token) over the loss positions (`mask`) of a batch, from its logits."""
    logits = logits[:, :-1].float()
    targets = ids[:, 1:]
    positions = mask[:, 1:]
    picked = logits[positions]
    loss = torch.nn.functional.cross_entropy(picked, targets[positions], reduction="sum")
    return loss, int(positions.sum())


# (one optimizer step's segments, the step's loss tokens, the step's number) -> the step's summed
# cross-entropy, its gradient accumulated (divided by the step's loss tokens).
StepBackward = Callable[[Sequence[Segment], int, int], float]


def local_step_backward(model: Any, micro_batch_size: int, pad_token_id: int) -> StepBackward:
    """One process's step: its micro-batches one after the other; a NaN loss raises before its backward."""

    def step_backward(step: Sequence[Segment], step_tokens: int, number: int) -> float:
        step_sum = 0.0
        for micro_start in range(0, len(step), micro_batch_size):
            micro = step[micro_start : micro_start + micro_batch_size]
            loss_sum, _ = _token_loss_sum(model, micro, pad_token_id)
            if not torch.isfinite(loss_sum):
                raise NonFiniteLoss(f"SFT loss is {float(loss_sum)} at step {number}")
            (loss_sum / step_tokens).backward()
            step_sum += float(loss_sum.detach())
        return step_sum

    return step_backward


def train_sft(
    model: Any,
    optimizer: torch.optim.Optimizer,
    segments: Sequence[Segment],
    config: SFTConfig,
    pad_token_id: int,
    step_backward: StepBackward | None = None,
) -> SFTResult:
    """Fine-tune `model` (its trainable parameters: the LoRA) on `segments`; see the module docstring.

    `step_backward`: how a step's gradient is accumulated; by default this process alone
    (`local_step_backward`), on several ranks learner/distributed/sft.py's."""
    result = SFTResult()
    kept = [s for s in segments if len(s.input_ids) <= config.max_seq_len and s.loss_tokens > 0]
    result.dropped_too_long = len(segments) - len(kept)
    result.samples = len(kept)
    result.loss_tokens = sum(s.loss_tokens for s in kept)
    if not kept:
        return result
    params = [p for p in model.parameters() if p.requires_grad]
    backward = step_backward or local_step_backward(model, config.micro_batch_size, pad_token_id)
    saved_lr = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = config.lr
    rng = random.Random(config.seed)
    per_step = config.micro_batch_size * config.grad_accumulation
    try:
        for _epoch in range(config.epochs):
            order = kept[:]
            rng.shuffle(order)
            epoch_sum, epoch_tokens = 0.0, 0
            for start in range(0, len(order), per_step):
                if config.max_steps is not None and result.optimizer_steps >= config.max_steps:
                    break
                step = order[start : start + per_step]
                step_tokens = sum(s.loss_tokens for s in step)
                optimizer.zero_grad(set_to_none=True)
                step_sum = backward(step, step_tokens, result.optimizer_steps + 1)
                norm = _norm(torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm))
                if not math.isfinite(norm):
                    raise NonFiniteLoss(f"SFT gradient norm is {norm} at step {result.optimizer_steps + 1}")
                optimizer.step()
                result.optimizer_steps += 1
                step_loss = step_sum / step_tokens
                result.losses.append(step_loss)
                if result.first_loss is None:
                    result.first_loss = step_loss
                epoch_sum += step_sum
                epoch_tokens += step_tokens
            if epoch_tokens:
                result.loss = epoch_sum / epoch_tokens
    finally:
        optimizer.zero_grad(set_to_none=True)
        for group, lr in zip(optimizer.param_groups, saved_lr, strict=True):
            group["lr"] = lr
    return result


def _norm(total: torch.Tensor) -> float:
    """clip_grad_norm_'s total norm as a float (a DTensor when the model is sharded by FSDP)."""
    full = total.full_tensor() if hasattr(total, "full_tensor") else total
    return float(full)
