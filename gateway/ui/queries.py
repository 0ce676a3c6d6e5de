"""The dashboard's reads that the admin API has no function for.

Every query reads a bounded, index-ordered slice (the indexes of migrations 0006 and 0007):
keyset pages of at most a few dozen rows, charts over the newest few thousand trajectories of
a policy, rates over the last minutes. Nothing scans `calls` beyond a time window, and no page
counts a whole table. What the admin API already reads (policies, its live evaluation, one
trajectory, keys) comes from `apprentice.promotion.listing`, `gateway.store` and
`gateway.auth.keys`; a version's detail comes from `version_detail` here, the admin API's
without reading every version row of the policy. `bench/dashboard_pages.py` times every page
with a million calls and ten thousand versions.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.promotion import lifecycle
from apprentice.promotion.canary import evaluate_canary
from apprentice.promotion.gate_checks import training_run_of
from apprentice.promotion.lineage import lineage_head
from apprentice.promotion.listing import VersionDetail
from apprentice.promotion.provenance import provenance
from apprentice.promotion.rows import AdapterVersion
from apprentice.promotion.status import VersionStatus
from apprentice.settings import Settings
from apprentice.store.tables import adapter_versions
from gateway.store.connection import driver_connection

RATE_WINDOW_MIN = 5  # calls and rewards per minute: the mean over the last minutes
TREND_TRAJECTORIES = 400  # the overview's reward trend: the newest trajectories of a policy
TREND_POINTS = 20
CHART_TRAJECTORIES = 3000  # the policy page's chart: the newest trajectories of the policy
CHART_BUCKETS = 30
PAGE = 30  # rows per keyset page
# A trajectory list filtered by reward first reads at most this many of the newest trajectories
# that match the other filters; when fewer than a page of them has a reward in the range, it
# reads the range's rewards instead (see `trajectories_page`)...
REWARD_SCAN = 2000
REWARD_FEW = 2000  # ... or, with at most this many in the range, those rewards' trajectories by id
REWARD_ROWS = 50_000  # ... or, with at most this many, the newest trajectories through a hash of their ids


async def fetch(
    engine: AsyncEngine, sql: str, params: dict[str, Any] | tuple[Any, ...] = (), *, work_mem: str | None = None
) -> list[dict[str, Any]]:
    async with engine.connect() as connection:
        pg = await driver_connection(connection)
        async with pg.cursor(row_factory=dict_row) as cursor:
            await cursor.execute("SET LOCAL jit = off")
            if work_mem is not None:
                await cursor.execute(f"SET LOCAL work_mem = '{work_mem}'")
            await cursor.execute(sql, params)
            rows = await cursor.fetchall()
        await pg.rollback()
    return rows


# ---------------------------------------------------------------- overview


@dataclass(frozen=True)
class Rates:
    calls_per_min: float
    rewards_per_min: float


async def rates(engine: AsyncEngine, policies: list[str]) -> dict[str, Rates]:
    """Calls and linked rewards per minute over the last RATE_WINDOW_MIN minutes, per policy."""
    if not policies:
        return {}
    window = {"policies": policies, "minutes": RATE_WINDOW_MIN}
    calls = await fetch(
        engine,
        "SELECT policy, count(*) AS n FROM calls WHERE policy = ANY(%(policies)s::text[]) "
        "AND created_at >= now() - make_interval(mins => %(minutes)s) GROUP BY policy",
        window,
    )
    rewards = await fetch(
        engine,
        "SELECT t.policy, count(*) AS n FROM rewards r JOIN trajectories t ON t.id = r.trajectory_id "
        "WHERE r.received_at >= now() - make_interval(mins => %(minutes)s) AND r.status = 'linked' "
        "AND t.policy = ANY(%(policies)s::text[]) GROUP BY t.policy",
        window,
    )
    call_counts = {row["policy"]: row["n"] for row in calls}
    reward_counts = {row["policy"]: row["n"] for row in rewards}
    return {
        p: Rates(call_counts.get(p, 0) / RATE_WINDOW_MIN, reward_counts.get(p, 0) / RATE_WINDOW_MIN) for p in policies
    }


_RECENT_REWARDS = """
SELECT t.id, t.last_call_at, t.adapter_version_id, cr.value AS reward
FROM (SELECT id, last_call_at, adapter_version_id FROM trajectories
      WHERE policy = %(policy)s AND merged_into IS NULL
      ORDER BY last_call_at DESC LIMIT %(limit)s) t
JOIN LATERAL (SELECT r.value FROM rewards r WHERE r.trajectory_id = t.id AND r.name = %(reward_name)s
              AND r.status = 'linked' AND r.superseded_at IS NULL ORDER BY r.observed_at DESC LIMIT 1) cr ON true
ORDER BY t.last_call_at
"""


async def recent_rewards(engine: AsyncEngine, policy: str, reward_name: str, limit: int) -> list[dict[str, Any]]:
    """The current rewards of the newest `limit` trajectories of the policy (those rewarded), oldest first."""
    return await fetch(engine, _RECENT_REWARDS, {"policy": policy, "reward_name": reward_name, "limit": limit})


def trend(rows: list[dict[str, Any]], points: int = TREND_POINTS) -> list[float]:
    """Mean reward of consecutive, equal slices of `rows` (oldest first)."""
    values = [float(row["reward"]) for row in rows if row["reward"] is not None]
    if not values:
        return []
    size = max(1, -(-len(values) // points))
    return [sum(chunk) / len(chunk) for chunk in (values[i : i + size] for i in range(0, len(values), size))]


def reward_chart(
    rows: list[dict[str, Any]], names: dict[uuid.UUID, str], buckets: int = CHART_BUCKETS
) -> dict[str, Any]:
    """uPlot data: x = bucket start (unix s), one series per adapter version (mean reward, null when none)."""
    if not rows:
        return {"x": [], "series": []}
    start = rows[0]["last_call_at"].timestamp()
    end = rows[-1]["last_call_at"].timestamp()
    width = max((end - start) / buckets, 1.0)
    sums: dict[str, list[float]] = {}
    counts: dict[str, list[int]] = {}
    for row in rows:
        version = row["adapter_version_id"]
        label = names.get(version, str(version)[:8]) if version is not None else "base model"
        index = min(int((row["last_call_at"].timestamp() - start) / width), buckets - 1)
        sums.setdefault(label, [0.0] * buckets)[index] += float(row["reward"])
        counts.setdefault(label, [0] * buckets)[index] += 1
    series = [
        {"label": label, "values": [s / c if c else None for s, c in zip(sums[label], counts[label], strict=True)]}
        for label in sorted(sums)
    ]
    return {"x": [round(start + i * width) for i in range(buckets)], "series": series}


# ---------------------------------------------------------------- policy page


async def version_names(engine: AsyncEngine, ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    if not ids:
        return {}
    rows = await fetch(engine, "SELECT id, name FROM adapter_versions WHERE id = ANY(%s::uuid[])", (ids,))
    return {row["id"]: row["name"] for row in rows}


_VERSIONS = """
SELECT v.id, v.version, v.name, v.status, v.canary_share, v.created_at, v.updated_at, v.files_deleted_at,
       v.gates->>'outcome' AS gates, v.evaluation->>'verdict' AS verdict,
       p.name AS parent_name, r.mean_reward, r.samples
FROM adapter_versions v
LEFT JOIN adapter_versions p ON p.id = v.parent_version_id
LEFT JOIN training_runs r ON r.id = v.training_run_id
WHERE v.policy = %(policy)s AND (%(before)s::int IS NULL OR v.version < %(before)s)
ORDER BY v.version DESC LIMIT %(limit)s
"""


async def versions_page(engine: AsyncEngine, policy: str, before: int | None) -> tuple[list[dict[str, Any]], bool]:
    rows = await fetch(engine, _VERSIONS, {"policy": policy, "before": before, "limit": PAGE + 1})
    return rows[:PAGE], len(rows) > PAGE


_ANCESTRY = """
WITH RECURSIVE chain(id, name, version, status, parent_version_id, depth) AS (
    SELECT id, name, version, status, parent_version_id, 0 FROM adapter_versions WHERE id = %(start)s
    UNION ALL
    SELECT v.id, v.name, v.version, v.status, v.parent_version_id, c.depth + 1
    FROM adapter_versions v JOIN chain c ON v.id = c.parent_version_id WHERE c.depth < %(depth)s
)
SELECT id, name, version, status, parent_version_id FROM chain ORDER BY depth DESC
"""


async def ancestry(engine: AsyncEngine, start: uuid.UUID, depth: int = 12) -> list[dict[str, Any]]:
    """A version and its ancestors (parents), oldest first, at most `depth` steps back."""
    return await fetch(engine, _ANCESTRY, {"start": start, "depth": depth})


_RUNS = """
SELECT r.id, r.status, r.trigger, r.kind, r.started_at, r.finished_at, r.mean_reward, r.loss, r.kl,
       r.clip_fraction, r.samples, r.groups, r.trajectories, r.duration_s, r.error, v.name AS produced_name
FROM training_runs r
LEFT JOIN adapter_versions v ON v.id = r.produced_version_id
WHERE r.policy = %(policy)s AND (%(before)s::timestamptz IS NULL OR r.started_at < %(before)s)
  AND (%(kind)s::text IS NULL OR r.kind = %(kind)s)
ORDER BY r.started_at DESC LIMIT %(limit)s
"""

RUN_KINDS = ("rl", "sft")  # training_runs.kind (migration 0010): GRPO, distillation


async def runs_page(
    engine: AsyncEngine, policy: str, before: datetime | None, kind: str | None = None
) -> tuple[list[dict[str, Any]], bool]:
    """A page of the policy's training runs, newest first; `kind`: only runs of that kind."""
    rows = await fetch(engine, _RUNS, {"policy": policy, "before": before, "kind": kind, "limit": PAGE + 1})
    return rows[:PAGE], len(rows) > PAGE


_TRANSITIONS = """
SELECT t.id, t.from_status, t.to_status, t.actor, t.reason, t.created_at, v.name
FROM adapter_transitions t JOIN adapter_versions v ON v.id = t.adapter_version_id
WHERE t.policy = %(policy)s AND (%(before)s::bigint IS NULL OR t.id < %(before)s)
ORDER BY t.id DESC LIMIT %(limit)s
"""


async def transitions_page(engine: AsyncEngine, policy: str, before: int | None) -> tuple[list[dict[str, Any]], bool]:
    rows = await fetch(engine, _TRANSITIONS, {"policy": policy, "before": before, "limit": PAGE + 1})
    return rows[:PAGE], len(rows) > PAGE


# ---------------------------------------------------------------- version page

# What `provenance` and `lineage_head` need of a policy's other versions: the lineage and the
# promoted version (a handful of rows, ix_adapter_versions_policy_status), not all of them.
_LIVE_STATUSES = (VersionStatus.CANDIDATE, VersionStatus.CANARY, VersionStatus.PROMOTED)


async def version_detail(engine: AsyncEngine, settings: Settings, ref: str) -> VersionDetail:
    """`listing.version_detail` (what GET /v1/admin/versions/{ref} answers, the live evaluation of
    a canary included) without reading every version row of the policy: that read decodes each
    version's gates and evaluation and took about a second with 10,000 versions. It reads the
    version, its parent, the policy's candidates, canary and promoted version (all that the
    lineage, its head and the provenance depend on) and the names of the versions that sampled
    its training data."""
    version = await lifecycle.find_version(engine, ref)
    async with engine.connect() as connection:
        transitions = await lifecycle.transitions_of(connection, version.id)
        live = await lifecycle.versions_of(connection, version.policy, _LIVE_STATUSES)
        known = {v.id: v for v in live}
        known.setdefault(version.id, version)
        parent = version.parent_version_id
        if parent is not None and parent not in known:
            row = (await connection.execute(select(adapter_versions).where(adapter_versions.c.id == parent))).first()
            if row is not None:
                known[parent] = AdapterVersion.from_row(row)
        found = (await provenance(connection, [version], list(known.values())))[version.id]
    unnamed = [s.version_id for s in found.sampled_by if s.version_id is not None and s.version_id not in known]
    if unnamed:
        names = await version_names(engine, unnamed)
        samplers = [
            dataclasses.replace(s, name=names.get(s.version_id)) if s.version_id in names else s
            for s in found.sampled_by
        ]
        found = dataclasses.replace(found, sampled_by=sorted(samplers, key=lambda s: (-s.trajectories, s.name or "")))
    run = await training_run_of(engine, version)
    if version.status == VersionStatus.CANARY and settings.policy(version.policy) is not None:
        evaluated = await evaluate_canary(engine, settings, version)
        version = dataclasses.replace(version, evaluation=evaluated.document)
    return VersionDetail(version, run, transitions, found, lineage_head(live))


# ---------------------------------------------------------------- trajectories


@dataclass(frozen=True)
class TrajectoryFilter:
    policy: str | None = None
    version: str | None = None  # a version's LoRA name or id
    reward_min: float | None = None
    reward_max: float | None = None
    since: datetime | None = None
    until: datetime | None = None
    reward_name: str = "reward"


async def find_version_id(engine: AsyncEngine, ref: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(ref)
    except ValueError:
        rows = await fetch(engine, "SELECT id FROM adapter_versions WHERE name = %s", (ref,))
        return rows[0]["id"] if rows else None


_LIST_COLUMNS = """t.id, t.tenant, t.model, t.policy, t.client_trajectory_id, t.group_id, t.adapter_version_id,
       t.first_call_at, t.last_call_at, t.call_count"""

# The current reward (of the filter's name) of trajectory t: ix_rewards_slot, one probe.
_CURRENT_REWARD = """SELECT r.value FROM rewards r WHERE r.trajectory_id = t.id AND r.name = %(reward_name)s
    AND r.status = 'linked' AND r.superseded_at IS NULL ORDER BY r.observed_at DESC LIMIT 1"""


async def trajectories_page(
    engine: AsyncEngine, flt: TrajectoryFilter, after: tuple[datetime, uuid.UUID] | None
) -> tuple[list[dict[str, Any]], bool]:
    """Newest first by last call (merged aliases left out), keyset-paged on (last_call_at, id).

    Without a reward range: the newest trajectories that match, in index order
    (ix_trajectories_last_call, ix_trajectories_policy_last_call, ix_trajectories_version_last_call
    for a version; a time range bounds the same scan), 31 rows read.

    With a reward range, so that neither a common range nor one that the newest trajectories
    rarely reach (a policy that improved, a rare value) probes the reward of every trajectory back
    through the history (the planner cannot tell which, the rewards being correlated with time):
    1. the newest REWARD_SCAN trajectories that match the other filters, each with its current
       reward (one index probe each): done when a page of them is in the range, or when these
       were all the trajectories that match;
    2. else the range's current rewards are counted (ix_rewards_current_value, index only): with
       at most REWARD_FEW, their trajectories by id, newest first;
    3. with at most REWARD_ROWS, the index-ordered scan of 1 filtered through a hash of those
       rewards' trajectory ids, a fraction of a probe's cost per trajectory passed over (the whole
       history, 250,000 trajectories, in about 100 ms);
    4. with more (a range common in older history and rare in the newest), the probing scan of 1
       without its bound.
    """
    conditions = ["t.merged_into IS NULL"]
    params: dict[str, Any] = {"reward_name": flt.reward_name, "limit": PAGE + 1}
    if flt.policy:
        conditions.append("t.policy = %(policy)s")
        params["policy"] = flt.policy
    if flt.version:
        version_id = await find_version_id(engine, flt.version)
        if version_id is None:
            return [], False
        conditions.append("t.adapter_version_id = %(version_id)s")
        params["version_id"] = version_id
    if flt.since is not None:
        conditions.append("t.last_call_at >= %(since)s")
        params["since"] = flt.since
    if flt.until is not None:
        conditions.append("t.last_call_at < %(until)s")
        params["until"] = flt.until
    if after is not None:
        conditions.append("t.last_call_at <= %(after_at)s AND (t.last_call_at, t.id) < (%(after_at)s, %(after_id)s)")
        params["after_at"], params["after_id"] = after
    ranges = []
    if flt.reward_min is not None:
        ranges.append("value >= %(reward_min)s")
        params["reward_min"] = flt.reward_min
    if flt.reward_max is not None:
        ranges.append("value <= %(reward_max)s")
        params["reward_max"] = flt.reward_max
    where = " AND ".join(conditions)
    if not ranges:
        rows = await fetch(
            engine,
            f"""
SELECT {_LIST_COLUMNS}, v.name AS version_name, cr.value AS reward
FROM trajectories t
LEFT JOIN LATERAL ({_CURRENT_REWARD}) cr ON true
LEFT JOIN adapter_versions v ON v.id = t.adapter_version_id
WHERE {where}
ORDER BY t.last_call_at DESC, t.id DESC LIMIT %(limit)s
""",
            params,
        )
        return rows[:PAGE], len(rows) > PAGE
    in_range = " AND ".join(f"cr.{condition}" for condition in ranges)
    newest = f"SELECT {_LIST_COLUMNS} FROM trajectories t WHERE {where} ORDER BY t.last_call_at DESC, t.id DESC"
    scan = f"""
SELECT t.*, v.name AS version_name, cr.value AS reward
FROM ({newest} BOUND) t
JOIN LATERAL ({_CURRENT_REWARD}) cr ON true
LEFT JOIN adapter_versions v ON v.id = t.adapter_version_id
WHERE {in_range}
ORDER BY t.last_call_at DESC, t.id DESC LIMIT %(limit)s
"""
    params["scan"] = REWARD_SCAN
    rows = await fetch(engine, scan.replace("BOUND", "LIMIT %(scan)s"), params)
    if len(rows) > PAGE:
        return rows[:PAGE], True
    scanned = await fetch(engine, f"SELECT count(*) AS n FROM ({newest} LIMIT %(scan)s) t", params)
    if scanned[0]["n"] < REWARD_SCAN:  # every trajectory that matches the other filters was read
        return rows, False
    current = " AND ".join(
        ["x.name = %(reward_name)s", "x.status = 'linked'", "x.superseded_at IS NULL"]
        + [f"x.{condition}" for condition in ranges]
    )
    params["rows"] = REWARD_ROWS + 1
    counted = await fetch(
        engine, f"SELECT count(*) AS n FROM (SELECT 1 FROM rewards x WHERE {current} LIMIT %(rows)s) x", params
    )
    if counted[0]["n"] > REWARD_ROWS:
        rows = await fetch(engine, scan.replace("BOUND", ""), params)
        return rows[:PAGE], len(rows) > PAGE
    if counted[0]["n"] <= REWARD_FEW:
        # Each reward's trajectory by id (one current reward per trajectory and name: tables.rewards).
        rows = await fetch(
            engine,
            f"""
SELECT h.*, v.name AS version_name
FROM (
    SELECT t.*, x.value AS reward
    FROM (SELECT x.trajectory_id, x.value FROM rewards x WHERE {current}) x
    JOIN LATERAL (SELECT {_LIST_COLUMNS} FROM trajectories t WHERE t.id = x.trajectory_id AND {where} LIMIT 1) t ON true
    ORDER BY t.last_call_at DESC, t.id DESC LIMIT %(limit)s
) h
LEFT JOIN adapter_versions v ON v.id = h.adapter_version_id
ORDER BY h.last_call_at DESC, h.id DESC
""",
            params,
        )
        return rows[:PAGE], len(rows) > PAGE
    # "IN (...) OR false" is not made a join (PostgreSQL only turns a top-level IN into one): it
    # stays a filter on the index-ordered scan, a hashed SubPlan (the LIMIT in `m` keeps its
    # estimated size in work_mem), so the scan stops at the page's end instead of sorting matches.
    rows = await fetch(
        engine,
        f"""
WITH m AS MATERIALIZED (SELECT x.trajectory_id FROM rewards x WHERE {current} LIMIT %(rows)s)
SELECT {_LIST_COLUMNS}, v.name AS version_name, cr.value AS reward
FROM trajectories t
JOIN LATERAL ({_CURRENT_REWARD}) cr ON true
LEFT JOIN adapter_versions v ON v.id = t.adapter_version_id
WHERE {where} AND (t.id IN (SELECT m.trajectory_id FROM m) OR false) AND {in_range}
ORDER BY t.last_call_at DESC, t.id DESC LIMIT %(limit)s
""",
        params,
        work_mem="16MB",
    )
    return rows[:PAGE], len(rows) > PAGE


async def reward_sources(engine: AsyncEngine, reward_ids: list[uuid.UUID]) -> dict[uuid.UUID, dict[str, Any]]:
    """Each reward's source and, for a judge's score, its judgement (judge model, rubric, status)."""
    if not reward_ids:
        return {}
    rows = await fetch(
        engine,
        "SELECT r.id, r.source, r.judgement_id, j.judge_model, j.rubric_hash, j.status AS judgement_status "
        "FROM rewards r LEFT JOIN judgements j ON j.id = r.judgement_id WHERE r.id = ANY(%s::uuid[])",
        (reward_ids,),
    )
    return {row["id"]: row for row in rows}


# ---------------------------------------------------------------- rewards not linked


_PENDING = """
SELECT r.id, r.tenant, r.target_kind, r.target, r.name, r.value, r.source, r.received_at, r.observed_at,
       r.received_at < now() - make_interval(secs => %(window_s)s) AS overdue
FROM rewards r
WHERE r.status = 'pending' AND (NOT %(overdue_only)s OR r.received_at < now() - make_interval(secs => %(window_s)s))
  AND (%(after_at)s::timestamptz IS NULL OR (r.received_at, r.id) > (%(after_at)s, %(after_id)s::uuid))
ORDER BY r.received_at, r.id LIMIT %(limit)s
"""

_PENDING_COUNTS = """
SELECT count(*) AS pending,
       count(*) FILTER (WHERE received_at < now() - make_interval(secs => %(window_s)s)) AS overdue
FROM rewards WHERE status = 'pending'
"""


async def pending_rewards(
    engine: AsyncEngine, *, window_s: float, overdue_only: bool, after: tuple[datetime, uuid.UUID] | None
) -> tuple[list[dict[str, Any]], bool, dict[str, int]]:
    """Pending rewards oldest first (ix_rewards_pending), keyset-paged, and how many are pending and overdue."""
    params = {
        "window_s": window_s,
        "overdue_only": overdue_only,
        "after_at": after[0] if after else None,
        "after_id": after[1] if after else None,
        "limit": PAGE + 1,
    }
    rows = await fetch(engine, _PENDING, params)
    counts = (await fetch(engine, _PENDING_COUNTS, {"window_s": window_s}))[0]
    return rows[:PAGE], len(rows) > PAGE, {"pending": counts["pending"], "overdue": counts["overdue"]}
