"""GRPO on several ranks: each rank trains its share of every optimizer step, and all ranks end
with the one-process adapter (up to floating-point summation order).

How the one-process result is kept:
- Every rank builds every sample's rows (token ids and loss positions: cheap, no model) and
  plans the same optimizer steps with the same seed (`GRPOTrainer._plan`). Rows whose sampler
  cannot be scored are dropped up front by a rule that needs no model, so every rank drops the
  same rows.
- Each step's samples are split between ranks (sharding.split_step: whole samples, balanced by
  tokens). The step's token weights (`loss.aggregation_weights`: token mean, per-sequence mean or
  Dr. GRPO) are computed from ALL the step's rows, which every rank holds, so each rank's loss is
  its part of the global sum: no normaliser needs reducing, and the sum over ranks is exactly
  the one-process loss.
- DDP and FSDP average gradients over ranks; each rank's loss is multiplied by the world size
  before backward, so the reduced gradient is the one-process gradient. Clipping and AdamW then
  see the same gradient on every rank and every rank's weights stay equal.
- A rank whose share of a step is empty still runs one zero-weight micro-batch, so that it takes
  part in the step's reduction. Under FSDP every forward gathers weights (a collective), so all
  ranks run the same number of forwards: each rank pads to the largest share's micro-batch count
  (known to all: shares are computed, not exchanged), and every rank scores every row's
  reference logprobs (the same forwards in the same order).
- The step's statistics (loss, KL, clip counts, tokens) are summed over ranks, and a NaN loss on
  any rank aborts the run on every rank at the same step (NonFiniteLoss on all of them).

Reference logprobs under DDP are computed by each rank for its own rows only, with the plain
(unwrapped) model. Under FSDP, a row whose sampler was another saved version without recorded
logprobs cannot be scored (loading a second adapter into a sharded model is not supported):
such rows are dropped and counted as `behaviour_unavailable`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

import torch

from learner.distributed.context import DistributedContext
from learner.distributed.sharding import split_step
from learner.distributed.wrapping import (
    LossPositionLogits,
    full_trainable_state,
    gradient_sync,
    padding_passes,
    wrap,
)
from learner.grpo.trainer import (
    GRPOTrainer,
    NonFiniteLoss,
    StepSums,
    TrainResult,
    TrainSample,
    _chunks,
    _require_finite,
    _Row,
    _RunMeter,
    _show_progress,
    step_sizes,
)


class DistributedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer for one rank of a torchrun group; see the module docstring.

    After `train`, under FSDP, `adapter_state` holds the trained LoRA weights whole (the model's
    own parameters are shards): rank 0 saves the adapter from it.
    """

    def __init__(self, model: Any, config: Any, *, distributed: DistributedContext, **kwargs: Any) -> None:
        super().__init__(model, config, **kwargs)
        self.distributed = distributed
        # Inputs go to this rank's device: under FSDP the model is loaded on the CPU and only its
        # shards move to the GPU, so the model's first parameter does not say where.
        self.device = distributed.device()
        self.wrapped: torch.nn.Module | None = None
        self.adapter_state: dict[str, torch.Tensor] | None = None

    @property
    def fsdp(self) -> bool:
        return self.distributed.strategy == "fsdp"

    # ------------------------------------------------------------------ the run

    def train(self, samples: Sequence[TrainSample]) -> TrainResult:
        started = time.perf_counter()
        result = TrainResult(kl_reference="base" if self.config.kl_beta > 0 else "start")
        rows = self._all_rows(samples, result.dropped)
        by_sample = self._by_sample(rows, result)
        if by_sample:
            steps = self._plan(sorted(by_sample), step_sizes(samples, by_sample))
            sizes = {sample: sum(int(r.ids.numel()) for r in rows) for sample, rows in by_sample.items()}
            shares = [split_step(step, sizes, self.distributed.world_size) for step in steps]
            if self.fsdp:
                logits = LossPositionLogits(self.model, self._full_forward, share_prefix=False)
                self.wrapped = wrap(logits, self.model, self.distributed)
                self._fill_references(rows, {})  # every rank, every row: the same forwards everywhere
            else:
                mine = sorted({s for share in shares for s in share[self.distributed.rank]})
                self._fill_references([r for s in mine for r in by_sample[s]], {})
                self.wrapped = wrap(LossPositionLogits(self.model, self._full_forward), self.model, self.distributed)
            self._optimize_shares(samples, by_sample, steps, shares, result)
            if self.fsdp:
                self.adapter_state = full_trainable_state(self.model)
        result.duration_s = time.perf_counter() - started
        return result

    def _all_rows(self, samples: Sequence[TrainSample], dropped: dict[str, int]) -> list[_Row]:
        """Every sample's rows, without reference logprobs, minus the rows `prepare` would drop;
        the same list on every rank."""
        rows = []
        for row in self.build_rows(samples, dropped):
            if self._behaviour_scorable(row):
                rows.append(row)
            else:
                dropped["behaviour_unavailable"] = dropped.get("behaviour_unavailable", 0) + 1
        return rows

    def _behaviour_scorable(self, row: _Row) -> bool:
        """`_fill_behaviour` will find this row's sampler logprobs: recorded, the starting policy's
        own, the base model's, or (not under FSDP) a saved version's."""
        if row.recorded is not None or self._on_policy(row) or row.version is None:
            return True
        return row.version in self.version_paths and not self.fsdp

    # ------------------------------------------------------------------ the steps

    def _optimize_shares(
        self,
        samples: Sequence[TrainSample],
        by_sample: dict[int, list[_Row]],
        steps: list[list[int]],
        shares: list[list[list[int]]],
        result: TrainResult,
    ) -> None:
        assert self.wrapped is not None
        params = self._trainable_parameters()
        if self.fsdp:  # the parameters are now shards: the optimizer must hold those
            optimizer: torch.optim.Optimizer = torch.optim.AdamW(
                params, lr=self.config.lr, weight_decay=self.config.weight_decay
            )
        else:
            optimizer = self.optimizer or torch.optim.AdamW(
                params, lr=self.config.lr, weight_decay=self.config.weight_decay
            )
        rank = self.distributed.rank
        meter = _RunMeter()
        self.model.train()
        try:
            with self._progress_bar(len(steps)) as bar:  # rank 0's only: the others are made with progress=False
                for number, (step, share) in enumerate(zip(steps, shares, strict=True), start=1):
                    optimizer.zero_grad(set_to_none=True)
                    step_rows = [row for sample in step for row in by_sample[sample]]
                    own = [row for sample in share[rank] for row in by_sample[sample]]
                    per_rank = [sum(len(by_sample[s]) for s in part) for part in share]
                    micro_batches = padding_passes(len(own), per_rank, self.config.micro_batch_size, self.fsdp)
                    local, non_finite = self._backward_share(samples, step_rows, own, micro_batches, number == 1)
                    step_sums = self._reduce(local, non_finite, number)
                    grad_norm = _total_norm(torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm))
                    _require_finite("gradient norm", grad_norm, number)
                    optimizer.step()
                    _show_progress(bar, meter.record(number, step_sums, grad_norm))
        finally:
            self.model.eval()
        meter.fill(result)

    def _backward_share(
        self,
        samples: Sequence[TrainSample],
        step_rows: Sequence[_Row],
        own: Sequence[_Row],
        micro_batches: int,
        measure_gap: bool,
    ) -> tuple[StepSums, int]:
        """This rank's part of one step's gradient: its rows in `micro_batches` passes (padded
        with zero-weight passes), weighted by the whole step's token weights. Returns its sums and
        how many of its micro-batch losses were not finite."""
        weight_of = self._sample_weights(sorted(step_rows, key=lambda r: r.ids.numel()))
        ordered = sorted(own, key=lambda r: r.ids.numel())
        passes: list[Sequence[_Row] | None] = list(_chunks(ordered, self.config.micro_batch_size))
        passes += [None] * (micro_batches - len(passes))
        world = float(self.distributed.world_size)
        sums, non_finite = StepSums(), 0
        for index, micro in enumerate(passes):
            with gradient_sync(self.wrapped, self.fsdp, last=index == len(passes) - 1):
                if micro is None:
                    self._logprobs([self._padding_row()]).sum().mul(0.0).backward()
                    continue
                logp = self._logprobs(micro)
                old = self._concat([r.old for r in micro])
                out = self._loss(micro, logp, old, samples, weight_of)
                if not math.isfinite(out.loss.item()):
                    non_finite += 1  # every rank still reduces this step; all abort together after it
                (out.loss * world).backward()
                sums.add_micro_batch(micro, logp.detach(), old, out, self.config.tis_cap)
                if measure_gap:
                    self._measure_gap(sums, micro, logp.detach())
        return sums, non_finite

    def _padding_row(self) -> _Row:
        """A two-token row for a rank with nothing (more) to do in a step; its loss is multiplied by 0."""
        ids = torch.tensor([self.pad_token_id, self.pad_token_id], dtype=torch.long)
        return _Row(-1, ids, torch.tensor([1]), 1.0, None, None)

    def _reduce(self, local: StepSums, non_finite: int, number: int) -> StepSums:
        """The step's sums over all ranks; every rank raises NonFiniteLoss if any rank's loss was not finite."""
        names = [f.name for f in fields(StepSums)]
        totals = self.distributed.all_reduce_sum([float(getattr(local, n)) for n in names] + [float(non_finite)])
        if totals[-1] > 0:
            raise NonFiniteLoss(f"loss is not finite on {int(totals[-1])} micro-batches at optimizer step {number}")
        reduced = StepSums()
        for name, value in zip(names, totals, strict=False):
            setattr(reduced, name, int(round(value)) if isinstance(getattr(reduced, name), int) else value)
        return reduced

    def _logits(self, input_ids: torch.Tensor, batch_index: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Through the wrapper once there is one (its hooks reduce or gather), else the plain model."""
        if self.wrapped is None:
            return super()._logits(input_ids, batch_index, positions)
        logits: torch.Tensor = self.wrapped(input_ids, batch_index, positions)
        return logits


def _total_norm(norm: torch.Tensor) -> float:
    """clip_grad_norm_'s total norm as a float (a DTensor under FSDP)."""
    full = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    return float(full)
