"""The current reward of each (trajectory, name) is the same whichever way the store derives it.

`gateway/store/rewards.py` derives superseded_at in the insert itself when a transaction's
idempotency keys are all new (`_INSERT_CURRENT`), and re-derives it from every row of the
touched slots and keys otherwise (`_RECOMPUTE`). Random histories (client timestamps out of
order and tied, corrections and replays under one key, rewards without a key, pending rewards,
groups of one to twelve requests) are ingested through the real intake; afterwards
re-deriving every slot and key must change no row, and every slot must have exactly one
current reward: the latest of the latest rows of their keys, computed here in Python.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import datetime, timezone

import psycopg
import pytest

from apprentice.store.engine import make_async_engine
from gateway.store import rewards as rewards_store
from gateway.store.rewards import _RECOMPUTE_GIVEN, IntakeRequest, NewReward, ingest_group
from tests.support.rewards import trajectory_reward

TRAJECTORIES = 12
REWARDS = 600


def _reward(
    rng: random.Random, trajectories: list[uuid.UUID], keys: list[str], base: float, *, new_keys_only: bool
) -> NewReward:
    target = rng.choice(trajectories) if rng.random() < 0.9 else uuid.uuid4()  # else pending forever
    kind = rng.random()
    if new_keys_only:  # a transaction of these takes the one-statement path
        key = None if kind < 0.5 else f"fresh-{uuid.uuid4().hex}"
    else:
        key = None if kind < 0.3 else (f"fresh-{uuid.uuid4().hex}" if kind < 0.5 else rng.choice(keys))
    # Ties are frequent on purpose: (observed_at, seq) must break them the same way on both paths.
    # (A reward without a timestamp is observed at its transaction's now(), later than them all.)
    observed = None if rng.random() < 0.03 else base + rng.choice([0, 1, 2, 2, 3, 3, 3])
    name, value = rng.choice(["reward", "quality"]), rng.choice([0.0, 0.25, 0.5, 1.0])
    return trajectory_reward(target, key=key, observed=observed, name=name, value=value)


async def _ingest(url: str, batches: list[list[list[NewReward]]]) -> None:
    engine = make_async_engine(url)
    try:
        for batch in batches:
            requests = [IntakeRequest(rewards, check=lambda _fresh: None) for rewards in batch]
            outcomes = await ingest_group(engine, requests)
            assert not [o for o in outcomes if isinstance(o, Exception)]
    finally:
        await engine.dispose()


def _expected_current(db: psycopg.Connection) -> dict[tuple[uuid.UUID, str], uuid.UUID]:
    rows = db.execute(
        "SELECT id, seq, tenant, idempotency_key, trajectory_id, name, observed_at, status FROM rewards"
    ).fetchall()
    latest_of_key: dict[tuple[str, str], tuple[datetime, int]] = {}
    for _id, seq, tenant, key, _t, _n, observed, _s in rows:
        if key is not None:
            latest_of_key[(tenant, key)] = max(latest_of_key.get((tenant, key), (observed, seq)), (observed, seq))
    best: dict[tuple[uuid.UUID, str], tuple[tuple[datetime, int], uuid.UUID]] = {}
    for id_, seq, tenant, key, trajectory, name, observed, status in rows:
        if status != "linked" or (key is not None and latest_of_key[(tenant, key)] != (observed, seq)):
            continue
        slot = (trajectory, name)
        if slot not in best or best[slot][0] < (observed, seq):
            best[slot] = ((observed, seq), id_)
    return {slot: id_ for slot, (_, id_) in best.items()}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_insert_and_recompute_derive_the_same_current_rewards(
    db: psycopg.Connection, database_url: str, seed: int, monkeypatch: pytest.MonkeyPatch
):
    # Which path each transaction took: the re-derivation is counted, the rest took the one statement.
    rederived: list[int] = []
    original = rewards_store._recompute

    async def counting_recompute(*args, **kwargs):  # type: ignore[no-untyped-def]
        rederived.append(1)
        return await original(*args, **kwargs)

    monkeypatch.setattr(rewards_store, "_recompute", counting_recompute)
    rng = random.Random(seed)
    trajectories = [uuid.uuid4() for _ in range(TRAJECTORIES)]
    now = datetime.now(timezone.utc)
    for trajectory in trajectories:
        db.execute(
            "INSERT INTO trajectories (id, tenant, model, first_call_at, last_call_at) "
            "VALUES (%s, 'local', 'm', %s, %s)",
            (trajectory, now, now),
        )
    db.commit()
    keys = [f"shared-{i}" for i in range(15)]  # reused: corrections (new content) and replays
    base = now.timestamp() - 60
    # Most transactions hold new keys only (the one-statement path), one in four reuses keys.
    batches: list[list[list[NewReward]]] = []
    while sum(len(request) for group in batches for request in group) < REWARDS:
        new_keys_only = rng.random() < 0.75
        batches.append(
            [
                [
                    _reward(rng, trajectories, keys, base, new_keys_only=new_keys_only)
                    for _ in range(rng.choice([1, 1, 2, 3]))
                ]
                for _ in range(rng.randint(1, 12))
            ]
        )
    asyncio.run(_ingest(database_url, batches))
    assert 0 < len(rederived) < len(batches) / 2, "both paths must be exercised, the one-statement path most"

    stored = db.execute("SELECT count(*) FROM rewards").fetchone()[0]
    assert stored > REWARDS // 2  # replays of a key's same content are stored once
    everything = db.execute("SELECT DISTINCT trajectory_id FROM rewards WHERE trajectory_id IS NOT NULL").fetchall()
    all_keys = db.execute(
        "SELECT DISTINCT tenant, idempotency_key FROM rewards WHERE idempotency_key IS NOT NULL"
    ).fetchall()
    with db.transaction():
        cursor = db.execute(
            _RECOMPUTE_GIVEN,
            {
                "trajectories": [row[0] for row in everything],
                "tenants": [row[0] for row in all_keys],
                "keys": [row[1] for row in all_keys],
            },
        )
        assert cursor.rowcount == 0, "re-deriving changed rows that the intake left"

    current = {
        (row[1], row[2]): row[0]
        for row in db.execute(
            "SELECT id, trajectory_id, name FROM rewards WHERE status = 'linked' AND superseded_at IS NULL"
        ).fetchall()
    }
    assert (
        len(current)
        == db.execute("SELECT count(*) FROM rewards WHERE status = 'linked' AND superseded_at IS NULL").fetchone()[0]
    ), "a slot has two current rewards"
    assert current == _expected_current(db)
