"""Judgements in PostgreSQL: which groups wait for the judge, claiming one, recording the outcome.

Invariants:
- The same trajectories are judged at most once per judge model and rubric
  (`uq_judgements_members`: the md5 of the sorted ids). A group with new quiet members (late
  attempts, the same task run again) is judged again with its members not yet judged twice
  (groups_to_judge: each member at most MAX_JUDGEMENTS_PER_MEMBER times, once the new members
  are half of them or have waited); newer scores replace older ones (latest wins), and each
  judgement's scores are on one scale. A claim inserts the row as 'running' with a lease;
  a row still 'running' after its lease (its process died) may be claimed again, nothing else.
- Concurrency and the budget hold across every gateway process: a claim runs under a
  transaction-scoped advisory lock of the policy, counts the running claims and the last
  hour's calls and tokens, and only then inserts.
- Scores become rewards through the reward store (gateway/store/rewards.py) like any other
  reward, each under the idempotency key `judge:<judgement>:<trajectory>`, before the
  judgement is marked 'judged': a crash in between re-judges, never loses the scores.
- The judge's own calls (client trajectory ids starting with JUDGE_TRAJECTORY_PREFIX) are
  never judged, and the learner never trains on them.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.grouping import JUDGE_TRAJECTORY_PREFIX, group_name, task_key
from apprentice.settings import JudgeSettings, PolicySettings
from gateway.store.connection import driver_connection
from gateway.store.rewards import NewReward, ingest_rewards, lock_key

BUDGET_WINDOW_S = 3600.0
SCAN_LIMIT = 5000

_CANDIDATES = """
SELECT t.id::text AS id, t.tenant, t.group_id, extract(epoch FROM t.last_call_at)::float8 AS last_call_at,
       fc.request->'messages' AS messages, fc.request->'tools' AS tools,
       EXISTS (SELECT 1 FROM rewards r WHERE r.trajectory_id = t.id AND r.name = %(webhook_name)s
               AND r.status = 'linked' AND r.superseded_at IS NULL) AS has_webhook
FROM trajectories t
LEFT JOIN LATERAL (SELECT c.request FROM calls c WHERE c.trajectory_id = t.id
                   AND c.created_at BETWEEN t.first_call_at - interval '1 day'
                                        AND t.last_call_at + interval '1 day'  -- prunes partitions
                   ORDER BY c.created_at, c.id LIMIT 1) fc ON true
WHERE t.policy = %(policy)s AND t.merged_into IS NULL AND t.trained_in_run_id IS NULL AND t.trainable
  AND (t.client_trajectory_id IS NULL OR t.client_trajectory_id NOT LIKE 'apprentice-judge:%%')
  AND t.last_call_at >= now() - make_interval(secs => %(max_age_s)s)
  AND t.last_call_at < now() - make_interval(secs => %(wait_s)s)
ORDER BY t.first_call_at, t.id
LIMIT %(limit)s
"""

# How many times this judge and rubric judged each of some trajectories (any outcome).
_JUDGED_IDS = """
SELECT m::text AS id, count(*) AS times FROM judgements j, unnest(j.trajectory_ids) AS m
WHERE j.policy = %(policy)s AND j.judge_model = %(model)s AND j.rubric_hash = %(rubric_hash)s
  AND j.trajectory_ids && %(ids)s::uuid[] AND m = ANY(%(ids)s::uuid[])
GROUP BY m
"""

# A trajectory is put before the judge at most this many times (a trickling group: each member
# judged when it arrives, and once more beside a later one), so judging a group of n members
# arriving one by one costs at most 2 n member-judgings, not about n^2 / 2.
MAX_JUDGEMENTS_PER_MEMBER = 2

_JUDGED_KEYS = """
SELECT members_key FROM judgements
WHERE policy = %(policy)s AND judge_model = %(model)s AND rubric_hash = %(rubric_hash)s
  AND members_key = ANY(%(keys)s::text[])
"""

_USAGE = """
SELECT coalesce(sum(attempts), 0)::bigint AS calls,
       coalesce(sum(prompt_tokens + completion_tokens), 0)::bigint AS tokens,
       count(*) FILTER (WHERE status = 'running' AND lease_until > now()) AS running,
       extract(epoch FROM min(started_at))::float8 AS oldest
FROM judgements
WHERE policy = %(policy)s AND started_at >= now() - make_interval(secs => %(window_s)s)
"""

_CLAIM = """
INSERT INTO judgements AS j (id, policy, tenant, group_key, chunk, members_key, judge_model, rubric_hash, mode,
                             status, trajectory_ids, judge_trajectory, lease_until)
VALUES (%(id)s, %(policy)s, %(tenant)s, %(group_key)s, %(chunk)s, %(members_key)s, %(model)s, %(rubric_hash)s,
        %(mode)s, 'running',
        %(trajectory_ids)s::uuid[], %(judge_trajectory)s, now() + make_interval(secs => %(lease_s)s))
ON CONFLICT (policy, judge_model, rubric_hash, members_key) DO UPDATE
SET id = excluded.id, trajectory_ids = excluded.trajectory_ids, judge_trajectory = excluded.judge_trajectory,
    lease_until = excluded.lease_until, started_at = now(), attempts = 0, prompt_tokens = 0, completion_tokens = 0
WHERE j.status = 'running' AND j.lease_until < now()
RETURNING j.id
"""

_CALLS = """
SELECT c.trajectory_id::text AS trajectory_id, c.request, c.response
FROM calls c WHERE c.trajectory_id = ANY(%(ids)s::uuid[]) AND c.status_code = 200 AND c.response IS NOT NULL
ORDER BY c.trajectory_id, c.created_at, c.id
"""


@dataclass(frozen=True, slots=True)
class GroupChunk:
    """Trajectories of one group to judge together (a large group is split into chunks)."""

    tenant: str
    group_key: str
    chunk: int
    trajectory_ids: list[str]

    @property
    def members_key(self) -> str:
        """md5 of the sorted ids, as migration 0008 computes it: the judgement's identity."""
        return hashlib.md5(",".join(sorted(self.trajectory_ids)).encode(), usedforsecurity=False).hexdigest()


@dataclass(frozen=True, slots=True)
class Claim:
    judgement_id: uuid.UUID
    group: GroupChunk

    @property
    def judge_trajectory(self) -> str:
        return f"{JUDGE_TRAJECTORY_PREFIX}{self.judgement_id}"


@dataclass(frozen=True, slots=True)
class Usage:
    """The last hour's judging of a policy against its budget."""

    calls: int
    tokens: int
    running: int
    calls_limit: int | None
    tokens_limit: int | None
    resumes_at: float | None  # unix seconds when the oldest counted judgement leaves the window

    @property
    def exhausted(self) -> bool:
        return (self.calls_limit is not None and self.calls >= self.calls_limit) or (
            self.tokens_limit is not None and self.tokens >= self.tokens_limit
        )


def _over_budget(judge: JudgeSettings, calls: int, tokens: int) -> bool:
    budget = judge.budget
    return (budget.calls_per_hour is not None and calls >= budget.calls_per_hour) or (
        budget.tokens_per_hour is not None and tokens >= budget.tokens_per_hour
    )


@dataclass(slots=True)
class ClaimOutcome:
    claims: list[Claim] = field(default_factory=list)
    budget_exhausted: bool = False
    busy: bool = False  # the policy's concurrency is taken


def split_chunks(ids: Sequence[str], max_size: int) -> list[list[str]]:
    """Balanced chunks of at most max_size (9 with 8 -> 5 and 4: never a chunk of one alone)."""
    count = -(-len(ids) // max_size)
    size, extra = divmod(len(ids), count) if count else (0, 0)
    chunks, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        chunks.append(list(ids[start:end]))
        start = end
    return chunks


def groups_to_judge(
    rows: Sequence[dict[str, Any]],
    judged: Mapping[str, int],
    *,
    mode: str,
    max_group_size: int,
    settled_before: float = float("inf"),
) -> list[GroupChunk]:
    """Quiet candidate trajectories -> the chunks to judge now.

    Per group (apprentice/grouping.py), `judged` says how many times each member was judged.
    A member judged MAX_JUDGEMENTS_PER_MEMBER times is final; the others (eligible) are judged
    together, in balanced chunks of at most max_group_size, when the new members (never judged)
    are at least half of them, or when every new member has been quiet since `settled_before`
    (unix seconds: it waited a while for company and none came). So a group whose members
    arrive one by one is judged in overlapping pairs or small sets, each member at most twice,
    never the whole group again at every arrival (about n^2 / max_group_size judge calls for n
    members). A member's current score is the one of its latest judgement (latest wins), and the
    learner trains the members of each judgement as one GRPO group. Judging as members become
    quiet, rather than waiting for a whole group to be, keeps a task that recurs under
    continuous traffic from never being judged. In mode "missing" a group whose members all have
    a webhook reward is left alone.
    """
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        key = group_name(row["group_id"], task_key(row["messages"] or [], row["tools"]))
        groups.setdefault((row["tenant"], key), []).append(row)
    ready = []
    for (tenant, key), members in groups.items():
        eligible = [m for m in members if judged.get(m["id"], 0) < MAX_JUDGEMENTS_PER_MEMBER]
        new = [m for m in eligible if m["id"] not in judged]
        if len(eligible) < 2 or not new:
            continue
        if mode == "missing" and all(m["has_webhook"] for m in members):
            continue
        settled = all(m["last_call_at"] < settled_before for m in new)
        if 2 * len(new) < len(eligible) and not settled:
            continue
        for index, chunk in enumerate(split_chunks([m["id"] for m in eligible], max_group_size)):
            ready.append(GroupChunk(tenant, key, index, chunk))
    return ready


class _Cursor:
    """A dict-row cursor in one transaction on a pooled connection."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def __aenter__(self) -> psycopg.AsyncCursor[dict[str, Any]]:
        self._connection = self.engine.connect()
        pg = await driver_connection(await self._connection.__aenter__())
        self._transaction = pg.transaction()
        await self._transaction.__aenter__()
        self._cursor = pg.cursor(row_factory=dict_row)
        cursor = await self._cursor.__aenter__()
        # A plan over every partition of calls (docs/history.md) is costed high enough to trigger
        # JIT, whose compilation takes seconds for queries that run in milliseconds.
        await cursor.execute("SET LOCAL jit = off")
        return cursor

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self._cursor.__aexit__(*exc)
            await self._transaction.__aexit__(*exc)
        finally:
            await self._connection.__aexit__(*exc)


async def find_ready_groups(
    engine: AsyncEngine, policy: PolicySettings, judge: JudgeSettings, rubric_hash: str
) -> list[GroupChunk]:
    """The group chunks of a policy that are ready and not yet judged by this judge and rubric."""
    async with _Cursor(engine) as cursor:
        await cursor.execute(
            _CANDIDATES,
            {
                "policy": policy.name,
                "webhook_name": policy.learning.reward_name,
                "max_age_s": policy.learning.max_age_s,
                "wait_s": policy.judge_wait_s,
                "limit": SCAN_LIMIT,
            },
        )
        rows = await cursor.fetchall()
        if not rows:
            return []
        scope = {"policy": policy.name, "model": judge.model, "rubric_hash": rubric_hash}
        await cursor.execute(_JUDGED_IDS, {**scope, "ids": [r["id"] for r in rows]})
        judged = {r["id"]: int(r["times"]) for r in await cursor.fetchall()}
        # New members wait one more judge wait for company before they are judged beside
        # members judged already.
        ready = groups_to_judge(
            rows,
            judged,
            mode=judge.mode,
            max_group_size=judge.max_group_size,
            settled_before=time.time() - 2 * policy.judge_wait_s,
        )
        if not ready:
            return []
        await cursor.execute(_JUDGED_KEYS, {**scope, "keys": sorted({g.members_key for g in ready})})
        done = {r["members_key"] for r in await cursor.fetchall()}
    return [g for g in ready if g.members_key not in done]


async def _usage(cursor: psycopg.AsyncCursor[dict[str, Any]], policy: str, judge: JudgeSettings) -> Usage:
    await cursor.execute(_USAGE, {"policy": policy, "window_s": BUDGET_WINDOW_S})
    row = await cursor.fetchone()
    assert row is not None  # an aggregate returns one row
    oldest = row["oldest"]
    return Usage(
        calls=int(row["calls"]),
        tokens=int(row["tokens"]),
        running=int(row["running"]),
        calls_limit=judge.budget.calls_per_hour,
        tokens_limit=judge.budget.tokens_per_hour,
        resumes_at=oldest + BUDGET_WINDOW_S if oldest is not None else None,
    )


async def usage(engine: AsyncEngine, policy: str, judge: JudgeSettings) -> Usage:
    """The last hour's judge calls and tokens of a policy, and its budget."""
    async with _Cursor(engine) as cursor:
        return await _usage(cursor, policy, judge)


async def claim(
    engine: AsyncEngine,
    policy: PolicySettings,
    judge: JudgeSettings,
    rubric_hash: str,
    groups: Sequence[GroupChunk],
    *,
    mode: str,
    lease_s: float,
    respect_limits: bool = True,
) -> ClaimOutcome:
    """Claim as many of `groups` as the policy's concurrency and budget allow (all processes)."""
    outcome = ClaimOutcome()
    async with _Cursor(engine) as cursor:
        await cursor.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(b"judge", policy.name),))
        current = await _usage(cursor, policy.name, judge)
        running, calls = current.running, current.calls  # each claim below reserves one call
        for group in groups:
            if respect_limits and _over_budget(judge, calls, current.tokens):
                outcome.budget_exhausted = True
                break
            if respect_limits and running >= judge.concurrency:
                outcome.busy = True
                break
            judgement_id = uuid.uuid4()
            await cursor.execute(
                _CLAIM,
                {
                    "id": judgement_id,
                    "policy": policy.name,
                    "tenant": group.tenant,
                    "group_key": group.group_key,
                    "chunk": group.chunk,
                    "members_key": group.members_key,
                    "model": judge.model,
                    "rubric_hash": rubric_hash,
                    "mode": mode,
                    "trajectory_ids": group.trajectory_ids,
                    "judge_trajectory": f"{JUDGE_TRAJECTORY_PREFIX}{judgement_id}",
                    "lease_s": lease_s,
                },
            )
            if await cursor.fetchone() is not None:
                outcome.claims.append(Claim(judgement_id, group))
                running += 1
                calls += 1  # reserve the first call of the claim against the calls budget
    return outcome


async def load_calls(engine: AsyncEngine, trajectory_ids: Sequence[str]) -> dict[str, list[tuple[Any, Any]]]:
    """Each trajectory's answered (request, response) pairs in call order."""
    out: dict[str, list[tuple[Any, Any]]] = {tid: [] for tid in trajectory_ids}
    async with _Cursor(engine) as cursor:
        await cursor.execute(_CALLS, {"ids": list(trajectory_ids)})
        for row in await cursor.fetchall():
            out[row["trajectory_id"]].append((row["request"], row["response"]))
    return out


async def record_attempt(
    engine: AsyncEngine, judgement_id: uuid.UUID, *, prompt_tokens: int, completion_tokens: int, lease_s: float
) -> None:
    """Count one judge call against the budget, and extend the lease."""
    async with _Cursor(engine) as cursor:
        await cursor.execute(
            "UPDATE judgements SET attempts = attempts + 1, prompt_tokens = prompt_tokens + %s, "
            "completion_tokens = completion_tokens + %s, lease_until = now() + make_interval(secs => %s) "
            "WHERE id = %s",
            (prompt_tokens, completion_tokens, lease_s, judgement_id),
        )


async def record_scores(
    engine: AsyncEngine,
    claim: Claim,
    *,
    reward_name: str,
    scores: dict[str, tuple[float, str]],
    answer: dict[str, Any],
    max_comment_chars: int,
) -> None:
    """Store the scores as rewards (source 'judge'), then mark the judgement judged."""
    rewards = [
        NewReward(
            id=uuid.uuid4(),
            tenant=claim.group.tenant,
            target_kind="trajectory",
            target=trajectory_id,
            target_trajectory_id=uuid.UUID(trajectory_id),
            target_call=None,
            name=reward_name,
            value=value,
            metrics={},
            comment=explanation[:max_comment_chars] or None,
            group_id=None,
            idempotency_key=f"judge:{claim.judgement_id}:{trajectory_id}",
            source="judge",
            api_key_id=None,
            observed_at=time.time(),
            judgement_id=claim.judgement_id,
        )
        for trajectory_id, (value, explanation) in scores.items()
    ]
    await ingest_rewards(engine, rewards, check=lambda _targets: None)
    await finish(engine, claim.judgement_id, status="judged", reason=None, answer=answer)


async def finish(
    engine: AsyncEngine, judgement_id: uuid.UUID, *, status: str, reason: str | None, answer: dict[str, Any] | None
) -> None:
    async with _Cursor(engine) as cursor:
        await cursor.execute(
            "UPDATE judgements SET status = %s, reason = %s, answer = %s, finished_at = now(), lease_until = NULL "
            "WHERE id = %s",
            (status, reason, Jsonb(answer) if answer is not None else None, judgement_id),
        )


async def judgement_of_members(
    engine: AsyncEngine, policy: str, judge_model: str, rubric_hash: str, members_key: str
) -> dict[str, Any] | None:
    """The judgement of exactly these trajectories by one judge and rubric, if there is one."""
    async with _Cursor(engine) as cursor:
        await cursor.execute(
            "SELECT * FROM judgements WHERE policy = %s AND judge_model = %s AND rubric_hash = %s AND members_key = %s",
            (policy, judge_model, rubric_hash, members_key),
        )
        return await cursor.fetchone()


_POLICY_TRAJECTORIES = """
SELECT t.id::text AS id, t.tenant, t.group_id, extract(epoch FROM t.last_call_at)::float8 AS last_call_at,
       fc.request->'messages' AS messages, fc.request->'tools' AS tools, false AS has_webhook
FROM trajectories t
LEFT JOIN LATERAL (SELECT c.request FROM calls c WHERE c.trajectory_id = t.id
                   AND c.created_at BETWEEN t.first_call_at - interval '1 day'
                                        AND t.last_call_at + interval '1 day'  -- prunes partitions
                   ORDER BY c.created_at, c.id LIMIT 1) fc ON true
WHERE t.policy = %(policy)s AND t.merged_into IS NULL AND t.trainable
  AND (t.client_trajectory_id IS NULL OR t.client_trajectory_id NOT LIKE 'apprentice-judge:%%')
  AND (%(tenant)s::text IS NULL OR t.tenant = %(tenant)s)
  AND t.last_call_at >= now() - make_interval(secs => %(max_age_s)s)
ORDER BY t.first_call_at, t.id
LIMIT %(limit)s
"""


async def find_group(
    engine: AsyncEngine, policy: PolicySettings, max_group_size: int, group: str, tenant: str | None
) -> list[GroupChunk]:
    """The chunks of the one group named by `group`: a client group id, a task hash, or the id
    of one of its trajectories (trained ones included: this is for rubric work)."""
    async with _Cursor(engine) as cursor:
        await cursor.execute(
            _POLICY_TRAJECTORIES,
            {"policy": policy.name, "tenant": tenant, "max_age_s": policy.learning.max_age_s, "limit": SCAN_LIMIT},
        )
        rows = await cursor.fetchall()
    keyed: dict[tuple[str, str], list[dict[str, Any]]] = {}
    wanted: set[tuple[str, str]] = set()
    for row in rows:
        task = task_key(row["messages"] or [], row["tools"])
        named = (row["tenant"], group_name(row["group_id"], task))
        keyed.setdefault(named, []).append(row)
        if group in (row["id"], row["group_id"], task):
            wanted.add(named)
    if len(wanted) > 1:
        tenants = ", ".join(sorted({t for t, _ in wanted}))
        raise LookupError(f"group {group!r} exists in several tenants ({tenants}): name one with --tenant")
    if not wanted:
        return []
    ((tenant_name, key),) = wanted
    ids = [m["id"] for m in keyed[(tenant_name, key)]]
    return [GroupChunk(tenant_name, key, i, c) for i, c in enumerate(split_chunks(ids, max_group_size))]


async def status_counts(engine: AsyncEngine, policy: str) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """(judgements by status, the ten latest failures) of a policy, for the admin API."""
    async with _Cursor(engine) as cursor:
        await cursor.execute(
            "SELECT status, count(*) AS n FROM judgements WHERE policy = %s GROUP BY status", (policy,)
        )
        counts = {"running": 0, "judged": 0, "failed": 0}
        counts.update({row["status"]: int(row["n"]) for row in await cursor.fetchall()})
        await cursor.execute(
            "SELECT id, tenant, group_key, chunk, judge_model, rubric_hash, reason, attempts, finished_at "
            "FROM judgements WHERE policy = %s AND status = 'failed' ORDER BY finished_at DESC LIMIT 10",
            (policy,),
        )
        return counts, list(await cursor.fetchall())
