"""One training run of one policy, chosen as the scheduler chooses it; the command every launcher runs.

    apprentice learn --policy P [--trigger T] [--run-id UUID]
    python -m learner.jobs.one_run --policy P ...                         (the same)
    torchrun --nproc-per-node N -m learner.jobs.one_run --policy P ...   (the same, on N processes)

A policy behind its teacher (a teacher named, no promoted version) gets a distillation run, any
other an RL run. Started by torchrun (WORLD_SIZE > 1), the process joins the group
(learner/distributed/context.py): rank 0 runs the run, the other ranks train their shares
(learner/jobs/ranks.py), and every rank exits with the same status: 0 for a run that succeeded,
was skipped, or did not start (lock busy, paused, disabled), 1 for a failed or aborted run.

SIGTERM (torchrun stopping its group, a Job's deadline, an operator) ends the run as failed on
its row and the process with status 143, whatever it was doing (`StopRequest`):
- the handler raises `Terminated` in the main thread, so the run unwinds like any interrupt and
  closes its own row (training_runs.fail) and restores its trainer;
- the exception can land anywhere, inside `import torch` too. Importing torch again after an
  interrupted import crashes the interpreter (SIGSEGV), and so can its teardown with torch's
  threads running: nothing on the way out imports anything, and the process ends with
  `os._exit(143)` once the run's row is closed, instead of tearing the interpreter down;
- where the run could not close its row (the signal landed before its `try`, or in the middle
  of a query on its connection), the command closes it over a new connection before exiting;
  where a library turned the interrupt into another error (an import interrupted halfway fails
  later with a ModuleNotFoundError), the row is failed either way and is made to say SIGTERM;
- a signal that comes once the run's row is final (succeeded, skipped) leaves the row as it is;
  the process still exits 143 while the command runs, and with the run's own status after it
  returned (`main` then ends the process at once, with SIGTERM blocked).
bench/sigterm_stress.py sends SIGTERM at random points of runs and checks every one of these.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import uuid
from types import FrameType
from typing import Any, NoReturn

import click

from apprentice.commands.common import config_option, load, setup_logging
from apprentice.settings import PolicySettings, Settings
from learner.jobs import training_runs
from learner.jobs.distill import behind_teacher_now, run_distillation
from learner.jobs.policy_trainer import PolicyTrainer
from learner.jobs.run import run_once
from learner.jobs.training_runs import RunOutcome, learner_database_url

log = logging.getLogger(__name__)

FAILED = frozenset({"failed", "aborted"})
MODULE = "learner.jobs.one_run"
SIGTERM_STATUS = 128 + signal.SIGTERM  # 143, what a shell reports for a process SIGTERM ended


class Terminated(SystemExit):
    """SIGTERM arrived (torchrun stopping its group, a Job's deadline, an operator's scheduler).

    Raised in the run like any interrupt, so the run's row is closed as failed with this message
    (training_runs.fail) instead of staying `running` until the next run."""

    def __init__(self) -> None:
        super().__init__(SIGTERM_STATUS)

    def __str__(self) -> str:
        return "stopped by SIGTERM before the run finished"


class StopRequest:
    """Whether SIGTERM arrived. The first one raises `Terminated`; later ones are ignored, so that
    the way out (closing the row) is not itself interrupted."""

    requested = False

    @classmethod
    def handle(cls, signum: int, frame: FrameType | None) -> None:
        if cls.requested:
            return
        cls.requested = True
        raise Terminated()


def exit_on_sigterm() -> None:
    """SIGTERM raises Terminated in the main thread (the default would end the process at once)."""
    StopRequest.requested = False
    signal.signal(signal.SIGTERM, StopRequest.handle)


def exit_code(outcome: RunOutcome) -> int:
    return 1 if outcome.status in FAILED else 0


def one_run_arguments(policy: PolicySettings, trigger: str, run_id: str, config_path: str | None = None) -> list[str]:
    """`torch.distributed.run ... -m learner.jobs.one_run ...`'s arguments (after the Python executable)."""
    learning = policy.learning
    rendezvous = any(arg.startswith(("--rdzv", "--nnodes", "--master")) for arg in learning.torchrun_args)
    args = ["-m", "torch.distributed.run", *([] if rendezvous else ["--standalone"])]
    args += ["--nproc-per-node", str(learning.processes), *learning.torchrun_args]
    args += ["-m", MODULE, "--policy", policy.name, "--trigger", trigger, "--run-id", run_id, "--no-progress"]
    if config_path:
        args += ["--config", config_path]
    return args


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
    if behind_teacher_now(settings.policy(policy_name), url):
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


def exit_stopped(settings: Settings, run_id: str) -> NoReturn:
    """The way out after SIGTERM: close the run's row if it is still `running` (rank 0 or a lone
    process; the other ranks of a group write no row), flush the logs, end the process without
    tearing the interpreter down (see the module docstring). Never returns."""
    if os.environ.get("RANK", "0") == "0":
        try:
            if training_runs.close_stopped(learner_database_url(settings), run_id, f"Terminated: {Terminated()}"):
                log.error("run %s: stopped by SIGTERM; its row says so", run_id)
        except Exception:
            log.exception("run %s: stopped by SIGTERM, and its row could not be closed (the next run will)", run_id)
    end_process(SIGTERM_STATUS)


def end_process(code: int) -> NoReturn:
    """Flush the logs and the standard streams, then end the process with `code` without tearing
    the interpreter down (see the module docstring)."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@click.command("learn")
@config_option
@click.option("--policy", "policy", required=True, help="The policy to train.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar.")
@click.option("--trigger", default="cli", show_default=True, help="Recorded as the run's trigger.")
@click.option(
    "--run-id",
    default=None,
    help="The id of the run's training_runs row (a launcher sets it to find the row afterwards).",
)
@click.option("--log-level", default="info", show_default=True)
def learn_command(
    config_path: str | None, policy: str, progress: bool, trigger: str, run_id: str | None, log_level: str
) -> None:
    """Run the learner for one policy once: a candidate adapter from its rewarded trajectories (GRPO),
    or from its teacher's answers while it is behind one. Under torchrun, every process runs this
    command and they train together (docs/learner.md, "Several GPUs")."""
    setup_logging(log_level)
    exit_on_sigterm()
    settings = load(config_path)
    if settings.policy(policy) is None:
        raise click.ClickException(f"no policy named {policy!r} in the configuration")
    try:
        run_id = str(uuid.UUID(run_id)) if run_id is not None else str(uuid.uuid4())
    except ValueError:
        raise click.ClickException(f"--run-id {run_id!r} is not a UUID") from None
    try:
        outcome, code = run_in_group(settings, policy, trigger=trigger, progress=progress, run_id=run_id)
    except BaseException:
        if not StopRequest.requested:
            raise
        exit_stopped(settings, run_id)
    if StopRequest.requested:  # the run ended (or swallowed the interrupt) as the signal came
        exit_stopped(settings, run_id)
    if outcome is not None:  # rank 0 (or the only process) reports
        click.echo(json.dumps(_summary(outcome), indent=2, default=str))
    if code:
        raise SystemExit(code)


def _summary(outcome: RunOutcome) -> dict[str, Any]:
    """What `apprentice learn` prints: the outcome and the training's main figures."""
    summary = {
        "status": outcome.status,
        "policy": outcome.policy,
        "run_id": outcome.run_id,
        "version": outcome.version_name,
        "path": outcome.path,
        "error": outcome.error,
    }
    train = outcome.metrics.get("train") or {}
    for key in ("optimizer_steps", "samples", "loss", "kl", "clip_fraction", "loss_tokens", "duration_s"):
        if key in train:
            summary[key] = train[key]
    for key in ("groups", "ranks"):
        if key in outcome.metrics:
            summary[key] = outcome.metrics[key]
    return summary


def exit_status(code: object) -> int:
    """The process status `SystemExit(code)` stands for (None: 0; a message: 1, printed)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def main() -> NoReturn:
    """`python -m learner.jobs.one_run`: `apprentice learn` (what torchrun and the Job's pod start).

    Once the command has returned, the run's row says what it did, and the process ends with
    `os._exit` instead of tearing the interpreter down. That teardown, with torch loaded, takes
    about a second, in which a SIGTERM killed the process by the signal's default action (Python
    restores it while finalizing: status -15, 16 of 50 signals at random points in
    bench/sigterm_stress.py) and torch's threads can crash it (module docstring). A signal that
    arrives after the command returned is ignored: the run is over and its row is final."""
    code = 0
    try:
        try:
            learn_command(prog_name="apprentice learn")
        except SystemExit as stop:
            code = exit_status(stop.code)
    except Terminated:  # raised while the command was already on its way out
        code = SIGTERM_STATUS
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    end_process(code)


if __name__ == "__main__":
    main()
