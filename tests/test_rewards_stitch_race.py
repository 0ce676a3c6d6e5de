"""A reward that arrives while the stitcher merges its trajectory lands on the merged trajectory.

The stitcher (gateway/store/calls.py) moves a child trajectory's rewards to its parent and
re-derives the parent's current reward; reward intake resolves a reward's trajectory before it
holds that trajectory's lock. Found by review: a reward resolved to the child just before the
merge committed was inserted on the child after it, where no reader looks, and the parent was
left without a current reward. The stitcher's transaction is held open here, exactly as
`stitch_pending` runs it (the trajectories' locks, then the merge statements), while a reward
for the child arrives; it must wait, start over on the parent, and become the current reward.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from datetime import datetime, timezone

import psycopg

from apprentice.store.engine import make_async_engine
from gateway.store.calls import _APPLY_MERGES
from gateway.store.rewards import MERGE_STATEMENTS, NewReward, ingest_rewards, lock_key
from tests.support.rewards import trajectory_reward


def _reward(trajectory: uuid.UUID, observed: float, key: str) -> NewReward:
    return trajectory_reward(trajectory, key=key, observed=observed)


def test_a_reward_racing_a_merge_lands_on_the_parent(db: psycopg.Connection, database_url: str):
    child, parent = uuid.uuid4(), uuid.uuid4()
    now = datetime.now(timezone.utc)
    for trajectory in (parent, child):
        db.execute(
            "INSERT INTO trajectories (id, tenant, model, first_call_at, last_call_at) "
            "VALUES (%s, 'local', 'm', %s, %s)",
            (trajectory, now, now),
        )
    db.commit()
    base = now.timestamp() - 100

    async def ingest(*rewards: NewReward) -> float:
        engine = make_async_engine(database_url)
        try:
            started = time.monotonic()
            for reward in rewards:
                await ingest_rewards(engine, [reward], check=lambda _fresh: None)
            return time.monotonic() - started
        finally:
            await engine.dispose()

    asyncio.run(ingest(_reward(parent, base, "p1"), _reward(child, base + 10, "c1")))

    # The stitcher's transaction: the locks `stitch_pending` takes, then its merge statements.
    stitcher = psycopg.connect(database_url)
    stitcher.execute("CREATE TEMP TABLE IF NOT EXISTS merges (child uuid, parent uuid) ON COMMIT DROP")
    stitcher.execute("INSERT INTO merges VALUES (%s, %s)", (child, parent))
    stitcher.execute(
        "SELECT count(pg_advisory_xact_lock(k)) FROM unnest(%s::bigint[]) AS k",
        (sorted({lock_key(b"t", child), lock_key(b"t", parent)}),),
    )
    for statement in _APPLY_MERGES + MERGE_STATEMENTS:
        stitcher.execute(statement)
    commit = threading.Timer(1.5, stitcher.commit)
    commit.start()
    try:
        waited = asyncio.run(ingest(_reward(child, base + 20, "late")))
    finally:
        commit.join()
        stitcher.close()

    assert waited >= 1.0, "intake did not wait for the merge"
    rows = db.execute(
        "SELECT idempotency_key, trajectory_id, superseded_at IS NULL FROM rewards ORDER BY seq"
    ).fetchall()
    by_key = {key: (trajectory, current) for key, trajectory, current in rows}
    assert {key: trajectory for key, (trajectory, _) in by_key.items()} == {"p1": parent, "c1": parent, "late": parent}
    assert by_key["late"][1] is True and by_key["c1"][1] is False and by_key["p1"][1] is False
    assert db.execute(
        "SELECT count(*) FROM rewards WHERE trajectory_id = %s AND status = 'linked' AND superseded_at IS NULL",
        (parent,),
    ).fetchone() == (1,)
