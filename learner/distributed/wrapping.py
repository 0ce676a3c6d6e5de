"""The peft model wrapped for data-parallel training: DDP (every rank holds the whole model) or
FSDP2 (`fully_shard`: every rank holds a shard of each weight, for models that do not fit one GPU).

Both wrappers work by hooks on the wrapped module's `forward`: DDP prepares its gradient
reduction there, FSDP gathers the sharded weights there. The trainer reads logits at the loss
positions only (decoder, gather, head: trainer.loss_position_logits), so that computation is
made the `forward` of one small module, `LossPositionLogits`, and that module is what gets
wrapped. Calling the decoder directly would bypass the hooks.

Gradients: both wrappers average over ranks, while the trainer's loss is a sum over the whole
step's tokens with global weights; each rank's loss is multiplied by the world size before
`backward` (trainer side) so that the average is the one-process gradient.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch

from learner.distributed.context import DistributedContext
from learner.grpo.trainer import loss_position_logits


class LossPositionLogits(torch.nn.Module):
    """forward(input_ids, batch_index, positions) -> the logits that predict the loss tokens.
    `share_prefix`: run the rows' common prefix once (not under FSDP: see loss_position_logits)."""

    def __init__(self, model: Any, full_forward: bool, share_prefix: bool = True) -> None:
        super().__init__()
        self.model = model
        self.full_forward = full_forward
        self.share_prefix = share_prefix

    def forward(self, input_ids: torch.Tensor, batch_index: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        base = self.model.get_base_model()
        return loss_position_logits(
            self.model,
            base.get_decoder(),
            base.get_output_embeddings(),
            self.full_forward,
            input_ids,
            batch_index,
            positions,
            self.share_prefix,
        )


def broadcast_trainable(model: Any) -> None:
    """Rank 0's trainable weights to every rank: all ranks start the run from the same adapter
    (they loaded the same files, or seeded the same fresh LoRA; this makes it certain)."""
    import torch.distributed as dist

    for param in model.parameters():
        if param.requires_grad:
            dist.broadcast(param.data, src=0)


class FullLogits(torch.nn.Module):
    """forward(input_ids) -> the model's logits at every position (the SFT loss reads them all)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.model(input_ids=input_ids).logits
        return logits


def wrap(root: torch.nn.Module, model: Any, context: DistributedContext) -> torch.nn.Module:
    """`root` (a module holding the peft `model`) wrapped as `context.strategy` says."""
    if context.strategy == "fsdp":
        return wrap_fsdp(root, model, context)
    return wrap_ddp(root, model, context)


def wrap_ddp(root: torch.nn.Module, model: Any, context: DistributedContext) -> torch.nn.Module:
    """DDP over the trainable (LoRA) parameters. The frozen base weights are not broadcast at
    construction (init_sync=False): every rank loaded them from the same files, and broadcasting
    a whole base model per run would cost more than the run's own reductions."""
    from torch.nn.parallel import DistributedDataParallel

    broadcast_trainable(model)
    device_ids = [context.local_rank] if context.backend == "nccl" else None
    return DistributedDataParallel(
        root,
        device_ids=device_ids,
        init_sync=False,
        forward_sync_buffers=False,
    )


def shard_units(model: Any) -> list[torch.nn.Module]:
    """The modules FSDP shards one by one: the model's own "do not split" blocks (transformers'
    `_no_split_modules`, its decoder layers), so that one layer's weights are gathered at a time."""
    base = model.get_base_model()
    names = set(getattr(base, "_no_split_modules", None) or [])
    units = [module for module in base.modules() if type(module).__name__ in names]
    if not units:
        raise ValueError(
            f"{type(base).__name__} names no _no_split_modules: FSDP needs its decoder layers to shard; "
            "use learning.distributed: ddp"
        )
    return units


def wrap_fsdp(root: torch.nn.Module, model: Any, context: DistributedContext) -> torch.nn.Module:
    """FSDP2 (`fully_shard`) per decoder layer, then the rest (embeddings, final norm, head) as the
    root. LoRA's frozen and trainable weights share each layer's group (FSDP2 keeps each
    parameter's requires_grad); parameter names stay those of the peft model."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    broadcast_trainable(model)
    device_type = "cuda" if context.backend == "nccl" else "cpu"
    mesh = init_device_mesh(device_type, (context.world_size,))
    for unit in shard_units(model):
        fully_shard(unit, mesh=mesh)
    fully_shard(root, mesh=mesh)
    return root


def full_trainable_state(model: Any) -> dict[str, torch.Tensor]:
    """The trainable weights as whole tensors on the CPU, by name (a collective under FSDP: every
    rank calls it). What rank 0 saves as the adapter."""
    state: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        value = param.detach()
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        state[name] = full.cpu().clone()
    return state


@contextlib.contextmanager
def gradient_sync(wrapped: Any, fsdp: bool, last: bool) -> Iterator[None]:
    """Reduce gradients on an optimizer step's last backward only; before it they accumulate on
    each rank (DDP's no_sync, FSDP's set_requires_gradient_sync)."""
    if fsdp:
        wrapped.set_requires_gradient_sync(last)
        yield
    elif last:
        yield
    else:
        with wrapped.no_sync():
            yield


def padding_passes(own: int, per_rank: list[int], micro_batch_size: int, fsdp: bool) -> int:
    """How many micro-batch passes this rank runs in a step, its own `own` rows included.

    Under DDP at least one (a rank with nothing still joins the step's one reduction); under FSDP
    as many as the busiest rank (every forward gathers weights: all ranks must run the same number).
    """
    counts = [math.ceil(n / micro_batch_size) for n in per_rank]
    return max(counts) if fsdp else max(1, math.ceil(own / micro_batch_size))
