"""`apprentice learner` (scheduled) and `apprentice learn --policy P` (one run, now).

Imported whenever the CLI lists its commands: torch, transformers and APScheduler are imported
inside the command bodies only.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import click

from apprentice.commands.common import config_option, load, setup_logging


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
    from learner.jobs.one_run import exit_on_sigterm, run_in_group

    setup_logging(log_level)
    exit_on_sigterm()
    settings = load(config_path)
    if settings.policy(policy) is None:
        raise click.ClickException(f"no policy named {policy!r} in the configuration")
    if run_id is not None:
        try:
            run_id = str(uuid.UUID(run_id))
        except ValueError:
            raise click.ClickException(f"--run-id {run_id!r} is not a UUID") from None
    outcome, code = run_in_group(settings, policy, trigger=trigger, progress=progress, run_id=run_id)
    if outcome is not None:  # rank 0 (or the only process) reports
        click.echo(json.dumps(_summary(outcome), indent=2, default=str))
    if code:
        raise SystemExit(code)


def _summary(outcome: Any) -> dict[str, Any]:
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


@click.command("learner")
@config_option
@click.option("--policy", "policies", multiple=True, help="Only these policies (repeatable; default: all).")
@click.option(
    "--promotion-interval",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds between promotion passes (gates, canaries, endpoints, retention); 0: none here.",
)
@click.option(
    "--nice",
    "niceness",
    type=click.IntRange(0, 19),
    default=10,
    show_default=True,
    help="Lower this process's CPU priority by this much: on a machine that also serves, requests "
    "come first and training takes the slack.",
)
@click.option("--log-level", default="info", show_default=True)
def learner_command(
    config_path: str | None, policies: tuple[str, ...], promotion_interval: float, niceness: int, log_level: str
) -> None:
    """Run the learner service: each policy on its schedule and its new-groups trigger."""
    from learner.jobs.scheduler import Learner

    setup_logging(log_level)
    if niceness:
        os.nice(niceness)  # the whole learner process (training and promotion ticks) yields to serving
    settings = load(config_path)
    try:
        learner = Learner(settings, list(policies) or None, promotion_interval_s=promotion_interval or None)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    for policy in learner.policies:
        learning = policy.learning
        click.echo(f"learner {policy.name}: schedule={learning.schedule!r} min_new_groups={learning.min_new_groups}")
    try:
        learner.start(blocking=True)
    except (KeyboardInterrupt, SystemExit):
        pass
