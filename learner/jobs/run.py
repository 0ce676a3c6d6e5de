"""One learner run for one policy: lock, select, group, tokenize, train, record a candidate.

A run continues the training lineage (apprentice.promotion.lineage): it trains from the lineage
head -- the newest candidate or canary above the promoted version, else the promoted version,
else the base model -- and its candidate records the head as parent_version_id. It trains only
on data the head or its ancestors at most `max_staleness` versions back sampled (selection.py).
The model, the lineage's LoRA and its optimizer live in a `PolicyTrainer` (policy_trainer.py) that a
long-lived learner keeps between runs; `run_once` without one makes a one-off trainer.

Safety, in the order things happen (the bookkeeping is training_runs.py's, shared with
distillation):
- One learner per policy at a time, across machines: a session-level PostgreSQL advisory lock
  keyed by the policy, held on the run's connection (`training_runs.with_policy_lock`). A run
  that cannot take it returns "busy" at once. The lock goes away with the connection, so a
  killed learner never leaves it held.
- A `training_runs` row is written (status running, kind "rl") and committed first: it is the
  record of the attempt even if the process dies. Holding the lock proves that any older
  "running" row of the policy belongs to a dead run; those are marked failed ("interrupted").
- Adapter files are written atomically under a temporary name (adapters.save_adapter).
- Then ONE transaction records the candidate through the lifecycle (`lifecycle.record_candidate`:
  the `adapter_versions` row, status candidate, and its `adapter_transitions` row, NULL ->
  candidate, actor "auto"), marks the trajectories it used (and the groups it set aside for
  carrying no signal) with `trained_in_run_id`, and finishes the run row
  (`training_runs.save_candidate`). Killed before that commit, nothing is marked and the next
  run retries the same data; the next run also deletes adapter directories that no version row
  refers to.
- A NaN or infinite loss (or gradient) aborts the run: status "aborted", no candidate,
  nothing marked.
- Whatever ends a run without its commit (a NaN, an error, a kill of the transaction), the
  trainer's LoRA weights and optimizer state are restored to those of before the run
  (PolicyTrainer.attempt), so the next run continues from exactly the head it names.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from apprentice.settings import PolicySettings, Settings
from learner.grpo.advantages import (
    AdvantageKind,
    family_advantages,
    family_variance,
    group_advantages,
    leave_one_out_baseline,
)
from learner.grpo.grouping import Group, Grouping, Member, family_key, make_groups
from learner.jobs import training_runs
from learner.jobs.policy_trainer import PolicyTrainer, training_threads
from learner.jobs.selection import Selection, select
from learner.jobs.training_runs import RunOutcome, adapters_dir, learner_database_url, with_policy_lock

if TYPE_CHECKING:  # imported by the functions that train: they pull in torch
    from apprentice.promotion.rows import AdapterVersion
    from learner.grpo.tokens import Segment
    from learner.grpo.trainer import TrainResult, TrainSample

log = logging.getLogger(__name__)


# ------------------------------------------------------------------ the run


def _grouping_metrics(grouping: Grouping, selection: Selection) -> dict[str, Any]:
    head = selection.lineage.head
    return {
        "groups": grouping.counts(),
        "skipped_trajectories": dict(selection.skipped),
        "stale_trajectories": selection.stale_counts,
        "candidates": len(selection.candidates),
        "waiting_unrewarded": len(selection.waiting),
        "from_version": head.name if head else None,
        "reward_source": selection.source,
        "reward_sources": _reward_sources(grouping, selection),
    }


def _reward_sources(grouping: Grouping, selection: Selection) -> dict[str, int]:
    """How many usable and pooled groups train on each reward (webhook or judge; never both in one group)."""
    counts = {"webhook": 0, "judge": 0}
    for group in grouping.usable + grouping.pooled:
        source = selection.group_sources.get(group.key)
        if source is not None:
            counts[source] += 1
    return counts


def _segments(
    group: Group, selection: Selection, tokenizer: Any, skipped: dict[str, int]
) -> list[tuple[Member, float, list[Segment]]]:
    """The group's rewarded members with their token segments; those that do not tokenize are
    counted in `skipped` (by error) and left out."""
    from learner.grpo.tokens import TokenizationError, trajectory_segments

    members: list[tuple[Member, float, list[Segment]]] = []
    for member in group.members:
        if member.reward is None:  # usable groups hold rewarded members only; a late change is skipped
            continue
        try:
            segments = trajectory_segments(tokenizer, selection.candidates[member.trajectory_id].calls)
        except TokenizationError as exc:
            key = type(exc).__name__
            skipped[key] = skipped.get(key, 0) + 1
            continue
        members.append((member, float(member.reward), segments))
    return members


def _samples(
    grouping: Grouping, selection: Selection, tokenizer: Any, advantage: AdvantageKind, min_group_size: int
) -> tuple[list[TrainSample], dict[str, int], list[str]]:
    """Tokenized samples with advantages: within each usable group (GRPO), and for the pooled
    groups' members against their family's baseline (advantages.family_advantages, one batch);
    how many trajectories would not tokenize or wait for their family (by reason); and the pooled
    members whose reward is exactly their baseline: no signal, consumed like equal-reward groups
    (they stay in the family's baseline), or they would be selected and trigger runs for ever."""
    from learner.grpo.trainer import TrainSample

    samples: list[TrainSample] = []
    skipped: dict[str, int] = {}
    for group in grouping.usable:
        members = _segments(group, selection, tokenizer, skipped)
        rewards = [reward for _, reward, _ in members]
        if len(members) < min_group_size or max(rewards) == min(rewards):
            continue  # what is left after tokenization carries no signal; retried next run
        advantages = group_advantages(rewards, advantage)
        for (member, reward, segments), adv in zip(members, advantages, strict=True):
            samples.append(TrainSample(member.trajectory_id, reward, adv, segments, member.answers))
    pooled: list[tuple[Member, float, list[Segment]]] = []
    baselines: list[float] = []
    variances: list[float] = []
    variance_by_family: dict[str, float] = {}  # one family's spread, worked out once per run
    for group in grouping.pooled:
        for member, reward, segments in _segments(group, selection, tokenizer, skipped):
            family = family_key(member)
            history = selection.family_rewards.get(family, [])
            baseline = leave_one_out_baseline(history, member.trajectory_id, min_group_size - 1)
            if baseline is None:  # the family has too few other rewards yet: kept for a later run
                skipped["family_too_small"] = skipped.get("family_too_small", 0) + 1
                continue
            pooled.append((member, reward, segments))
            baselines.append(baseline)
            if family not in variance_by_family:
                variance_by_family[family] = family_variance(history)
            variances.append(variance_by_family[family])
    advantages = family_advantages([reward for _, reward, _ in pooled], baselines, variances, advantage)
    no_signal: list[str] = []
    for (member, reward, segments), adv in zip(pooled, advantages, strict=True):
        if adv == 0.0:  # exactly its baseline: nothing to learn, nothing to spend a forward pass on
            no_signal.append(member.trajectory_id)
        else:
            samples.append(TrainSample(member.trajectory_id, reward, adv, segments, member.answers))
    return samples, skipped, no_signal


def run_once(
    settings: Settings,
    policy_name: str,
    *,
    trigger: str = "manual",
    progress: bool = False,
    database_url: str | None = None,
    trainer: PolicyTrainer | None = None,
    run_id: str | None = None,
) -> RunOutcome:
    """One learner run for `policy_name` (see the module docstring). Never raises for a failed run.

    `trainer`: the policy's long-lived trainer (the scheduler keeps one per policy); without one
    the run loads the model itself and its state is dropped at the end. A trainer with a
    `distributed` context is rank 0 of a torchrun group (learner/jobs/ranks.py). `run_id`: the
    id of the run's row, when the launcher that started this process chose it.
    """
    policy = settings.policy(policy_name)
    if policy is None:
        raise ValueError(f"no policy named {policy_name!r} in the configuration")
    if trainer is None:
        trainer = PolicyTrainer(policy)
    learning = policy.learning
    if not learning.enabled:
        return RunOutcome("disabled", policy.name)
    url = learner_database_url(settings, database_url)
    return with_policy_lock(
        url,
        policy.name,
        lambda connection: _locked_run(connection, settings, policy, trainer, trigger, progress, run_id),
    )


@dataclass
class RunContext:
    """What a locked run has gathered by the time it trains: its records, its data, where it writes."""

    connection: psycopg.Connection[Any]
    policy: PolicySettings
    trainer: PolicyTrainer
    run_id: str
    selection: Selection
    grouping: Grouping
    directory: Path  # the policy's adapters directory
    progress: bool
    started: float  # time.monotonic() when the run began
    metrics: dict[str, Any]  # training_runs.metrics, filled as the run goes
    # The trained LoRA weights gathered whole, when the model holds shards (FSDP); else None.
    adapter_state: dict[str, Any] | None = None
    # Pooled members exactly at their family's baseline (see _samples): consumed, never trained.
    no_signal: list[str] = field(default_factory=list)

    @property
    def head(self) -> AdapterVersion | None:
        """The version this run trains from (None: the base model)."""
        return self.selection.lineage.head

    @property
    def set_aside(self) -> list[str]:
        """Consumed by a run that trains (or skips) without training on them: trajectories of groups
        that carry no signal, and trajectories sampled outside the lineage's staleness bound."""
        set_aside = [m.trajectory_id for g in self.grouping.set_aside() for m in g.members]
        return set_aside + self.no_signal + list(self.selection.stale)

    @property
    def group_counts(self) -> dict[str, int]:
        return {"groups_equal_rewards": len(self.grouping.equal_rewards), "groups_greedy": len(self.grouping.greedy)}

    def skip(self, reason: str, columns: dict[str, Any]) -> RunOutcome:
        """Finish the run as skipped; the set-aside groups are consumed, nothing else is marked."""
        return training_runs.skip(
            self.connection,
            self.policy.name,
            self.run_id,
            reason,
            metrics=self.metrics,
            columns=columns,
            consumed=self.set_aside,
        )


def _locked_run(
    connection: psycopg.Connection[Any],
    settings: Settings,
    policy: PolicySettings,
    trainer: PolicyTrainer,
    trigger: str,
    progress: bool,
    run_id: str | None = None,
) -> RunOutcome:
    learning = policy.learning
    started = time.monotonic()
    config = {"policy": policy.name, "base_model": policy.base_model, "learning": learning.model_dump(mode="json")}
    run_id = training_runs.start(connection, policy, trigger, config, "rl", run_id)
    directory = adapters_dir(settings, policy)
    metrics: dict[str, Any] = {}
    try:
        training_runs.remove_orphan_adapters(connection, directory, policy.name)
        selection = select(connection, policy)
        grouping = make_groups(
            selection.members, learning.min_group_size, selection.now, selection.wait_s, selection.may_pool
        )
        metrics.update(_grouping_metrics(grouping, selection))
        run = RunContext(
            connection, policy, trainer, run_id, selection, grouping, directory, progress, started, metrics
        )
        if grouping.greedy:
            log.warning(
                "policy %s: %d groups were sampled greedily (temperature 0 or identical answers) and "
                "taught nothing; set the policy's temperature",
                policy.name,
                len(grouping.greedy),
            )
        if not grouping.trainable:
            return run.skip("no group with a learning signal", {**run.group_counts, "groups": 0, "trajectories": 0})
        return _train_and_record(run)
    except BaseException as exc:
        return training_runs.fail(connection, "learner run", policy.name, run_id, exc, metrics)


def _train_and_record(run: RunContext) -> RunOutcome:
    """Train the lineage's LoRA on the usable groups, from the head, then record a candidate."""
    import torch

    learning = run.policy.learning
    trainer = run.trainer
    torch.set_num_threads(training_threads(learning))
    loads = (trainer.base_loads, trainer.adapter_loads)
    samples, skipped, run.no_signal = _samples(
        run.grouping, run.selection, trainer.load_base(), learning.advantage, learning.min_group_size
    )
    run.metrics["tokenization_skipped"] = skipped
    head = run.head
    start = trainer.start_from(head)
    run.metrics.update(
        {
            "device": str(next(trainer.model.parameters()).device),
            "dtype": str(next(trainer.base.parameters()).dtype).replace("torch.", ""),
            "start": start,
            "threads": torch.get_num_threads(),
            "base_model_loaded": trainer.base_loads > loads[0],
            "adapter_loaded": trainer.adapter_loads > loads[1],
        }
    )
    if trainer.distributed is not None:
        run.metrics["device"] = str(trainer.distributed.device(learning.device))
        run.metrics["ranks"] = trainer.distributed.world_size
        run.metrics["distributed"] = trainer.distributed.strategy
    with trainer.attempt():
        torch.manual_seed(learning.seed)
        result = _train(run, samples, head, fresh=head is None)
        # Under FSDP the steps were taken by an optimizer over the shards, made fresh for this run
        # (learner/distributed/grpo.py): the lineage's optimizer took none of them.
        fsdp = trainer.distributed is not None and trainer.distributed.strategy == "fsdp"
        run.metrics["optimizer_steps_total"] = result.optimizer_steps if fsdp else trainer.optimizer_steps()
        trained_ids = [sample.trajectory_id for sample in samples] if result.optimizer_steps else []
        columns = _result_columns(run, samples, trained_ids, result, head)
        if result.optimizer_steps == 0:
            return run.skip("no trainable sample", columns)
        saved = training_runs.Trained(
            run.connection,
            run.policy,
            trainer,
            run.run_id,
            run.directory,
            head,
            consumed=trained_ids + run.set_aside,
            columns=columns,
            metrics=run.metrics,
            started=run.started,
            adapter_state=run.adapter_state,
        )
        return training_runs.save_candidate(saved, "learner run")


def _train(run: RunContext, samples: list[TrainSample], head: AdapterVersion | None, *, fresh: bool) -> TrainResult:
    from learner.grpo.trainer import GRPOTrainer, TrainerConfig

    distributed = run.trainer.distributed
    if distributed is not None:
        return _train_distributed(run, samples, head, fresh=fresh)
    trainer = GRPOTrainer(
        run.trainer.model,
        TrainerConfig.from_settings(run.policy.learning),
        start_version=str(head.id) if head else None,
        version_paths=run.selection.version_paths(),
        fresh=fresh,
        pad_token_id=run.trainer.tokenizer.pad_token_id or 0,
        progress=run.progress,
        optimizer=run.trainer.optimizer,
    )
    result = trainer.train(samples)
    _record_train_metrics(run, result)
    return result


def _train_distributed(
    run: RunContext, samples: list[TrainSample], head: AdapterVersion | None, *, fresh: bool
) -> TrainResult:
    """Rank 0 of a torchrun group: hand the other ranks the job, train its own share with them."""
    from learner.distributed.grpo import DistributedGRPOTrainer
    from learner.grpo.trainer import NonFiniteLoss, TrainerConfig
    from learner.jobs.ranks import TrainingJob, send_training, training_returned

    distributed = run.trainer.distributed
    assert distributed is not None
    version_paths = run.selection.version_paths()
    send_training(distributed, TrainingJob("rl", head, samples=samples, version_paths=version_paths))
    trainer = DistributedGRPOTrainer(
        run.trainer.model,
        TrainerConfig.from_settings(run.policy.learning),
        distributed=distributed,
        start_version=str(head.id) if head else None,
        version_paths=version_paths,
        fresh=fresh,
        pad_token_id=run.trainer.tokenizer.pad_token_id or 0,
        progress=run.progress,
        optimizer=run.trainer.optimizer,
    )
    try:
        result = trainer.train(samples)
    except NonFiniteLoss:  # every rank raised it at the same step: they wait for a message again
        training_returned(distributed)
        raise
    training_returned(distributed)
    run.adapter_state = trainer.adapter_state
    _record_train_metrics(run, result)
    return result


def _record_train_metrics(run: RunContext, result: TrainResult) -> None:
    run.metrics["train"] = result.as_metrics()
    # read by the promotion gates (apprentice.promotion.gates.kl_of): drift from the version this
    # run started from, the lineage head (its parent)
    run.metrics["kl_to_incumbent"] = result.kl_to_start


def _result_columns(
    run: RunContext,
    samples: list[TrainSample],
    trained_ids: list[str],
    result: TrainResult,
    head: AdapterVersion | None,
) -> dict[str, Any]:
    """The training_runs columns a run that trained fills in (besides status, metrics and timing)."""
    rewards = [s.reward for s in samples]
    return {
        **run.group_counts,
        "groups": len(run.grouping.usable) + len(run.grouping.pooled),
        "trajectories": len(trained_ids),
        "samples": result.samples,
        "tokens": result.loss_tokens,
        "loss": result.loss,
        "kl": result.kl,
        "clip_fraction": result.clip_fraction,
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        # the signed mean of group-relative advantages is 0 by construction; the mean size says more
        "mean_advantage": sum(abs(s.advantage) for s in samples) / len(samples) if samples else None,
        "from_version_id": str(head.id) if head else None,
    }
