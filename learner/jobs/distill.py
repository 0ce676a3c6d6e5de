"""A distillation run: the teacher's best rewarded answers -> the policy's LoRA by SFT -> a candidate.

While a policy names a teacher (`PolicySettings.teacher`) and has no promoted version, the
gateway sends its traffic to the teacher, and those calls and their rewards are recorded under
the policy like any other. A distillation run (kind "sft") reads them back:

1. Selection: the policy's rewarded, untrained trajectories whose every answered call was
   served by the teacher's deployment (`calls.upstream` = the teacher's model_name, no adapter
   version), with the reward the policy trains on (`RewardPlan`: webhook, judge, or per group
   one of them, exactly as an RL run reads it). Of those, `distill.min_reward` keeps the ones at
   or above a threshold and `distill.top_share` the best share of each group (above the
   group's lowest reward); see `choose`.
2. Rendering: each chosen trajectory's calls through the policy's own chat template
   (learner/grpo/tokens.py, the template path: a hosted teacher returns no token ids of our
   model); the loss mask covers the assistant turns only, tool calls included.
3. Training: cross-entropy on those tokens (learner/sft/trainer.py), starting from the lineage
   head, with the lineage's optimizer (PolicyTrainer): SFT and RL runs extend one lineage.
4. Record: the same as an RL run, by the same code (training_runs.py): the adapter saved
   atomically, then one transaction records the candidate (parent: the head), marks the
   trajectories it trained on with the run's id, and finishes the `training_runs` row (kind
   "sft", metrics["distill"]: the teacher, the selection and its counts). The candidate then
   meets the same gates, canary and records as any version; its canary is compared with the
   teacher (apprentice/promotion/takeover.py).

Same safety as run.py: the policy's advisory lock (one learner per policy, RL or SFT), a run
row committed first, a NaN loss aborts, and the trainer's state is restored unless the commit
happened (PolicyTrainer.attempt).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

from apprentice.promotion.lineage import lineage_head, promoted_version
from apprentice.settings import DistillationSettings, PolicySettings, Settings
from learner.grpo.grouping import group_key
from learner.jobs import training_runs
from learner.jobs.policy_trainer import PolicyTrainer, training_threads
from learner.jobs.selection import (
    REWARDED,
    Candidate,
    RewardPlan,
    Selection,
    assign_rewards,
    build_candidate,
    load_versions,
    without_jit,
)
from learner.jobs.training_runs import RunOutcome, adapters_dir, learner_database_url, with_policy_lock

log = logging.getLogger(__name__)

# Calls rows with the deployment that answered (selection's own query leaves it out). Bounded
# by the trajectories' oldest first call like selection's _CALLS, so that PostgreSQL reads only
# the partitions since then (calls is partitioned by created_at, docs/history.md).
_TEACHER_CALLS = """
SELECT c.trajectory_id::text AS trajectory_id, c.status_code, c.upstream, c.upstream_model,
       c.adapter_version_id::text AS version, c.temperature, c.request, c.response
FROM calls c WHERE c.trajectory_id = ANY(%(ids)s::uuid[])
  AND c.created_at >= (SELECT min(t.first_call_at) - interval '1 day' FROM trajectories t
                       WHERE t.id = ANY(%(ids)s::uuid[]))
ORDER BY c.trajectory_id, c.created_at, c.id
"""

# build_candidate checks that every call was served by "the base model"; teacher calls are
# renamed to this before, so that the check reads "served by the teacher".
_TEACHER = "\0teacher"


@dataclass
class TeacherData:
    """The teacher's rewarded trajectories of one policy and which of them a run trains on."""

    selection: Selection
    chosen: list[Candidate] = field(default_factory=list)
    not_teacher: int = 0  # rewarded trajectories some other model (or the policy) answered
    below: int = 0  # teacher trajectories the selection rule left out

    def metrics(self, teacher: str, distill: DistillationSettings) -> dict[str, Any]:
        rewards = [float(c.member.reward) for c in self.chosen if c.member.reward is not None]
        return {
            "teacher": teacher,
            "min_reward": distill.min_reward,
            "top_share": distill.top_share,
            "reward_source": self.selection.source,
            "teacher_trajectories": len(self.selection.candidates),
            "chosen": len(self.chosen),
            "left_out": self.below,
            "not_teacher": self.not_teacher,
            "skipped": dict(self.selection.skipped),
            "chosen_mean_reward": sum(rewards) / len(rewards) if rewards else None,
        }


def choose(candidates: list[Candidate], distill: DistillationSettings) -> list[Candidate]:
    """The teacher trajectories to learn from (each candidate's `member.reward` is set).

    `min_reward`: reward >= the threshold. `top_share`: within each group (grpo.grouping's key:
    the client's group id, else the task), the best ceil(share x n) by reward (ties with the last
    one kept are kept), and only those above the group's lowest reward: a group whose answers all
    scored the same tells nothing about which answer to imitate. Both set: both must hold.
    """
    keep = {id(c) for c in candidates}
    if distill.min_reward is not None:
        threshold = distill.min_reward
        keep &= {id(c) for c in candidates if c.member.reward is not None and c.member.reward >= threshold}
    if distill.top_share is not None:
        groups: dict[str, list[Candidate]] = {}
        for candidate in candidates:
            groups.setdefault(group_key(candidate.member), []).append(candidate)
        best: set[int] = set()
        for members in groups.values():
            ranked = sorted(members, key=lambda c: float(c.member.reward or 0.0), reverse=True)
            lowest = float(ranked[-1].member.reward or 0.0)
            cutoff = float(ranked[max(0, math.ceil(distill.top_share * len(ranked)) - 1)].member.reward or 0.0)
            best |= {id(c) for c in ranked if float(c.member.reward or 0.0) >= cutoff and c.member.reward != lowest}
        keep &= best
    return [c for c in candidates if id(c) in keep]


def select_teacher_data(connection: psycopg.Connection[Any], policy: PolicySettings) -> TeacherData:
    """Read the policy's rewarded teacher trajectories and choose the ones to learn from."""
    teacher = policy.teacher
    if teacher is None:
        raise ValueError(f"policy {policy.name!r} names no teacher")
    plan = RewardPlan.of(policy)
    learning = policy.learning
    with connection.transaction(), connection.cursor(row_factory=dict_row) as cursor:
        without_jit(cursor)  # a plan over every partition is costed high enough to JIT-compile
        cursor.execute("SELECT extract(epoch FROM now())::float8 AS now")
        clock = cursor.fetchone()
        assert clock is not None
        selection = Selection(now=clock["now"], source=plan.source, wait_s=plan.wait_s)
        params = {**plan.params(), "policy": policy.name, "max_age_s": learning.max_age_s}
        cursor.execute(REWARDED, {**params, "limit": learning.max_trajectories})
        trajectories = cursor.fetchall()
        cursor.execute(_TEACHER_CALLS, {"ids": [t["id"] for t in trajectories]})
        calls: dict[str, list[dict[str, Any]]] = {}
        for row in cursor.fetchall():
            calls.setdefault(row["trajectory_id"], []).append(row)
    data = TeacherData(selection)
    for trajectory in trajectories:
        rows = calls.get(trajectory["id"], [])
        answered = [r for r in rows if r["status_code"] == 200 and r["response"]]
        if not answered or any(r["upstream"] != teacher.model or r["version"] for r in answered):
            data.not_teacher += 1
            continue
        renamed = [{**r, "upstream_model": _TEACHER} for r in answered]
        candidate, reason = build_candidate(trajectory, renamed, _TEACHER, {})
        if candidate is None:
            selection.skip(reason or "unknown")
        else:
            selection.candidates[trajectory["id"]] = candidate
    assign_rewards(selection)
    candidates = list(selection.candidates.values())
    data.chosen = choose(candidates, teacher.distill)
    data.below = len(candidates) - len(data.chosen)
    return data


def behind_teacher(connection: psycopg.Connection[Any], policy: PolicySettings) -> bool:
    """The policy names a teacher and none of its versions is promoted: the teacher serves it."""
    return policy.teacher is not None and promoted_version(load_versions(connection, policy.name)) is None


def behind_teacher_now(policy: PolicySettings | None, database_url: str) -> bool:
    """`behind_teacher` over a connection of its own: whether the policy's next run is a distillation
    (what the one-run command and the scheduler ask before each run)."""
    if policy is None or policy.teacher is None:
        return False
    with psycopg.connect(database_url, autocommit=True) as connection:
        return behind_teacher(connection, policy)


def count_teacher_trajectories(connection: psycopg.Connection[Any], policy: PolicySettings) -> int:
    """How many teacher trajectories a distillation run would train on now (for the trigger)."""
    return len(select_teacher_data(connection, policy).chosen)


def run_distillation(
    settings: Settings,
    policy_name: str,
    *,
    trigger: str = "manual",
    database_url: str | None = None,
    trainer: PolicyTrainer | None = None,
    run_id: str | None = None,
) -> RunOutcome:
    """One distillation run for `policy_name` (see the module docstring). Never raises for a failed run.
    `run_id`: the id of the run's row, when the launcher that started this process chose it."""
    policy = settings.policy(policy_name)
    if policy is None:
        raise ValueError(f"no policy named {policy_name!r} in the configuration")
    if policy.teacher is None:
        raise ValueError(f"policy {policy_name!r} names no teacher to distil from")
    if not policy.learning.enabled:
        return RunOutcome("disabled", policy.name)
    trainer = trainer or PolicyTrainer(policy)
    url = learner_database_url(settings, database_url)
    return with_policy_lock(
        url,
        policy.name,
        lambda connection: _locked_distillation(connection, settings, policy, trainer, trigger, run_id),
    )


def _locked_distillation(
    connection: psycopg.Connection[Any],
    settings: Settings,
    policy: PolicySettings,
    trainer: PolicyTrainer,
    trigger: str,
    run_id: str | None = None,
) -> RunOutcome:
    assert policy.teacher is not None
    teacher = policy.teacher
    started = time.monotonic()
    config = {
        "policy": policy.name,
        "base_model": policy.base_model,
        "teacher": teacher.model_dump(mode="json"),
        "learning": policy.learning.model_dump(mode="json"),
    }
    run_id = training_runs.start(connection, policy, trigger, config, "sft", run_id)
    directory = adapters_dir(settings, policy)
    metrics: dict[str, Any] = {}
    try:
        training_runs.remove_orphan_adapters(connection, directory, policy.name)
        data = select_teacher_data(connection, policy)
        head = lineage_head(load_versions(connection, policy.name))
        metrics["distill"] = data.metrics(teacher.model, teacher.distill)
        metrics["from_version"] = head.name if head else None
        if not data.chosen:
            return training_runs.skip(
                connection, policy.name, run_id, "no teacher trajectory selected", metrics=metrics
            )
        return _train_and_record(connection, policy, trainer, run_id, data, head, directory, metrics, started)
    except BaseException as exc:
        return training_runs.fail(connection, "distillation run", policy.name, run_id, exc, metrics)


def _train_and_record(
    connection: psycopg.Connection[Any],
    policy: PolicySettings,
    trainer: PolicyTrainer,
    run_id: str,
    data: TeacherData,
    head: Any,
    directory: Any,
    metrics: dict[str, Any],
    started: float,
) -> RunOutcome:
    import torch

    from learner.grpo.tokens import TokenizationError, trajectory_segments
    from learner.sft.trainer import SFTConfig, train_sft

    assert policy.teacher is not None
    learning, distill = policy.learning, policy.teacher.distill
    torch.set_num_threads(training_threads(learning))
    tokenizer = trainer.load_base()
    segments = []
    trained_ids: list[str] = []
    skipped: dict[str, int] = {}
    for candidate in data.chosen:
        try:
            found = trajectory_segments(tokenizer, candidate.calls)
        except TokenizationError as exc:
            skipped[type(exc).__name__] = skipped.get(type(exc).__name__, 0) + 1
            continue
        segments.extend(found)
        trained_ids.append(candidate.member.trajectory_id)
    metrics["tokenization_skipped"] = skipped
    metrics["start"] = trainer.start_from(head)
    config = SFTConfig(
        lr=distill.lr,
        epochs=distill.epochs,
        max_steps=distill.max_steps,
        micro_batch_size=learning.micro_batch_size,
        grad_accumulation=learning.grad_accumulation,
        max_grad_norm=learning.max_grad_norm,
        max_seq_len=learning.max_seq_len,
        seed=learning.seed,
    )
    adapter_state = None
    with trainer.attempt():
        torch.manual_seed(learning.seed)
        if trainer.distributed is None:
            result = train_sft(trainer.model, trainer.optimizer, segments, config, trainer.tokenizer.pad_token_id or 0)
        else:
            result, adapter_state = _train_sft_ranks(trainer, head, segments, config)
            metrics["ranks"] = trainer.distributed.world_size
            metrics["distributed"] = trainer.distributed.strategy
        metrics["train"] = result.as_metrics()
        # Under FSDP the steps were taken by an optimizer over the shards, made fresh for this run
        # (learner/distributed/sft.py): the lineage's optimizer took none of them.
        fsdp = trainer.distributed is not None and trainer.distributed.strategy == "fsdp"
        metrics["optimizer_steps_total"] = result.optimizer_steps if fsdp else trainer.optimizer_steps()
        if result.optimizer_steps == 0:
            return training_runs.skip(connection, policy.name, run_id, "no trainable teacher sample", metrics=metrics)
        trained = set(trained_ids)
        rewards = [
            float(c.member.reward)
            for c in data.chosen
            if c.member.trajectory_id in trained and c.member.reward is not None
        ]
        columns = {
            "trajectories": len(trained_ids),
            "groups": len({group_key(c.member) for c in data.chosen}),
            "samples": result.samples,
            "tokens": result.loss_tokens,
            "loss": result.loss,
            "mean_reward": sum(rewards) / len(rewards) if rewards else None,
            "from_version_id": str(head.id) if head else None,
        }
        saved = training_runs.Trained(
            connection,
            policy,
            trainer,
            run_id,
            directory,
            head,
            consumed=trained_ids,
            columns=columns,
            metrics=metrics,
            started=started,
            adapter_state=adapter_state,
        )
        return training_runs.save_candidate(saved, "distillation run")


def _train_sft_ranks(trainer: PolicyTrainer, head: Any, segments: list[Any], config: Any) -> tuple[Any, Any]:
    """Rank 0 of a torchrun group: hand the other ranks the segments, train its own share with them."""
    from learner.distributed.sft import train_sft_distributed
    from learner.grpo.trainer import NonFiniteLoss
    from learner.jobs.ranks import TrainingJob, send_training, training_returned

    context = trainer.distributed
    assert context is not None
    send_training(context, TrainingJob("sft", head, segments=segments, sft_config=config))
    try:
        outcome = train_sft_distributed(
            trainer.model, trainer.optimizer, segments, config, trainer.tokenizer.pad_token_id or 0, context
        )
    except NonFiniteLoss:  # raised on every rank at the same step
        training_returned(context)
        raise
    training_returned(context)
    return outcome
