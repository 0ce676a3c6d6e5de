"""`apprentice learner` (scheduled) and `apprentice learn --policy P` (one run, now).

`learn` is defined by the one-run module (learner/jobs/one_run.py), which torchrun and a Job's
pod start as `python -m learner.jobs.one_run`; this module, the top of learner/jobs, names it
for the `apprentice` command. torch, transformers and APScheduler are imported inside the
command bodies only.
"""

from __future__ import annotations

import os

import click

from apprentice.commands.common import config_option, load, setup_logging
from learner.jobs.one_run import learn_command as learn_command


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
    "--lineage-interval",
    type=float,
    default=5.0,
    show_default=True,
    help="Seconds between passes over the lineage alone (new candidates' gates, the canary following the "
    "newest, its verdict) between promotion passes; 0: in the promotion passes and after each run.",
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
    config_path: str | None,
    policies: tuple[str, ...],
    promotion_interval: float,
    lineage_interval: float,
    niceness: int,
    log_level: str,
) -> None:
    """Run the learner service: each policy on its schedule and its new-groups trigger."""
    from learner.jobs.scheduler import Learner

    setup_logging(log_level)
    if niceness:
        os.nice(niceness)  # the whole learner process (training and promotion ticks) yields to serving
    settings = load(config_path)
    try:
        learner = Learner(
            settings,
            list(policies) or None,
            promotion_interval_s=promotion_interval or None,
            lineage_interval_s=lineage_interval or None,
        )
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    for policy in learner.policies:
        learning = policy.learning
        click.echo(f"learner {policy.name}: schedule={learning.schedule!r} min_new_groups={learning.min_new_groups}")
    try:
        learner.start(blocking=True)
    except (KeyboardInterrupt, SystemExit):
        pass
