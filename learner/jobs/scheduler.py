"""`apprentice learner`: run each policy's learner on its schedule and on its trigger.

Per policy, from `policies[].learning`:
- `schedule`: seconds between runs, or a cron string (APScheduler's IntervalTrigger or
  CronTrigger.from_crontab);
- `min_new_groups`: every `trigger_poll_s`, count the groups of rewarded trajectories not yet
  trained on, and run as soon as there are at least that many; then run again at once, back to
  back, while each run produces a candidate and at least that many new groups still wait (a run
  that produced nothing waits for the next poll: the same data would not do better at once).
Each policy's runs start as `learning.launcher` says (learner/jobs/launchers.py). In process
(the default), a policy has one long-lived `PolicyTrainer` (policy_trainer.py): its base model, the
lineage's LoRA and its optimizer stay in memory from run to run, so a run costs its new data,
not a model load, and consecutive runs continue one optimization. Under `torchrun` or
`kubernetes` each run is a fresh group of processes (one per GPU) that loads the version it
starts from; the scheduler waits for it and reads its outcome from its `training_runs` row.
All runs go through one worker thread, so two policies never train at once on this machine
(they would share its CPU or GPU) and a slow run delays the next instead of piling up
(max_instances=1, coalesce). Across machines, run_once's advisory lock keeps one learner per
policy; a run that finds the lock taken returns "busy" and costs nothing.

A policy that names a teacher and has no promoted version is behind its teacher: its runs are
distillation runs (learner/jobs/distill.py, kind "sft") on the teacher's best rewarded
answers, triggered when at least `teacher.distill.min_trajectories` of them wait; once one of
its versions is promoted (the takeover), its runs are RL runs as for any policy.

Promotion (`apprentice.promotion.tick.promotion_tick`: gates, canary start, canary verdict,
reconciling the endpoints, retention) runs every `promotion_interval_s` on its own thread, so
that a long training run does not hold up a canary's verdict, and right after a run produced
a candidate. Its lineage steps alone (gates, the canary following the newest version, the
verdict) run every `lineage_interval_s` (5 s from the CLI) on a third thread, and then not after
each run: the sequential test holds at every look, and the rest of a pass (the endpoints'
unloads) can take tens of seconds on a busy inference server. Run after each run, it held the
training thread too: on a live loop, 8-54 s after each run, while old canaries were unloaded.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timezone
from typing import Any

import psycopg

from apprentice.settings import PolicySettings, Settings
from learner.jobs.distill import behind_teacher_now, count_teacher_trajectories
from learner.jobs.launchers import InProcessLauncher, launcher_for
from learner.jobs.policy_trainer import PolicyTrainer
from learner.jobs.selection import count_new_groups
from learner.jobs.training_runs import RunOutcome, learner_database_url

log = logging.getLogger(__name__)


class Learner:
    """The scheduled learner for every policy whose learning is enabled."""

    def __init__(
        self,
        settings: Settings,
        policies: list[str] | None = None,
        database_url: str | None = None,
        promotion_interval_s: float | None = None,
        lineage_interval_s: float | None = None,
    ) -> None:
        self.settings = settings
        # None: this learner does not run the promotion job (another process does, or nobody).
        self.promotion_interval_s = promotion_interval_s
        # The lineage's steps alone (gates, canary, verdict) between the promotion passes, on a
        # thread of their own (only where those passes run here).
        self.lineage_interval_s = lineage_interval_s if promotion_interval_s else None
        names = policies or [p.name for p in settings.policies]
        self.policies: list[PolicySettings] = []
        for name in names:
            policy = settings.policy(name)
            if policy is None:
                raise ValueError(f"no policy named {name!r} in the configuration")
            if policy.learning.enabled:
                self.policies.append(policy)
        self.url = learner_database_url(settings, database_url)
        # How each policy's runs start (learning.launcher: in this process, torchrun, a Kubernetes Job).
        self.launchers = {policy.name: launcher_for(settings, policy, self.url) for policy in self.policies}
        self.trainers: dict[str, PolicyTrainer] = {
            name: launcher.trainer
            for name, launcher in self.launchers.items()
            if isinstance(launcher, InProcessLauncher)
        }
        self._run_lock = threading.Lock()  # one training at a time on this machine
        self.outcomes: list[RunOutcome] = []
        self.scheduler: Any = None

    def run(self, policy: str, trigger: str) -> RunOutcome | None:
        with self._run_lock:
            launcher = self.launchers.get(policy)
            if launcher is None:  # a policy this learner does not schedule, run on request
                settings = self.settings.policy(policy)
                if settings is None:
                    raise ValueError(f"no policy named {policy!r} in the configuration")
                launcher = launcher_for(self.settings, settings, self.url)
            outcome = launcher.launch(trigger)
        self.outcomes.append(outcome)
        if outcome.status == "succeeded" and self.promotion_interval_s is not None and not self.lineage_interval_s:
            # The new candidate's gates and canary start now, not at the next pass (the lineage
            # pass does that within seconds on its own thread where it runs). Only the lineage's
            # steps: the endpoints' unloads wait for a busy server's batches, and training with them.
            self.promote([policy], lineage_only=True)
        log.info(
            "learner %s (%s): %s%s",
            policy,
            trigger,
            outcome.status,
            f" -> {outcome.version_name}" if outcome.version_name else (f" ({outcome.error})" if outcome.error else ""),
        )
        return outcome

    def promote(self, policies: list[str] | None = None, lineage_only: bool = False) -> Any:
        """One pass of the promotion job (or of its lineage steps alone); its failures are
        logged, never raised into the scheduler."""
        from apprentice.promotion.tick import run_promotion_tick

        try:
            report = run_promotion_tick(self.settings, self.url, policies=policies, lineage_only=lineage_only)
        except Exception:
            log.exception("promotion tick failed")
            return None
        for error in report.errors:
            log.warning("promotion: %s", error)
        return report

    def check_trigger(self, policy: PolicySettings) -> RunOutcome | None:
        """Run while at least `min_new_groups` groups of rewarded, untrained trajectories wait and each
        run produces a candidate; returns the last run's outcome (None: no run)."""
        wanted = policy.learning.min_new_groups
        if wanted is None:
            return None
        outcome = None
        while True:
            if behind_teacher_now(policy, self.url):
                assert policy.teacher is not None
                with psycopg.connect(self.url, autocommit=True) as connection:
                    waiting = count_teacher_trajectories(connection, policy)
                if waiting < policy.teacher.distill.min_trajectories:
                    return outcome
                outcome = self.run(policy.name, f"teacher_trajectories:{waiting}")
                if outcome is None or outcome.status != "succeeded":
                    return outcome
                continue
            with psycopg.connect(self.url, autocommit=True) as connection:
                waiting = count_new_groups(connection, policy)
            if waiting < wanted:
                return outcome
            outcome = self.run(policy.name, f"min_new_groups:{waiting}")
            if outcome is None or outcome.status != "succeeded":
                return outcome

    def build(self, blocking: bool = True) -> Any:
        """An APScheduler scheduler with this learner's jobs (not started)."""
        from apscheduler.executors.pool import ThreadPoolExecutor
        from apscheduler.schedulers.background import BackgroundScheduler
        from apscheduler.schedulers.blocking import BlockingScheduler
        from apscheduler.triggers.cron import CronTrigger
        from apscheduler.triggers.interval import IntervalTrigger

        # With max_instances=1 a trigger tick that finds a run still going is skipped on purpose;
        # APScheduler logs each skip as a warning (every trigger_poll_s while a run trains).
        logging.getLogger("apscheduler.scheduler").setLevel(logging.ERROR)
        # Each job execution is logged at INFO too: the learner's own lines say what happened.
        logging.getLogger("apscheduler.executors").setLevel(logging.WARNING)
        cls = BlockingScheduler if blocking else BackgroundScheduler
        scheduler = cls(
            executors={
                "default": ThreadPoolExecutor(1),
                "promotion": ThreadPoolExecutor(1),
                "lineage": ThreadPoolExecutor(1),
            },
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )
        for policy in self.policies:
            learning = policy.learning
            schedule = learning.schedule
            if schedule is not None:
                trigger = (
                    IntervalTrigger(seconds=float(schedule))
                    if isinstance(schedule, (int, float))
                    else CronTrigger.from_crontab(schedule)
                )
                scheduler.add_job(
                    self.run,
                    trigger,
                    args=[policy.name, "schedule"],
                    id=f"schedule:{policy.name}",
                    name=f"learner {policy.name} (schedule)",
                )
            if learning.min_new_groups is not None:
                scheduler.add_job(
                    self.check_trigger,
                    IntervalTrigger(seconds=learning.trigger_poll_s),
                    args=[policy],
                    id=f"trigger:{policy.name}",
                    name=f"learner {policy.name} (>= {learning.min_new_groups} new groups)",
                )
        if self.promotion_interval_s:
            # First pass at once: an inference server that restarted gets its adapters back.
            scheduler.add_job(
                self.promote,
                IntervalTrigger(seconds=self.promotion_interval_s),
                id="promotion",
                name="promotion (gates, canaries, endpoints, retention)",
                executor="promotion",
                next_run_time=datetime.now(timezone.utc),
            )
        if self.lineage_interval_s:
            scheduler.add_job(
                self.promote,
                IntervalTrigger(seconds=self.lineage_interval_s),
                kwargs={"lineage_only": True},
                id="lineage",
                name="promotion: the lineage's gates, canary and verdict",
                executor="lineage",
            )
        self.scheduler = scheduler
        return scheduler

    def start(self, blocking: bool = True) -> Any:
        scheduler = self.build(blocking)
        if not scheduler.get_jobs():
            log.warning("no policy has a learning schedule or trigger; nothing to do")
        scheduler.start()
        return scheduler
