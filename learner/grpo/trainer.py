"""One training run: GRPO updates of a LoRA adapter over a fixed list of samples.

The run, in order:
1. Reference logprobs for every loss token, without gradients: "behaviour" (the sampler's:
   recorded when the server returned them, else recomputed with the saved weights of the
   version that served the call), "old" (the policy this run starts from: the promoted
   adapter, or a fresh LoRA, which equals the base model; taken from the record for data that
   policy sampled itself unless old_logprobs="recompute", scored otherwise) and "ref" (the
   base model, only when kl_beta > 0). The first optimizer step's rows are not scored: until
   that step's update the trainable policy *is* the starting one, so its own forward pass gives
   "old" exactly (as TRL takes it with one iteration per batch). A live loop's run is often one
   step of data that older versions sampled, all of which would otherwise need a scoring pass:
   a third of the run's compute on a CPU.
2. Split the samples into optimizer steps (whole trajectories; shuffled, seeded). A step's
   token weights are fixed before its first micro-batch (see loss.aggregation_weights), so
   micro-batches plus gradient accumulation compute exactly the full step's gradient while
   memory stays bounded by one micro-batch.
3. Each micro-batch: forward, GRPO loss, backward. A NaN or infinite loss or gradient norm
   aborts the whole run (NonFiniteLoss): no candidate may come out of it.
4. Per step: clip the gradient norm, AdamW step (the caller's optimizer when it gives one, so
   that consecutive runs of a lineage continue one optimization).

Only loss positions reach the LM head: the decoder's hidden states are gathered at those
positions before the vocabulary projection, which saves most of the head's time and memory
(prompts are usually most of a sequence). Models whose head does more than a projection
(logit soft-capping or scaling) take the plain full-logits path. And the prefix that every row of
a batch starts with (a group's prompt; at least the system prompt) goes through the decoder once,
its key/value cache shared by the rows (`shared_prefix_hidden`): rows are batched in token order
so that a group's answers share their micro-batches.

The same code runs on CUDA (bf16 weights, fp32 adapter and log-softmax) and on CPU (fp32).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import torch

from apprentice.settings import LearningSettings
from learner.grpo.adapters import TRAINABLE_ADAPTER, using_version
from learner.grpo.loss import Aggregation, LossOutput, aggregation_weights, grpo_loss, k3_kl, token_logprobs
from learner.grpo.tokens import Segment
from learner.models import cache_keyword


class NonFiniteLoss(RuntimeError):
    """The loss or the gradient became NaN or infinite: the run is aborted."""


@dataclass(frozen=True)
class TrainerConfig:
    """The knobs the trainer reads. Their defaults and meanings live in one place, LearningSettings:
    a config is always made from settings, so a default changed there is the trainer's default too."""

    lr: float
    weight_decay: float
    epochs: int
    max_steps: int | None
    micro_batch_size: int
    grad_accumulation: int
    max_grad_norm: float
    eps_low: float
    eps_high: float
    tis_cap: float
    kl_beta: float
    aggregation: Aggregation
    max_seq_len: int
    seed: int
    old_logprobs: Literal["recorded", "recompute"]

    @classmethod
    def from_settings(cls, learning: LearningSettings) -> TrainerConfig:
        return cls(**{knob.name: getattr(learning, knob.name) for knob in fields(cls)})


@dataclass
class TrainSample:
    """One rewarded trajectory, tokenized, with its group-relative advantage."""

    trajectory_id: str
    reward: float
    advantage: float
    segments: list[Segment]
    # Its answered calls (assistant turns): a run of k calls counts k answers toward a step's
    # micro_batch_size x grad_accumulation, as k single calls would (see GRPOTrainer._plan).
    answers: int = 1

    @property
    def loss_tokens(self) -> int:
        return sum(s.loss_tokens for s in self.segments)


@dataclass
class TrainResult:
    optimizer_steps: int = 0
    samples: int = 0
    loss: float = 0.0  # mean over optimizer steps
    kl: float = 0.0  # mean k3 per loss token, to `kl_reference`
    kl_reference: str = "start"  # "base" when kl_beta > 0, else the policy the run started from
    kl_to_start: float = 0.0  # mean k3 per loss token to the policy the run started from (the incumbent)
    clip_fraction: float = 0.0
    loss_tokens: int = 0  # per pass over the data
    tokens: int = 0  # per pass over the data, prompts included
    grad_norm: float = 0.0  # mean before clipping
    tis_mean: float = 1.0
    tis_capped_fraction: float = 0.0
    # Mean |trainer - sampler| logprob on tokens the starting version sampled (first step): a
    # large gap means the recorded logprobs are not the trainer's (e.g. vLLM's raw logprobs at T != 1).
    behaviour_gap: float | None = None
    duration_s: float = 0.0
    train_s: float = 0.0  # the optimizer steps alone (scoring passes excluded)
    tokens_per_s: float = 0.0  # tokens through forward+backward per second of train_s
    dropped: dict[str, int] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)

    def as_metrics(self) -> dict[str, Any]:
        """Every field, for the run's metrics JSON; the long per-step history last."""
        out = {k: v for k, v in self.__dict__.items() if k != "history"}
        out["history"] = self.history
        return out


@dataclass
class _Row:
    """One segment ready for the model: ids, loss positions and per-token reference logprobs."""

    sample: int
    ids: torch.Tensor
    positions: torch.Tensor  # indices into ids of loss tokens (all >= 1)
    temperature: float
    version: str | None
    recorded: torch.Tensor | None  # the sampler's logprobs at `positions`, if it returned them
    old: torch.Tensor | None = None
    behaviour: torch.Tensor | None = None
    ref: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return int(self.positions.numel())


def _row(sample: int, segment: Segment) -> _Row | None:
    positions = [i for i, on in enumerate(segment.loss_mask) if on and i > 0]
    if not positions:
        return None
    recorded = None
    if segment.behaviour_logprobs is not None:
        values = [segment.behaviour_logprobs[i] for i in positions]
        if all(math.isfinite(v) for v in values):
            recorded = torch.tensor(values, dtype=torch.float32)
    return _Row(
        sample,
        torch.tensor(segment.input_ids, dtype=torch.long),
        torch.tensor(positions, dtype=torch.long),
        max(segment.temperature, 1e-5),
        segment.version,
        recorded,
    )


def step_sizes(samples: Sequence[TrainSample], rows_by_sample: dict[int, list[_Row]]) -> dict[int, int]:
    """What each sample takes of an optimizer step: its answers (a run of two calls in one
    merged sequence is two answers, not one row), or its rows when it has more."""
    return {index: max(len(rows), samples[index].answers) for index, rows in rows_by_sample.items()}


def _group_by_sample(rows: Sequence[_Row]) -> dict[int, list[_Row]]:
    by_sample: dict[int, list[_Row]] = {}
    for row in rows:
        by_sample.setdefault(row.sample, []).append(row)
    return by_sample


def _batch_order(row: _Row) -> tuple[int, ...]:
    """Rows in token order: rows that start alike (a group's answers to one prompt) are neighbours and
    so share micro-batches, whose common prefix the decoder runs once (shared_prefix_hidden). That
    saves more than ordering by length did: a prompt is most of a row, padding at most an answer."""
    return tuple(row.ids.tolist())


def _chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class GRPOTrainer:
    """Trains the `default` adapter of a PeftModel in place; see the module docstring."""

    def __init__(
        self,
        model: Any,
        config: TrainerConfig,
        *,
        start_version: str | None = None,
        version_paths: dict[str, str] | None = None,
        fresh: bool = False,
        pad_token_id: int = 0,
        progress: bool = False,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        self.model = model
        self.config = config
        # Given by a long-lived learner (learner/jobs/policy_trainer.py), so that its moments and step
        # count carry over from run to run along the lineage; else a fresh AdamW per run.
        self.optimizer = optimizer
        self.start_version = start_version
        self.version_paths = dict(version_paths or {})
        self.fresh = fresh  # the adapter is new (B = 0): old == base, no separate reference pass
        self.pad_token_id = pad_token_id
        self.progress = progress
        self.device = next(p for p in model.parameters()).device
        base = model.get_base_model()
        head_does_more = ("final_logit_softcapping", "logit_scale")  # than a projection: take the full-logits path
        self._full_forward = any(getattr(base.config, name, None) for name in head_does_more)
        self._decoder = base.get_decoder()
        self._head = base.get_output_embeddings()

    # ------------------------------------------------------------------ the run

    def train(self, samples: Sequence[TrainSample]) -> TrainResult:
        """Prepares the rows, then runs the optimizer steps; no step at all when no sample can train."""
        started = time.perf_counter()
        result = TrainResult(kl_reference="base" if self.config.kl_beta > 0 else "start")
        rows = self.build_rows(samples, result.dropped)
        planned = _group_by_sample(rows)  # the steps are planned before `old` is filled (see _fill_old)
        steps = self._plan(sorted(planned), step_sizes(samples, planned))
        first_step = set(steps[0]) if steps and self.config.kl_beta == 0 else set()
        rows_by_sample = self._by_sample(self._fill_references(rows, result.dropped, first_step), result)
        steps = [kept for kept in ([s for s in step if s in rows_by_sample] for step in steps) if kept]
        if rows_by_sample:
            self._optimize(samples, rows_by_sample, steps, result)
        result.duration_s = time.perf_counter() - started
        return result

    def _optimize(
        self,
        samples: Sequence[TrainSample],
        rows_by_sample: dict[int, list[_Row]],
        steps: list[list[int]],
        result: TrainResult,
    ) -> None:
        """The training loop: each optimizer step accumulates its micro-batches' gradients, clips, steps."""
        params = self._trainable_parameters()
        optimizer = self.optimizer or torch.optim.AdamW(
            params, lr=self.config.lr, weight_decay=self.config.weight_decay
        )
        meter = _RunMeter()
        self.model.train()
        try:
            with self._progress_bar(len(steps)) as bar:
                for number, step_samples in enumerate(steps, start=1):
                    optimizer.zero_grad(set_to_none=True)
                    step_rows = [row for sample in step_samples for row in rows_by_sample[sample]]
                    step = self.backward_step(samples, step_rows, number, measure_gap=number == 1)
                    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm))
                    _require_finite("gradient norm", grad_norm, number)
                    optimizer.step()
                    _show_progress(bar, meter.record(number, step, grad_norm))
        finally:
            self.model.eval()
        meter.fill(result)

    def _by_sample(self, rows: Sequence[_Row], result: TrainResult) -> dict[int, list[_Row]]:
        """`rows` by sample index; the samples, loss tokens and tokens they cover go into `result`."""
        by_sample = _group_by_sample(rows)
        result.samples = len(by_sample)
        result.loss_tokens = sum(r.size for r in rows)
        result.tokens = sum(int(r.ids.numel()) for r in rows)
        return by_sample

    def _trainable_parameters(self) -> list[torch.nn.Parameter]:
        params = [p for p in self.model.parameters() if p.requires_grad]
        if not params:
            raise RuntimeError(f"the model has no trainable parameters (adapter {TRAINABLE_ADAPTER!r})")
        return params

    def _progress_bar(self, total: int) -> AbstractContextManager[Any]:
        if not self.progress:
            return nullcontext()
        from tqdm.auto import tqdm

        return tqdm(total=total, desc="GRPO steps", unit="step")

    # ------------------------------------------------------------------ 1. reference logprobs

    def prepare(self, samples: Sequence[TrainSample], dropped: dict[str, int]) -> list[_Row]:
        """Rows of every sample that can train, with their reference logprobs filled in."""
        return self._fill_references(self.build_rows(samples, dropped), dropped)

    def build_rows(self, samples: Sequence[TrainSample], dropped: dict[str, int]) -> list[_Row]:
        """Rows of every sample that can train (ids and loss positions; no model involved)."""
        rows: list[_Row] = []
        for index, sample in enumerate(samples):
            if any(len(s.input_ids) > self.config.max_seq_len for s in sample.segments):
                dropped["too_long"] = dropped.get("too_long", 0) + 1
                continue
            made = [r for r in (_row(index, s) for s in sample.segments) if r is not None]
            if not made:
                dropped["no_loss_tokens"] = dropped.get("no_loss_tokens", 0) + 1
                continue
            rows.extend(made)
        return rows

    def _fill_references(
        self, rows: list[_Row], dropped: dict[str, int], first_step: set[int] | None = None
    ) -> list[_Row]:
        """old, behaviour and ref logprobs for every row; rows whose sampler is unknown are dropped.
        `first_step`: the samples of the run's first optimizer step, whose `old` that step's own
        forward pass gives (see the module docstring) when their sampler's logprobs are recorded."""
        self.model.eval()
        self._fill_old(rows, first_step or set())
        kept = self._fill_behaviour(rows, dropped)
        if self.config.kl_beta > 0:
            self._fill_ref(kept)
        return kept

    def _fill_old(self, rows: list[_Row], first_step: set[int]) -> None:
        """The starting policy's logprobs.

        With `old_logprobs="recorded"`, rows the starting policy sampled itself take the sampler's
        logprobs as `old` (as TRL does with one iteration per batch): no scoring pass for them.
        The sampler/trainer gap is then measured during the first optimizer step instead. Rows of
        the first step's samples whose behaviour is recorded are left to that step (`_old_of`);
        a row without recorded logprobs may need `old` as its behaviour, so it is scored here.
        """
        trust_record = self.config.old_logprobs == "recorded"
        to_score: list[_Row] = []
        for row in rows:
            if trust_record and row.recorded is not None and self._on_policy(row):
                row.old = row.recorded
            elif row.sample in first_step and row.recorded is not None:
                continue  # the first step's forward pass gives it
            else:
                to_score.append(row)
        for row, old in zip(to_score, self._score(to_score), strict=True):
            row.old = old

    def _fill_behaviour(self, rows: list[_Row], dropped: dict[str, int]) -> list[_Row]:
        """The sampler's logprobs: recorded, else the starting policy's own (old), else scored with the
        saved version that served the call. Rows whose version is not available are dropped."""
        missing: dict[str | None, list[_Row]] = {}
        for row in rows:
            row.behaviour = row.recorded
            if row.behaviour is None and self._on_policy(row):
                row.behaviour = row.old
            elif row.behaviour is None:
                missing.setdefault(row.version, []).append(row)
        for version, group in missing.items():
            scores = self._score_with_version(version, group)
            if scores is None:
                dropped["behaviour_unavailable"] = dropped.get("behaviour_unavailable", 0) + len(group)
                continue
            for row, score in zip(group, scores, strict=True):
                row.behaviour = score
        return [r for r in rows if r.behaviour is not None]

    def _fill_ref(self, rows: list[_Row]) -> None:
        """The base model's logprobs (adapter off) for the KL penalty; a fresh adapter is the base model."""
        if self.fresh:
            for row in rows:
                row.ref = row.old
            return
        with self.model.disable_adapter():
            for row, ref in zip(rows, self._score(rows), strict=True):
                row.ref = ref

    def _on_policy(self, row: _Row) -> bool:
        """Sampled by the very policy this run starts from."""
        return row.version == self.start_version

    def _score_with_version(self, version: str | None, rows: Sequence[_Row]) -> list[torch.Tensor] | None:
        """Scores under the adapter version that sampled `rows` (None: the base model); None if it is gone."""
        if version is None:
            with self.model.disable_adapter():
                return self._score(rows)
        if version in self.version_paths:
            with using_version(self.model, f"behaviour-{version}", self.version_paths[version]):
                return self._score(rows)
        return None

    @torch.no_grad()
    def _score(self, rows: Sequence[_Row]) -> list[torch.Tensor]:
        """Each row's loss-token logprobs, in row order. Rows that start alike share a batch (their
        common prefix is run once, `_batch_order`); without gradients, a batch twice the training
        micro-batch fits."""
        ordered = sorted(range(len(rows)), key=lambda i: _batch_order(rows[i]))
        scores: dict[int, torch.Tensor] = {}
        for chunk in _chunks(ordered, max(1, 2 * self.config.micro_batch_size)):
            values = self._logprobs([rows[i] for i in chunk]).float().cpu()
            for i, part in zip(chunk, values.split([rows[i].size for i in chunk]), strict=True):
                scores[i] = part
        return [scores[i] for i in range(len(rows))]

    # ------------------------------------------------------------------ 2. samples -> optimizer steps

    def _plan(self, samples: Sequence[int], rows_per_sample: dict[int, int]) -> list[list[int]]:
        """Optimizer steps as lists of sample indices: shuffled per epoch, never splitting a sample.

        A step holds micro_batch_size x grad_accumulation of `rows_per_sample` (step_sizes: each
        sample's answers, or its rows when more), so the same answers make the same number of
        steps whether they came as single calls or as runs of several calls.
        """
        rng = random.Random(self.config.seed)
        per_step = self.config.micro_batch_size * self.config.grad_accumulation
        steps: list[list[int]] = []
        for _ in range(self.config.epochs):
            order = list(samples)
            rng.shuffle(order)
            current: list[int] = []
            size = 0
            for sample in order:
                if current and size + rows_per_sample[sample] > per_step:
                    steps.append(current)
                    current, size = [], 0
                current.append(sample)
                size += rows_per_sample[sample]
            if current:
                steps.append(current)
        if self.config.max_steps is not None:
            steps = steps[: self.config.max_steps]
        return steps

    # ------------------------------------------------------------------ 3. one step's micro-batches

    def backward_step(
        self, samples: Sequence[TrainSample], step_rows: Sequence[_Row], step_number: int = 0, measure_gap: bool = False
    ) -> StepSums:
        """Accumulate one optimizer step's gradient over micro-batches; returns the step's sums.

        The step's token weights are fixed first, from all its rows, so the accumulated gradient
        is the same however the rows are split into micro-batches.
        """
        ordered = sorted(step_rows, key=_batch_order)
        weight_of = self._sample_weights(ordered)
        sums = StepSums()
        for micro in _chunks(ordered, self.config.micro_batch_size):
            logp = self._logprobs(micro)
            old = self._old_of(micro, logp, step_number)
            out = self._loss(micro, logp, old, samples, weight_of)
            _require_finite("loss", out.loss.item(), step_number)
            out.loss.backward()
            sums.add_micro_batch(micro, logp.detach(), old, out, self.config.tis_cap)
            if measure_gap:  # before the first update the trainable policy is the starting one
                self._measure_gap(sums, micro, logp.detach())
        return sums

    def _old_of(self, micro: Sequence[_Row], logp: torch.Tensor, step_number: int) -> torch.Tensor:
        """The micro-batch's `old` logprobs. Rows left unscored by `_fill_old` are in the first
        step, before any update: the trainable policy is still the starting one, so this very
        forward pass is `old` (kept on the row for later epochs)."""
        if any(row.old is None for row in micro):
            if step_number > 1:
                raise ValueError("only the first optimizer step's rows may take `old` from their own forward pass")
            for row, part in zip(micro, logp.detach().float().cpu().split([r.size for r in micro]), strict=True):
                if row.old is None:
                    row.old = part
        return self._concat([r.old for r in micro])

    def _sample_weights(self, rows: Sequence[_Row]) -> dict[int, float]:
        """Each sample's per-token weight in this step (loss.aggregation_weights over the step's rows)."""
        per_sample: dict[int, int] = {}
        for row in rows:
            per_sample[row.sample] = per_sample.get(row.sample, 0) + row.size
        weights = aggregation_weights(list(per_sample.values()), self.config.aggregation)
        return dict(zip(per_sample, weights, strict=True))

    def _loss(
        self,
        micro: Sequence[_Row],
        logp: torch.Tensor,
        old: torch.Tensor,
        samples: Sequence[TrainSample],
        weight_of: dict[int, float],
    ) -> LossOutput:
        """The GRPO loss of one micro-batch: each token carries its sample's advantage and weight."""
        config = self.config
        advantages = self._per_token(micro, lambda r: samples[r.sample].advantage)
        weights = self._per_token(micro, lambda r: weight_of[r.sample])
        behaviour = self._concat([r.behaviour for r in micro])
        ref = self._concat([r.ref for r in micro]) if config.kl_beta > 0 else None
        return grpo_loss(
            logp,
            old,
            advantages,
            weights,
            eps_low=config.eps_low,
            eps_high=config.eps_high,
            behaviour_logp=behaviour,
            tis_cap=config.tis_cap,
            ref_logp=ref,
            kl_beta=config.kl_beta,
        )

    def _concat(self, per_row: Sequence[torch.Tensor | None]) -> torch.Tensor:
        """Per-row reference logprobs (filled in by `prepare`) as one flat vector on the model's device."""
        filled = [values for values in per_row if values is not None]
        if len(filled) != len(per_row):
            raise ValueError("a row has no reference logprobs: rows must come from prepare()")
        return torch.cat(filled).to(self.device)

    def _per_token(self, rows: Sequence[_Row], value_of: Callable[[_Row], float]) -> torch.Tensor:
        """One number per row, repeated over its loss tokens, as one flat vector on the model's device."""
        return torch.cat([torch.full((r.size,), value_of(r)) for r in rows]).to(self.device)

    def _measure_gap(self, sums: StepSums, micro: Sequence[_Row], logp: torch.Tensor) -> None:
        """|trainer - sampler| logprob on the tokens the starting policy sampled and recorded."""
        for row, part in zip(micro, logp.float().cpu().split([r.size for r in micro]), strict=True):
            if row.recorded is not None and self._on_policy(row):
                sums.gap += float((part - row.recorded).abs().sum())
                sums.gap_tokens += row.size

    # ------------------------------------------------------------------ the model

    def _batch(self, rows: Sequence[_Row]) -> torch.Tensor:
        """Right-padded input ids. No attention mask is needed: under causal attention a real token
        never sees the padding after it, and padded positions are never read. Leaving the mask out
        keeps attention on its fast causal path (a padding mask forces an explicit 4-D mask)."""
        length = max(int(r.ids.numel()) for r in rows)
        input_ids = torch.full((len(rows), length), self.pad_token_id, dtype=torch.long)
        for i, row in enumerate(rows):
            input_ids[i, : row.ids.numel()] = row.ids
        return input_ids.to(self.device)

    def _logprobs(self, rows: Sequence[_Row]) -> torch.Tensor:
        """Logprobs of every loss token of `rows`, flat, in row order, at each row's temperature."""
        input_ids = self._batch(rows)
        batch_index = torch.cat([torch.full((r.size,), i, dtype=torch.long) for i, r in enumerate(rows)])
        batch_index = batch_index.to(self.device)
        positions = torch.cat([r.positions for r in rows]).to(self.device)
        temperatures = torch.cat([torch.full((r.size,), r.temperature) for r in rows]).to(self.device)
        targets = input_ids[batch_index, positions]
        return token_logprobs(self._logits(input_ids, batch_index, positions), targets, temperatures)

    def _logits(self, input_ids: torch.Tensor, batch_index: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The logits that predict each loss token (at position - 1); a distributed trainer routes
        this through its DDP or FSDP wrapper (learner/distributed/wrapping.py)."""
        return loss_position_logits(
            self.model, self._decoder, self._head, self._full_forward, input_ids, batch_index, positions
        )


def loss_position_logits(
    model: Any,
    decoder: Any,
    head: Any,
    full_forward: bool,
    input_ids: torch.Tensor,
    batch_index: torch.Tensor,
    positions: torch.Tensor,
    share_prefix: bool = True,
) -> torch.Tensor:
    """Logits at the positions that predict loss tokens: the decoder's hidden states gathered there
    before the vocabulary projection (see the module docstring), or the full forward for heads that
    do more than project. A prefix every row starts with is run once (`shared_prefix_hidden`) unless
    `share_prefix` is False: FSDP2 frees a layer's gathered weights after each call of it, so a layer
    called twice in one forward has lost the first call's weights by the backward."""
    if full_forward:
        return model(input_ids=input_ids).logits[batch_index, positions - 1]
    if not share_prefix:
        return head(decoder(input_ids=input_ids).last_hidden_state[batch_index, positions - 1])
    hidden, offset = shared_prefix_hidden(decoder, input_ids, int(positions.min()) - 1)
    return head(hidden[batch_index, positions - 1 - offset])


# A prefix shorter than this is run with every row: one more pass would cost more than it saves.
MIN_SHARED_PREFIX = 8


def shared_prefix_length(input_ids: torch.Tensor, first_read: int) -> int:
    """How many leading tokens every row of `input_ids` has in common, up to `first_read`, the first
    position whose hidden state is read (the one that predicts the batch's earliest loss token)."""
    if input_ids.size(0) < 2:
        return 0
    differs = (input_ids != input_ids[:1]).any(dim=0).nonzero()
    common = int(differs[0]) if differs.numel() else int(input_ids.size(1))
    return max(0, min(common, first_read))


def shared_prefix_hidden(decoder: Any, input_ids: torch.Tensor, first_read: int) -> tuple[torch.Tensor, int]:
    """The decoder's hidden states from position `offset` on, with the rows' common prefix run once.

    The rows of a batch usually start alike: a group's answers share their whole prompt, and every
    row of a policy shares its system prompt. Prompts are most of a sequence, so the decoder runs
    the common prefix (positions < p, p = shared_prefix_length) for one row, copies its key/value
    cache to every row (`batch_repeat_interleave`) and runs only the rows' remainders against it:

        hidden[:, p:] = decoder(ids[:, p:], cache = repeat(decoder(ids[:1, :p]).cache, rows))

    Under causal attention the prefix's states do not depend on what follows them, so this is the
    full forward's hidden[:, p:] (to float rounding), and its gradient too: the backward of the
    repeat sums the rows' gradients into the one prefix pass, as the full forward's would. Positions
    below p are never read (p <= first_read). A LoRA dropout above 0 then draws one mask for the
    shared prefix instead of one a row: the same expected gradient. Returns (hidden, p); p = 0 (the
    plain forward) when the prefix is short or the model's cache cannot be repeated.
    """
    prefix = shared_prefix_length(input_ids, first_read)
    if prefix >= MIN_SHARED_PREFIX:
        head_pass = decoder(input_ids=input_ids[:1, :prefix], use_cache=True)
        cache = getattr(head_pass, "cache", None)
        if cache is None:  # transformers before 5.x named the output as the keyword
            cache = getattr(head_pass, "past_key_values", None)
        if cache is not None and hasattr(cache, "batch_repeat_interleave"):
            cache.batch_repeat_interleave(int(input_ids.size(0)))
            rest = decoder(input_ids=input_ids[:, prefix:], use_cache=True, **{cache_keyword(decoder.forward): cache})
            return rest.last_hidden_state, prefix
    return decoder(input_ids=input_ids).last_hidden_state, 0


# ---------------------------------------------------------------------- bookkeeping beside the training loop


@dataclass
class StepSums:
    """Sums over the loss tokens of one optimizer step (or of a whole run): means are taken at the end."""

    loss: float = 0.0  # micro-batch losses come weighted: their sum is the step's loss
    kl: float = 0.0  # k3 to TrainResult.kl_reference
    kl_start: float = 0.0  # k3 to the policy the run started from
    clipped: int = 0
    tokens: int = 0  # loss tokens
    tis: float = 0.0
    tis_capped: int = 0
    all_tokens: int = 0  # through forward+backward, prompts included
    gap: float = 0.0  # |trainer - sampler| logprob over gap_tokens; measured on the first step only
    gap_tokens: int = 0

    def add_micro_batch(
        self, micro: Sequence[_Row], logp: torch.Tensor, old: torch.Tensor, out: LossOutput, tis_cap: float
    ) -> None:
        """One micro-batch's loss-token statistics (`logp` detached, `old` its starting-policy logprobs)."""
        drift = k3_kl(logp, old)
        kl = out.kl if out.kl is not None else drift
        self.loss += out.loss.item()
        self.kl += float(kl.sum())
        self.kl_start += float(drift.sum())
        self.clipped += int(out.clipped.sum())
        self.tokens += int(logp.numel())
        self.tis += float(out.tis.sum())
        self.tis_capped += int((out.tis >= tis_cap).sum())
        self.all_tokens += sum(int(r.ids.numel()) for r in micro)

    def add(self, other: StepSums) -> None:
        """Adds another step's sums: a run's sums are its steps' sums."""
        for name in (f.name for f in fields(self)):
            setattr(self, name, getattr(self, name) + getattr(other, name))


class _RunMeter:
    """The bookkeeping beside the training loop: per-step history, the run's sums, the training clock."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.sums = StepSums()
        self.grad_norm = 0.0
        self.history: list[dict[str, float]] = []

    def record(self, number: int, step: StepSums, grad_norm: float) -> dict[str, float]:
        """Adds one optimizer step; returns its history entry (means over its loss tokens)."""
        tokens = max(step.tokens, 1)
        entry = {
            "step": number,
            "loss": step.loss,
            "kl": step.kl / tokens,
            "clip_fraction": step.clipped / tokens,
            "grad_norm": grad_norm,
            "tis_mean": step.tis / tokens,
            "tokens": step.tokens,
        }
        self.history.append(entry)
        self.sums.add(step)
        self.grad_norm += grad_norm
        return entry

    def fill(self, result: TrainResult) -> None:
        """The run's means into `result`: loss and gradient norm per step, the rest per loss token."""
        steps, sums = len(self.history), self.sums
        tokens = max(sums.tokens, 1)
        result.history = self.history
        result.optimizer_steps = steps
        result.loss = sums.loss / max(steps, 1)
        result.kl = sums.kl / tokens
        result.kl_to_start = sums.kl_start / tokens
        result.clip_fraction = sums.clipped / tokens
        result.grad_norm = self.grad_norm / max(steps, 1)
        result.tis_mean = sums.tis / tokens
        result.tis_capped_fraction = sums.tis_capped / tokens
        if sums.gap_tokens:
            result.behaviour_gap = sums.gap / sums.gap_tokens
        result.train_s = time.perf_counter() - self.started
        result.tokens_per_s = sums.all_tokens / result.train_s if result.train_s > 0 else 0.0


def _require_finite(what: str, value: float, step_number: int) -> None:
    """A NaN or infinite loss or gradient norm aborts the run: no candidate may come out of it."""
    if not math.isfinite(value):
        raise NonFiniteLoss(f"{what} is {value} at optimizer step {step_number}")


def _show_progress(bar: Any, entry: dict[str, float]) -> None:
    """The step's loss and clip fraction on the progress bar, when there is one."""
    if bar is not None:
        bar.set_postfix(loss=f"{entry['loss']:.4f}", clip=f"{entry['clip_fraction']:.3f}")
        bar.update(1)
