"""One learner run for one policy: lock, select, group, tokenize, train, record a candidate.

A run continues the training lineage (apprentice.promotion.lineage): it trains from the lineage
head -- the newest candidate or canary above the promoted version, else the promoted version,
else the base model -- and its candidate records the head as parent_version_id. It trains only
on data the head or its ancestors at most `max_staleness` versions back sampled (selection.py).
The model, the lineage's LoRA and its optimizer live in a `PolicyTrainer` (session.py) that a
long-lived learner keeps between runs; `run_once` without one makes a one-off trainer.

Safety, in the order things happen:
- One learner per policy at a time, across machines: a session-level PostgreSQL advisory lock
  keyed by the policy, held on the run's connection. A run that cannot take it returns "busy"
  at once. The lock goes away with the connection, so a killed learner never leaves it held.
- A `training_runs` row is written (status running) and committed first: it is the record of
  the attempt even if the process dies. Holding the lock proves that any older "running" row
  of the policy belongs to a dead run; those are marked failed ("interrupted").
- Adapter files are written atomically under a temporary name (adapters.save_adapter).
- Then ONE transaction records the candidate through the lifecycle (`lifecycle.record_candidate`:
  the `adapter_versions` row, status candidate, and its `adapter_transitions` row, NULL ->
  candidate, actor "auto"), marks the trajectories it used
  (and the groups it set aside for carrying no signal) with `trained_in_run_id`, and finishes
  the run row. Killed before that commit, nothing is marked and the next run retries the same
  data; the next run also deletes adapter directories that no version row refers to.
- A NaN or infinite loss (or gradient) aborts the run: status "aborted", no candidate,
  nothing marked.
- Whatever ends a run without its commit (a NaN, an error, a kill of the transaction), the
  trainer's LoRA weights and optimizer state are restored to those of before the run
  (PolicyTrainer.attempt), so the next run continues from exactly the head it names.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.types.json import Jsonb

from apprentice.promotion import lifecycle
from apprentice.settings import PolicySettings, Settings
from learner.grpo.advantages import AdvantageKind, family_advantages, group_advantages, leave_one_out_baseline
from learner.grpo.grouping import Group, Grouping, Member, family_key, make_groups
from learner.jobs.selection import Selection, select
from learner.jobs.session import PolicyTrainer, training_threads

if TYPE_CHECKING:  # imported by the functions that train: they pull in torch
    from apprentice.promotion.rows import AdapterVersion
    from learner.grpo.tokens import Segment
    from learner.grpo.trainer import TrainResult, TrainSample

log = logging.getLogger(__name__)

LOCK_CLASS = 0x4150_4C4E  # "APLN": the learner's advisory-lock namespace
_SOURCE_DIRS = ("learner/grpo", "learner/jobs")


@dataclass
class RunOutcome:
    """What a run did. status: succeeded | skipped | aborted | failed | busy | paused | disabled."""

    status: str
    policy: str
    run_id: str | None = None
    version_id: str | None = None
    version_name: str | None = None
    path: str | None = None
    error: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)


def lock_key(policy: str) -> int:
    """The advisory lock's second key: a stable 32-bit hash of the policy name."""
    return int.from_bytes(hashlib.blake2b(policy.encode(), digest_size=4).digest(), "big", signed=True)


def code_version() -> str:
    """The git commit (with +dirty) when run from a checkout, and a hash of the learner's sources."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for directory in _SOURCE_DIRS:
        for path in sorted((root / directory).glob("*.py")):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    source = digest.hexdigest()[:12]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", *_SOURCE_DIRS],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        return f"git:{commit}{'+dirty' if dirty else ''} src:{source}"
    except (OSError, subprocess.SubprocessError):
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"apprentice {version('apprentice')} src:{source}"
        except PackageNotFoundError:
            return f"src:{source}"


def adapters_dir(settings: Settings, policy: PolicySettings) -> Path:
    return Path(policy.learning.adapters_dir or Path(settings.data_dir) / "adapters" / policy.name).resolve()


def learner_database_url(settings: Settings, database_url: str | None = None) -> str:
    """The libpq URL a learner connects with: the one given, the configured one, or the embedded server's."""
    from apprentice.store.engine import ensure_database_url, libpq_url

    # ensure_database_url exports the URL to the environment (for gateway workers); a learner
    # given its database needs no such side effect.
    url = database_url or settings.database_url or ensure_database_url(None, Path(settings.data_dir))
    return libpq_url(url)


# ------------------------------------------------------------------ run bookkeeping


def _start_run(
    connection: psycopg.Connection[Any],
    policy: PolicySettings,
    trigger: str,
    config: dict[str, Any],
    kind: str = "rl",
    run_id: str | None = None,
) -> str:
    """Write the run's row (status running); `run_id`: the id a launcher chose, to find the row after."""
    run_id = run_id or str(uuid.uuid4())
    with connection.transaction():
        connection.execute(
            "UPDATE training_runs SET status = 'failed', finished_at = now(), "
            "error = 'interrupted: the learner ended before finishing this run' "
            "WHERE policy = %s AND status = 'running'",
            (policy.name,),
        )
        connection.execute(
            "INSERT INTO training_runs (id, policy, status, trigger, kind, host, pid, code_version, config) "
            "VALUES (%s, %s, 'running', %s, %s, %s, %s, %s, %s)",
            (run_id, policy.name, trigger, kind, socket.gethostname(), os.getpid(), code_version(), Jsonb(config)),
        )
    return run_id


def _finish_run(
    connection: psycopg.Connection[Any],
    run_id: str,
    status: str,
    *,
    error: str | None = None,
    columns: dict[str, Any] | None = None,
    metrics: dict[str, Any] | None = None,
) -> None:
    columns = dict(columns or {})
    assignments = ", ".join(f"{name} = %({name})s" for name in columns)
    connection.execute(
        f"UPDATE training_runs SET status = %(status)s, finished_at = now(), error = %(error)s, "
        f"duration_s = extract(epoch FROM now() - started_at), metrics = %(metrics)s"
        f"{', ' + assignments if assignments else ''} WHERE id = %(id)s",
        {**columns, "status": status, "error": error, "metrics": Jsonb(_jsonable(metrics or {})), "id": run_id},
    )


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _mark(connection: psycopg.Connection[Any], run_id: str, trajectory_ids: list[str]) -> int:
    if not trajectory_ids:
        return 0
    cursor = connection.execute(
        "UPDATE trajectories SET trained_in_run_id = %s WHERE id = ANY(%s::uuid[]) AND trained_in_run_id IS NULL",
        (run_id, trajectory_ids),
    )
    return cursor.rowcount


def _remove_orphan_adapters(connection: psycopg.Connection[Any], directory: Path, policy: str) -> None:
    """This policy's adapter directories that no version row refers to: left by killed runs.

    Only names this policy's runs write (`<policy>-v<n>` and their temporary siblings) are
    touched, so a directory shared with other policies or other files is safe.
    """
    from learner.grpo.adapters import TMP_PREFIX

    if not directory.is_dir():
        return
    known = {Path(r[0]).resolve() for r in connection.execute("SELECT path FROM adapter_versions").fetchall()}
    prefix = f"{policy}-v"
    for entry in directory.iterdir():
        ours = entry.name.startswith(prefix) or entry.name.startswith(TMP_PREFIX + prefix)
        if ours and entry.is_dir() and entry.resolve() not in known:
            log.info("removing adapter directory %s: no version refers to it (interrupted run)", entry)
            shutil.rmtree(entry, ignore_errors=True)


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
    for group in grouping.pooled:
        for member, reward, segments in _segments(group, selection, tokenizer, skipped):
            history = selection.family_rewards.get(family_key(member), [])
            baseline = leave_one_out_baseline(history, member.trajectory_id, min_group_size - 1)
            if baseline is None:  # the family has too few other rewards yet: kept for a later run
                skipped["family_too_small"] = skipped.get("family_too_small", 0) + 1
                continue
            pooled.append((member, reward, segments))
            baselines.append(baseline)
    advantages = family_advantages([reward for _, reward, _ in pooled], baselines, advantage)
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


def with_policy_lock(
    url: str, policy_name: str, locked_run: Callable[[psycopg.Connection[Any]], RunOutcome]
) -> RunOutcome:
    """Run `locked_run` holding the policy's advisory lock, unless another learner holds it or
    learning is paused. Every kind of run (RL, distillation) goes through here, so each one that
    loses its database connection says so on its row and returns `failed` instead of raising
    from the unlock on the dead connection (the lost connection took the lock with it)."""
    with psycopg.connect(url, autocommit=True) as connection:
        locked = connection.execute(
            "SELECT pg_try_advisory_lock(%s, %s)", (LOCK_CLASS, lock_key(policy_name))
        ).fetchone()
        if locked is None or not locked[0]:
            return RunOutcome("busy", policy_name, error="another learner holds this policy's lock")
        try:
            paused = connection.execute(
                "SELECT learning_paused FROM policy_state WHERE policy = %s", (policy_name,)
            ).fetchone()
            if paused and paused[0]:
                return RunOutcome("paused", policy_name)
            outcome = locked_run(connection)
            if connection.broken and outcome.run_id is not None:
                _record_lost_connection(url, outcome)
            return outcome
        finally:
            if not connection.broken:  # a lost connection took the lock with it
                connection.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_CLASS, lock_key(policy_name)))


def _record_lost_connection(url: str, outcome: RunOutcome, attempts: int = 5, delay_s: float = 2.0) -> None:
    """The run's connection died (PostgreSQL restarted, the network broke): its final transaction
    rolled back, so no version row exists and no trajectory is marked. Say so on the run's row over
    a new connection, retried for a while; if the database stays away, the log says it and the
    next run closes the row as interrupted."""
    outcome.error = (
        f"database connection lost: {outcome.error}; nothing was committed (no version, no trajectory "
        "marked trained), the next run retries"
    )
    for attempt in range(1, attempts + 1):
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=5) as connection:
                connection.execute(
                    "UPDATE training_runs SET status = 'failed', finished_at = now(), error = %s, "
                    "duration_s = extract(epoch FROM now() - started_at) WHERE id = %s AND status = 'running'",
                    (outcome.error, outcome.run_id),
                )
            log.error("learner run %s for %s failed: %s", outcome.run_id, outcome.policy, outcome.error)
            return
        except psycopg.Error as exc:
            log.warning("run %s: recording its end, attempt %d of %d: %s", outcome.run_id, attempt, attempts, exc)
            time.sleep(delay_s)
    log.error(
        "learner run %s for %s failed and the database stayed away: %s (the next run marks it interrupted)",
        outcome.run_id,
        outcome.policy,
        outcome.error,
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
        with self.connection.transaction():
            _mark(self.connection, self.run_id, self.set_aside)
            _finish_run(self.connection, self.run_id, "skipped", error=reason, columns=columns, metrics=self.metrics)
        return RunOutcome("skipped", self.policy.name, self.run_id, metrics=self.metrics, error=reason)


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
    run_id = _start_run(connection, policy, trigger, config, run_id=run_id)
    directory = adapters_dir(settings, policy)
    metrics: dict[str, Any] = {}
    try:
        _remove_orphan_adapters(connection, directory, policy.name)
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
        return end_failed_run(connection, "learner run", policy.name, run_id, exc, metrics)


def end_failed_run(
    connection: psycopg.Connection[Any],
    kind: str,
    policy_name: str,
    run_id: str,
    exc: BaseException,
    metrics: dict[str, Any],
) -> RunOutcome:
    """Record a run that raised as `aborted` (a non-finite loss) or `failed`, and say so; an
    interrupt (KeyboardInterrupt, SystemExit) is recorded and raised again."""
    from learner.grpo.trainer import NonFiniteLoss

    status = "aborted" if isinstance(exc, NonFiniteLoss) else "failed"
    log.exception("%s %s for %s %s", kind, run_id, policy_name, status)
    try:
        _finish_run(connection, run_id, status, error=f"{type(exc).__name__}: {exc}", metrics=metrics)
    except psycopg.Error:
        log.exception("could not record the end of run %s", run_id)
    if not isinstance(exc, Exception):
        raise exc
    return RunOutcome(status, policy_name, run_id, error=f"{type(exc).__name__}: {exc}", metrics=metrics)


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
        return _save_and_record(run, trained_ids, columns, head)


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


def _save_and_record(
    run: RunContext, trained_ids: list[str], columns: dict[str, Any], head: AdapterVersion | None
) -> RunOutcome:
    """Save the adapter under the next version's name, then commit the candidate (child of the head)
    with the run's end; the trainer then holds the new version."""
    from learner.grpo.adapters import save_adapter

    policy = run.policy
    number = lifecycle.next_version_number(run.connection, policy.name)
    name = f"{policy.name}-v{number}"
    out_dir = run.directory / name
    if out_dir.exists():  # an orphan of a killed run (version rows always get a fresh number)
        shutil.rmtree(out_dir)
    save_adapter(run.trainer.model, out_dir, policy.base_model, state_dict=run.adapter_state)
    config = json.loads((out_dir / "adapter_config.json").read_text())
    candidate = lifecycle.NewCandidate(
        id=uuid.uuid4(),
        policy=policy.name,
        version=number,
        name=name,
        base_model=policy.base_model,
        path=str(out_dir),
        parent_version_id=head.id if head else None,
        training_run_id=uuid.UUID(run.run_id),
        rank=int(config["r"]),
        alpha=float(config["lora_alpha"]),
        target_modules=list(config.get("target_modules") or []),
    )
    run.metrics["duration_s"] = time.monotonic() - run.started
    try:
        with run.connection.transaction():
            lifecycle.record_candidate(run.connection, candidate)
            _mark(run.connection, run.run_id, trained_ids + run.set_aside)
            _finish_run(
                run.connection,
                run.run_id,
                "succeeded",
                columns={**columns, "produced_version_id": str(candidate.id)},
                metrics=run.metrics,
            )
    except BaseException:
        shutil.rmtree(out_dir, ignore_errors=True)
        raise
    run.trainer.commit(str(candidate.id))
    log.info(
        "policy %s: run %s produced candidate %s (%d trajectories, %d groups, loss %.4f, %.1fs)",
        policy.name,
        run.run_id,
        name,
        len(trained_ids),
        columns["groups"],
        columns["loss"],
        run.metrics["duration_s"],
    )
    return RunOutcome("succeeded", policy.name, run.run_id, str(candidate.id), name, str(out_dir), metrics=run.metrics)
