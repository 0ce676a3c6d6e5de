"""`apprentice judge --policy P --group G`: judge one group now and print the scores.

For rubric work: the judge is called through the running gateway (as the judge worker does)
and each trajectory's score and explanation are printed. The scores are recorded like the
worker's unless `--dry-run`; a group already judged by this judge and rubric is not judged
again (its stored scores are printed). `--rubric-file` tries another rubric (a new judge, by
its hash).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import click
from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.commands.common import config_option, database_url, load
from apprentice.settings import JudgeSettings, PolicySettings, Settings
from apprentice.store.engine import make_async_engine
from gateway.judging import store
from gateway.judging.client import JudgeClient
from gateway.judging.job import judge_chunk
from gateway.judging.rubric import rubric_hash, rubric_text


def _print_outcome(chunk: store.GroupChunk, status: str, reason: str | None, scores: list[dict[str, Any]]) -> None:
    click.echo(
        f"chunk {chunk.chunk} ({len(chunk.trajectory_ids)} trajectories): {status}" + (f": {reason}" if reason else "")
    )
    for entry in scores:
        click.echo(f"  {entry['trajectory_id']}  score {entry['score']:.3f}  {entry['explanation']}")


async def _judge_one(
    engine: AsyncEngine,
    settings: Settings,
    policy: PolicySettings,
    judge: JudgeSettings,
    chunk: store.GroupChunk,
    *,
    rubric: str,
    dry_run: bool,
) -> bool:
    digest = rubric_hash(rubric)
    if dry_run:
        claim: store.Claim | None = store.Claim(uuid.uuid4(), chunk)
    else:
        outcome = await store.claim(
            engine, policy, judge, digest, [chunk], mode="manual", lease_s=judge.timeout_s * 2, respect_limits=False
        )
        claim = outcome.claims[0] if outcome.claims else None
    if claim is None:
        row = await store.judgement_of_members(engine, policy.name, judge.model, digest, chunk.members_key)
        if row is None:  # another process claimed it a moment ago and has not finished
            return False
        scores = (row["answer"] or {}).get("scores", [])
        when = row["finished_at"] or row["started_at"]
        _print_outcome(chunk, f"already {row['status']} at {when}", row["reason"], scores)
        return bool(row["status"] == "judged")
    client = JudgeClient(settings, judge)
    try:
        result = await judge_chunk(
            engine,
            client,
            policy,
            judge,
            claim,
            rubric=rubric,
            max_comment_chars=settings.rewards.max_comment_chars,
            record=not dry_run,
        )
    finally:
        await client.close()
    scores = [{"trajectory_id": t, "score": s, "explanation": e} for t, (s, e) in result.scores.items()]
    status = "judged" if result.judged else f"not judged after {result.attempts} attempts"
    _print_outcome(chunk, status + (" (dry run: not recorded)" if dry_run else ""), result.reason, scores)
    return result.judged


@click.command("judge")
@config_option
@click.option("--policy", "policy_name", required=True, help="The policy whose group is judged.")
@click.option("--group", required=True, help="A client group id, a task hash, or the id of one of its trajectories.")
@click.option("--tenant", default=None, help="The tenant, when the group id exists in several.")
@click.option(
    "--rubric-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="Try this rubric instead."
)
@click.option("--dry-run", is_flag=True, help="Print the scores without recording them.")
def judge_command(
    config_path: str | None, policy_name: str, group: str, tenant: str | None, rubric_file: Path | None, dry_run: bool
) -> None:
    """Judge one group of a policy now and print each trajectory's score and explanation."""
    settings = load(config_path)
    policy = settings.policy(policy_name)
    if policy is None:
        raise click.ClickException(f"no policy {policy_name!r} in the configuration")
    if policy.judge is None:
        raise click.ClickException(f"policy {policy_name!r} has no judge: add `judge:` to its configuration")
    judge = policy.judge
    if rubric_file is not None:
        judge = judge.model_copy(update={"rubric": rubric_file.read_text()})
    rubric = rubric_text(judge)
    url = database_url(settings)

    async def main() -> bool:
        engine = make_async_engine(url)
        try:
            try:
                chunks = await store.find_group(engine, policy, judge.max_group_size, group, tenant)
            except LookupError as exc:
                raise click.ClickException(str(exc)) from None
            if not chunks:
                raise click.ClickException(
                    f"no group {group!r} of policy {policy_name!r} with two trajectories or more"
                )
            if len(chunks[0].trajectory_ids) < 2:
                raise click.ClickException(f"group {group!r} has one trajectory: a judge compares two or more")
            click.echo(f"judge {judge.model}, rubric {rubric_hash(rubric)}")
            results = [
                await _judge_one(engine, settings, policy, judge, c, rubric=rubric, dry_run=dry_run) for c in chunks
            ]
            return all(results)
        finally:
            await engine.dispose()

    if not asyncio.run(main()):
        raise SystemExit(1)
