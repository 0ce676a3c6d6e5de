"""One training run: GRPO updates of a LoRA adapter over a fixed list of samples.

The run, in order:
1. Reference logprobs for every loss token, without gradients: "behaviour" (the sampler's:
   recorded when the server returned them, else recomputed with the saved weights of the
   version that served the call), "old" (the policy this run starts from: the promoted
   adapter, or a fresh LoRA, which equals the base model; taken from the record for data that
   policy sampled itself unless old_logprobs="recompute", scored otherwise) and "ref" (the
   base model, only when kl_beta > 0).
2. Split the samples into optimizer steps (whole trajectories; shuffled, seeded). A step's
   token weights are fixed before its first micro-batch (see loss.aggregation_weights), so
   micro-batches plus gradient accumulation compute exactly the full step's gradient while
   memory stays bounded by one micro-batch.
3. Each micro-batch: forward, GRPO loss, backward. A NaN or infinite loss or gradient norm
   aborts the whole run (NonFiniteLoss): no candidate may come out of it.
4. Per step: clip the gradient norm, AdamW step.

Only loss positions reach the LM head: the decoder's hidden states are gathered at those
positions before the vocabulary projection, which saves most of the head's time and memory
(prompts are usually most of a sequence). Models whose head does more than a projection
(logit soft-capping or scaling) take the plain full-logits path.

The same code runs on CUDA (bf16 weights, fp32 adapter and log-softmax) and on CPU (fp32).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from learner.grpo.adapters import TRAINABLE_ADAPTER, using_version
from learner.grpo.loss import aggregation_weights, grpo_loss, k3_kl, token_logprobs
from learner.grpo.tokens import Segment


class NonFiniteLoss(RuntimeError):
    """The loss or the gradient became NaN or infinite: the run is aborted."""


@dataclass
class TrainerConfig:
    lr: float = 2e-5
    weight_decay: float = 0.0
    epochs: int = 1
    max_steps: int | None = None
    micro_batch_size: int = 4
    grad_accumulation: int = 8
    max_grad_norm: float = 1.0
    eps_low: float = 0.2
    eps_high: float = 0.28
    tis_cap: float = 2.0
    kl_beta: float = 0.0
    aggregation: str = "token"
    max_seq_len: int = 4096
    seed: int = 0
    old_logprobs: str = "recorded"  # or "recompute": score every row under the starting policy

    @classmethod
    def from_settings(cls, learning: Any) -> "TrainerConfig":
        """From apprentice.settings.LearningSettings (or anything with the same attributes)."""
        return cls(**{name: getattr(learning, name) for name in cls.__dataclass_fields__})


@dataclass
class TrainSample:
    """One rewarded trajectory, tokenized, with its group-relative advantage."""

    trajectory_id: str
    reward: float
    advantage: float
    segments: list[Segment]

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
    return _Row(sample, torch.tensor(segment.input_ids, dtype=torch.long), torch.tensor(positions, dtype=torch.long),
                max(segment.temperature, 1e-5), segment.version, recorded)


def _chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


class GRPOTrainer:
    """Trains the `default` adapter of a PeftModel in place; see the module docstring."""

    def __init__(self, model: Any, config: TrainerConfig, *, start_version: str | None = None,
                 version_paths: dict[str, str] | None = None, fresh: bool = False, pad_token_id: int = 0,
                 progress: bool = False, on_step: Callable[[dict[str, float]], None] | None = None) -> None:
        self.model = model
        self.config = config
        self.start_version = start_version
        self.version_paths = dict(version_paths or {})
        self.fresh = fresh  # the adapter is new (B = 0): old == base, no separate reference pass
        self.pad_token_id = pad_token_id
        self.progress = progress
        self.on_step = on_step
        self.device = next(p for p in model.parameters()).device
        base = model.get_base_model()
        self._full_forward = any(getattr(base.config, name, None) for name in ("final_logit_softcapping", "logit_scale"))
        self._decoder = base.get_decoder()
        self._head = base.get_output_embeddings()

    # ------------------------------------------------------------------ scoring

    def _batch(self, rows: Sequence[_Row]) -> torch.Tensor:
        """Right-padded input ids. No attention mask is needed: under causal attention a real token
        never sees the padding after it, and padded positions are never read. Leaving the mask out
        keeps attention on its fast causal path (a padding mask forces an explicit 4-D mask)."""
        length = max(int(r.ids.numel()) for r in rows)
        input_ids = torch.full((len(rows), length), self.pad_token_id, dtype=torch.long)
        for i, row in enumerate(rows):
            input_ids[i, :row.ids.numel()] = row.ids
        return input_ids.to(self.device)

    def _logprobs(self, rows: Sequence[_Row]) -> torch.Tensor:
        """Logprobs of every loss token of `rows`, flat, in row order, at each row's temperature."""
        input_ids = self._batch(rows)
        batch_index = torch.cat([torch.full((r.size,), i, dtype=torch.long) for i, r in enumerate(rows)]).to(self.device)
        positions = torch.cat([r.positions for r in rows]).to(self.device)
        temperatures = torch.cat([torch.full((r.size,), r.temperature) for r in rows]).to(self.device)
        targets = input_ids[batch_index, positions]
        if self._full_forward:
            logits = self.model(input_ids=input_ids).logits[batch_index, positions - 1]
        else:
            hidden = self._decoder(input_ids=input_ids).last_hidden_state
            logits = self._head(hidden[batch_index, positions - 1])
        return token_logprobs(logits, targets, temperatures)

    @torch.no_grad()
    def _score(self, rows: Sequence[_Row]) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        ordered = sorted(range(len(rows)), key=lambda i: rows[i].ids.numel())
        results: dict[int, torch.Tensor] = {}
        for chunk in _chunks(ordered, max(1, 2 * self.config.micro_batch_size)):
            values = self._logprobs([rows[i] for i in chunk]).float().cpu()
            for i, part in zip(chunk, values.split([rows[i].size for i in chunk])):
                results[i] = part
        for i in range(len(rows)):
            out.append(results[i])
        return out

    def _on_policy(self, row: _Row) -> bool:
        """Sampled by the very policy this run starts from."""
        return row.version == self.start_version

    def _fill_references(self, rows: list[_Row], dropped: dict[str, int]) -> list[_Row]:
        """old, behaviour and ref logprobs for every row; rows whose sampler is unknown are dropped.

        With `old_logprobs="recorded"`, rows the starting policy sampled itself take the sampler's
        logprobs as `old` (as TRL does with one iteration per batch): no scoring pass for them.
        The sampler/trainer gap is then measured during the first optimizer step instead.
        """
        self.model.eval()
        for row in rows:
            row.behaviour = row.recorded
        trust_record = self.config.old_logprobs == "recorded"
        to_score = [r for r in rows if not (trust_record and r.recorded is not None and self._on_policy(r))]
        scored = {id(r) for r in to_score}
        for row in rows:
            if id(row) not in scored:
                row.old = row.recorded
        for row, old in zip(to_score, self._score(to_score) if to_score else []):
            row.old = old
        missing: dict[str | None, list[_Row]] = {}
        for row in rows:
            if row.behaviour is not None:
                continue
            if self._on_policy(row):
                row.behaviour = row.old
            else:
                missing.setdefault(row.version, []).append(row)
        for version, group in missing.items():
            if version is None:
                with self.model.disable_adapter():
                    scores = self._score(group)
            elif version in self.version_paths:
                with using_version(self.model, f"behaviour-{version}", self.version_paths[version]):
                    scores = self._score(group)
            else:
                dropped["behaviour_unavailable"] = dropped.get("behaviour_unavailable", 0) + len(group)
                continue
            for row, score in zip(group, scores):
                row.behaviour = score
        kept = [r for r in rows if r.behaviour is not None]
        if self.config.kl_beta > 0:
            if self.fresh:
                for row in kept:
                    row.ref = row.old
            else:
                with self.model.disable_adapter():
                    for row, ref in zip(kept, self._score(kept)):
                        row.ref = ref
        return kept

    # ------------------------------------------------------------------ training

    def _plan(self, samples: Sequence[int], rows_per_sample: dict[int, int]) -> list[list[int]]:
        """Optimizer steps as lists of sample indices: shuffled per epoch, never splitting a sample."""
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
            steps = steps[:self.config.max_steps]
        return steps

    def backward_step(self, samples: Sequence[TrainSample], step_rows: Sequence[_Row], step_number: int = 0,
                      measure_gap: bool = False) -> dict[str, Any]:
        """Accumulate one optimizer step's gradient over micro-batches; returns the step's sums.

        The step's token weights are fixed first, from all its rows, so the accumulated gradient
        is the same however the rows are split into micro-batches.
        """
        config = self.config
        ordered = sorted(step_rows, key=lambda r: r.ids.numel())  # similar lengths share a batch: less padding
        per_sample: dict[int, int] = {}
        for row in ordered:
            per_sample[row.sample] = per_sample.get(row.sample, 0) + row.size
        weight_of = dict(zip(per_sample, aggregation_weights(list(per_sample.values()), config.aggregation)))  # type: ignore[arg-type]
        step: dict[str, Any] = {"loss": 0.0, "kl": 0.0, "kl_start": 0.0, "clipped": 0, "tokens": 0, "tis": 0.0,
                                "tis_capped": 0, "all_tokens": 0, "gap": 0.0, "gap_tokens": 0}
        for micro in _chunks(ordered, config.micro_batch_size):
            logp = self._logprobs(micro)
            cat = lambda values: torch.cat(values).to(self.device)  # noqa: E731
            old = cat([r.old for r in micro])
            behaviour = cat([r.behaviour for r in micro])
            ref = cat([r.ref for r in micro]) if config.kl_beta > 0 else None
            advantages = cat([torch.full((r.size,), samples[r.sample].advantage) for r in micro])
            weights = cat([torch.full((r.size,), weight_of[r.sample]) for r in micro])
            out = grpo_loss(logp, old, advantages, weights, eps_low=config.eps_low, eps_high=config.eps_high,
                            behaviour_logp=behaviour, tis_cap=config.tis_cap, ref_logp=ref, kl_beta=config.kl_beta)
            if not torch.isfinite(out.loss):
                raise NonFiniteLoss(f"loss is {out.loss.item()} at optimizer step {step_number}")
            out.loss.backward()
            if measure_gap:  # before the first update the trainable policy is the starting one
                for row, part in zip(micro, logp.detach().float().cpu().split([r.size for r in micro])):
                    if row.recorded is not None and self._on_policy(row):
                        step["gap"] += float((part - row.recorded).abs().sum())
                        step["gap_tokens"] += row.size
            drift = k3_kl(logp.detach(), old)
            kl = out.kl if out.kl is not None else drift
            step["loss"] += out.loss.item()
            step["kl"] += float(kl.sum())
            step["kl_start"] += float(drift.sum())
            step["clipped"] += int(out.clipped.sum())
            step["tokens"] += int(logp.numel())
            step["tis"] += float(out.tis.sum())
            step["tis_capped"] += int((out.tis >= config.tis_cap).sum())
            step["all_tokens"] += sum(int(r.ids.numel()) for r in micro)
        return step

    def prepare(self, samples: Sequence[TrainSample], dropped: dict[str, int]) -> list[_Row]:
        """Rows of every sample that can train, with their reference logprobs filled in."""
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
        return self._fill_references(rows, dropped)

    def train(self, samples: Sequence[TrainSample]) -> TrainResult:
        started = time.perf_counter()
        config = self.config
        result = TrainResult(kl_reference="base" if config.kl_beta > 0 else "start")
        dropped: dict[str, int] = {}
        rows = self.prepare(samples, dropped)
        by_sample: dict[int, list[_Row]] = {}
        for row in rows:
            by_sample.setdefault(row.sample, []).append(row)
        result.samples = len(by_sample)
        result.dropped = dropped
        result.loss_tokens = sum(r.size for r in rows)
        result.tokens = sum(int(r.ids.numel()) for r in rows)
        if not by_sample:
            result.duration_s = time.perf_counter() - started
            return result

        params = [p for p in self.model.parameters() if p.requires_grad]
        if not params:
            raise RuntimeError(f"the model has no trainable parameters (adapter {TRAINABLE_ADAPTER!r})")
        optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
        steps = self._plan(sorted(by_sample), {k: len(v) for k, v in by_sample.items()})
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(steps), desc="GRPO steps", unit="step")
        self.model.train()
        train_started = time.perf_counter()
        trained_tokens = 0
        totals = {"loss": 0.0, "kl": 0.0, "kl_start": 0.0, "clipped": 0, "tokens": 0, "grad_norm": 0.0,
                  "tis": 0.0, "tis_capped": 0}
        try:
            for step_number, step_samples in enumerate(steps, start=1):
                optimizer.zero_grad(set_to_none=True)
                step = self.backward_step(samples, [r for s in step_samples for r in by_sample[s]], step_number,
                                          measure_gap=step_number == 1)
                trained_tokens += step.pop("all_tokens")
                if step_number == 1 and step["gap_tokens"]:
                    result.behaviour_gap = step["gap"] / step["gap_tokens"]
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm))
                if not math.isfinite(grad_norm):
                    raise NonFiniteLoss(f"gradient norm is {grad_norm} at optimizer step {step_number}")
                optimizer.step()
                tokens = max(step["tokens"], 1)
                record = {"step": step_number, "loss": step["loss"], "kl": step["kl"] / tokens,
                          "clip_fraction": step["clipped"] / tokens, "grad_norm": grad_norm,
                          "tis_mean": step["tis"] / tokens, "tokens": step["tokens"]}
                result.history.append(record)
                for key in ("loss", "kl", "kl_start", "clipped", "tokens", "tis", "tis_capped"):
                    totals[key] += step[key]
                totals["grad_norm"] += grad_norm
                if self.on_step is not None:
                    self.on_step(record)
                if bar is not None:
                    bar.set_postfix(loss=f"{record['loss']:.4f}", clip=f"{record['clip_fraction']:.3f}")
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
            self.model.eval()
        n_steps = len(result.history)
        tokens = max(totals["tokens"], 1)
        result.optimizer_steps = n_steps
        result.loss = totals["loss"] / max(n_steps, 1)
        result.kl = totals["kl"] / tokens
        result.kl_to_start = totals["kl_start"] / tokens
        result.clip_fraction = totals["clipped"] / tokens
        result.grad_norm = totals["grad_norm"] / max(n_steps, 1)
        result.tis_mean = totals["tis"] / tokens
        result.tis_capped_fraction = totals["tis_capped"] / tokens
        result.train_s = time.perf_counter() - train_started
        result.tokens_per_s = trained_tokens / result.train_s if result.train_s > 0 else 0.0
        result.duration_s = time.perf_counter() - started
        return result
