"""`apprentice learner` (scheduled) and `apprentice learn --policy P` (one run, now).

Imported whenever the CLI lists its commands: torch, transformers and APScheduler are imported
inside the command bodies only.
"""

from __future__ import annotations

import json
import os

import click

from apprentice.commands.common import config_option, load, setup_logging


@click.command("learn")
@config_option
@click.option("--policy", "policy", required=True, help="The policy to train.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar.")
@click.option("--log-level", default="info", show_default=True)
def learn_command(config_path: str | None, policy: str, progress: bool, log_level: str) -> None:
    """Run the learner for one policy once: GRPO on its rewarded trajectories -> a candidate adapter."""
    from learner.jobs.run import run_once

    setup_logging(log_level)
    settings = load(config_path)
    if settings.policy(policy) is None:
        raise click.ClickException(f"no policy named {policy!r} in the configuration")
    outcome = run_once(settings, policy, trigger="cli", progress=progress)
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
    if "groups" in outcome.metrics:
        summary["groups"] = outcome.metrics["groups"]
    click.echo(json.dumps(summary, indent=2, default=str))
    if outcome.status in ("failed", "aborted"):
        raise SystemExit(1)


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
