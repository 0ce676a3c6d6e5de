"""`apprentice eval --policy P --version V`: score a version on the policy's evaluation sets.

The version answers every item through the policy's inference endpoints (by its LoRA name; the
base model for `--version base`), each answer is scored as its item says, and the run is stored
per version and item (shown on the dashboard's version page). With a promoted version that has a
run on the same set, the paired comparison the evaluation gate would make is printed beside it.
Exits 1 when a set could not be scored.
"""

from __future__ import annotations

import asyncio

import click

from apprentice.commands.common import config_option, database_url, load, setup_logging
from apprentice.settings import PolicySettings, Settings


@click.command("eval")
@config_option
@click.option("--policy", "policy_name", required=True, help="The policy whose evaluation sets are used.")
@click.option("--version", "version_ref", required=True, help='A version (name, number, "v3", id) or "base".')
@click.option(
    "--set", "set_names", multiple=True, help="Only these sets (repeatable); default: the gate's set, else every set."
)
def eval_command(config_path: str | None, policy_name: str, version_ref: str, set_names: tuple[str, ...]) -> None:
    """Score VERSION of POLICY on its evaluation sets through the inference endpoints."""
    setup_logging("warning")
    settings = load(config_path)
    policy = settings.policy(policy_name)
    if policy is None:
        raise click.ClickException(f"policy {policy_name!r} is not configured")
    raise SystemExit(asyncio.run(_evaluate(settings, database_url(settings), policy, version_ref, set_names)))


async def _evaluate(
    settings: Settings, url: str, policy: PolicySettings, version_ref: str, set_names: tuple[str, ...]
) -> int:
    from apprentice.evalsets import store
    from apprentice.evalsets.paired import non_inferiority
    from apprentice.evalsets.runner import EvalUnavailable, score_on_set, target_of
    from apprentice.promotion import lifecycle
    from apprentice.store.engine import make_async_engine

    engine = make_async_engine(url, pool_size=2, max_overflow=2)
    failed = 0
    try:
        version = None
        if version_ref != "base":
            try:
                version = await lifecycle.find_version(engine, version_ref, policy=policy.name)
            except lifecycle.VersionNotFound as exc:
                raise click.ClickException(str(exc)) from None
        sets = await store.list_sets(engine, policy.name)
        gate = policy.promotion.eval_gate
        wanted = set(set_names) or ({gate.set} if gate is not None else {s.name for s in sets})
        if missing := wanted - {s.name for s in sets}:
            raise click.ClickException(f"policy {policy.name!r} has no evaluation set {', '.join(sorted(missing))}")
        async with engine.connect() as connection:
            promoted = (await lifecycle.serving_versions(connection, policy.name)).promoted
        for eval_set in (s for s in sets if s.name in wanted):
            try:
                scored = await score_on_set(engine, settings, policy, eval_set, version, trigger="cli")
            except EvalUnavailable as exc:
                click.echo(f"{eval_set.name}: not scored: {exc}", err=True)
                failed = 1
                continue
            run = scored.run
            mean = f"{run.mean:.4f}" if run.mean is not None else "-"
            click.echo(f"{eval_set.name}: {run.target} mean {mean} on {run.scored}/{run.items} items (run {run.id})")
            for result in scored.results.values():
                if result.score is None:
                    click.echo(f"  item {result.item_id}: {result.detail}", err=True)
            if promoted is None or (version is not None and promoted.id == version.id):
                continue
            for other in await store.latest_runs(engine, eval_set.id, target_of(policy, promoted)):
                theirs = await store.results_of(engine, other.id)
                pairs = [
                    (mine, their)
                    for item, result in scored.results.items()
                    if (mine := result.score) is not None
                    and item in theirs
                    and (their := theirs[item].score) is not None
                ]
                if len(pairs) >= 2:
                    test = non_inferiority(
                        [a for a, _ in pairs],
                        [b for _, b in pairs],
                        margin=gate.margin if gate else 0.05,
                        alpha=gate.alpha if gate else 0.05,
                        power=gate.power if gate else 0.8,
                    )
                    verdict = "within the margin" if test.passed else "NOT shown within the margin"
                    click.echo(f"  against {promoted.name}: {test.summary()}: {verdict}")
                break
    finally:
        await engine.dispose()
    return failed
