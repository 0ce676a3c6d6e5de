"""One training run of one policy, chosen as the scheduler chooses it; the command every launcher runs.

    apprentice learn --policy P [--trigger T] [--run-id UUID]
    torchrun --nproc-per-node N -m learner.jobs.one_run --policy P ...   (the same, on N processes)

A policy behind its teacher (a teacher named, no promoted version) gets a distillation run, any
other an RL run. Started by torchrun (WORLD_SIZE > 1), the process joins the group
(learner/distributed/context.py): rank 0 runs the run, the other ranks train their shares
(learner/jobs/ranks.py), and every rank exits with the same status: 0 for a run that succeeded,
was skipped, or did not start (lock busy, paused, disabled), 1 for a failed or aborted run.
"""

from __future__ import annotations

import logging
import signal
from types import FrameType

import psycopg

from apprentice.settings import Settings
from learner.jobs.run import RunOutcome, learner_database_url, run_once
from learner.jobs.session import PolicyTrainer

log = logging.getLogger(__name__)

FAILED = frozenset({"failed", "aborted"})


class Terminated(SystemExit):
    """SIGTERM arrived (torchrun stopping its group, a Job's deadline, an operator's scheduler).

    Raised in the run like any interrupt, so the run's row is closed as failed with this message
    (learner/jobs/run.py end_failed_run) instead of staying `running` until the next run."""

    def __init__(self) -> None:
        super().__init__(143)

    def __str__(self) -> str:
        return "stopped by SIGTERM before the run finished"


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


def exit_on_sigterm() -> None:
    """SIGTERM raises Terminated in the main thread (the default would end the process at once)."""
    signal.signal(signal.SIGTERM, _terminate)


def exit_code(outcome: RunOutcome) -> int:
    return 1 if outcome.status in FAILED else 0


def behind_teacher_now(settings: Settings, policy_name: str, database_url: str) -> bool:
    """The policy names a teacher and has no promoted version: its run is a distillation."""
    from learner.jobs.distill import behind_teacher

    policy = settings.policy(policy_name)
    if policy is None or policy.teacher is None:
        return False
    with psycopg.connect(database_url, autocommit=True) as connection:
        return behind_teacher(connection, policy)


def run_policy(
    settings: Settings,
    policy_name: str,
    *,
    trigger: str,
    database_url: str | None = None,
    trainer: PolicyTrainer | None = None,
    progress: bool = False,
    run_id: str | None = None,
) -> RunOutcome:
    """One run of `policy_name` in this process: distillation when behind its teacher, else RL."""
    url = learner_database_url(settings, database_url)
    if behind_teacher_now(settings, policy_name, url):
        from learner.jobs.distill import run_distillation

        return run_distillation(
            settings, policy_name, trigger=trigger, database_url=url, trainer=trainer, run_id=run_id
        )
    return run_once(
        settings, policy_name, trigger=trigger, progress=progress, database_url=url, trainer=trainer, run_id=run_id
    )


def run_in_group(
    settings: Settings, policy_name: str, *, trigger: str, progress: bool = False, run_id: str | None = None
) -> tuple[RunOutcome | None, int]:
    """This process's part of one run: the whole run when alone, rank 0's or another rank's under
    torchrun. Returns the outcome (None on ranks other than 0) and the exit status."""
    from learner.distributed.context import from_environment
    from learner.jobs.ranks import follow, release

    policy = settings.policy(policy_name)
    if policy is None:
        raise ValueError(f"no policy named {policy_name!r} in the configuration")
    learning = policy.learning
    context = from_environment(learning.distributed, learning.distributed_timeout_s)
    if context is None:
        outcome = run_policy(settings, policy_name, trigger=trigger, progress=progress, run_id=run_id)
        return outcome, exit_code(outcome)
    try:
        if not context.leader:
            return None, follow(policy, context)
        log.info("rank 0 of %d (%s, %s)", context.world_size, context.backend, context.strategy)
        code = 1
        try:
            outcome = run_policy(
                settings,
                policy_name,
                trigger=trigger,
                progress=progress,
                run_id=run_id,
                trainer=PolicyTrainer(policy, context),
            )
            code = exit_code(outcome)
        finally:
            if not release(context, code):
                log.error("the run failed while the other ranks were training: exiting so that torchrun stops them")
                code = 1
        return outcome, code
    finally:
        context.close()


def main() -> None:
    """`python -m learner.jobs.one_run`: `apprentice learn` (what torchrun and the Job's pod start)."""
    from learner.jobs.cli import learn_command

    learn_command(prog_name="apprentice learn")


if __name__ == "__main__":
    main()
