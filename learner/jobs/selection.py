"""Which trajectories a learner run trains on, read from PostgreSQL.

Rewarded trajectories of the policy (current reward of the configured name), not trained on
yet, not merged into another, whose last call is within `max_age_s`; newest first, at most
`max_trajectories`. Each trajectory's calls are read in order and checked:

- Served by this policy's own base model: every answered call went to the base model itself
  (`upstream_model` = the policy's `base_model`, adapter version NULL) or to one of the
  policy's adapter versions of that base (`adapter_version_id`, or an `upstream_model` equal
  to a version's LoRA name). A call that went elsewhere (another model family, e.g. a
  fallback to a hosted model) makes the trajectory no GRPO data: its tokens are not this
  model's, and its logprobs mean nothing here. Such trajectories are left untouched (kept for
  later uses such as distillation) and counted.
- Sampled along the training lineage, not too long ago: every call was served by the lineage
  head (apprentice.promotion.lineage: the version the run continues) or by one of its
  ancestors at most `max_staleness` versions back along parent_version_id (the base model
  is the root). A trajectory sampled elsewhere -- by a rejected branch ("off_lineage") or
  further back ("too_stale") -- is never trained on: the run consumes it (marks it with its
  id) and counts it by reason, so it does not pile up. What staleness remains within the
  bound is corrected by the trainer's truncated importance weights (tis_cap). Why a bound
  (4 by default): the weights correct only while sampler and trainer overlap; each version
  drifts a little further, and far enough back most weights sit at the cap, so the data adds
  bias, not signal (docs/learner.md, "The training lineage").
- Recent unrewarded trajectories are read too, only to learn their groups: a group whose
  rewards are still arriving waits (see grouping.classify).

Pure reads, no locks: the run's advisory lock keeps other learners of the policy away, and
rows this reads may change meanwhile without harm (a late reward is used next time).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

from apprentice.promotion.lineage import ancestors, lineage_head
from apprentice.promotion.rows import AdapterVersion
from learner.grpo.grouping import Member, completion_key, is_greedy, task_key
from learner.grpo.tokens import CallRecord, TokenizationError, parse_call

_REWARDED = """
SELECT t.id::text AS id, t.tenant, t.group_id, extract(epoch FROM t.last_call_at)::float8 AS last_call_at,
       r.value AS reward
FROM trajectories t
JOIN rewards r ON r.trajectory_id = t.id AND r.name = %(reward_name)s AND r.status = 'linked'
              AND r.superseded_at IS NULL
WHERE t.policy = %(policy)s AND t.trained_in_run_id IS NULL AND t.merged_into IS NULL
  AND t.last_call_at >= now() - make_interval(secs => %(max_age_s)s)
ORDER BY t.last_call_at DESC
LIMIT %(limit)s
"""

# Unrewarded recent trajectories: only their group matters (is the group still filling up?).
_WAITING = """
SELECT t.id::text AS id, t.tenant, t.group_id, extract(epoch FROM t.last_call_at)::float8 AS last_call_at,
       fc.request
FROM trajectories t
LEFT JOIN LATERAL (SELECT c.request FROM calls c WHERE c.trajectory_id = t.id
                   ORDER BY c.created_at, c.id LIMIT 1) fc ON true
WHERE t.policy = %(policy)s AND t.trained_in_run_id IS NULL AND t.merged_into IS NULL
  AND t.last_call_at >= now() - make_interval(secs => %(wait_s)s)
  AND NOT EXISTS (SELECT 1 FROM rewards r WHERE r.trajectory_id = t.id AND r.name = %(reward_name)s
                  AND r.status = 'linked' AND r.superseded_at IS NULL)
LIMIT %(limit)s
"""

_CALLS = """
SELECT c.trajectory_id::text AS trajectory_id, c.status_code, c.upstream_model, c.adapter_version_id::text AS version,
       c.temperature, c.request, c.response
FROM calls c WHERE c.trajectory_id = ANY(%(ids)s::uuid[])
ORDER BY c.trajectory_id, c.created_at, c.id
"""

_VERSIONS = "SELECT * FROM adapter_versions WHERE policy = %(policy)s"


@dataclass
class Version:
    """What selection and training need of a version, keyed by its id as text (as calls record it)."""

    id: str
    name: str
    status: str
    base_model: str
    path: str
    files_deleted: bool

    @classmethod
    def of(cls, row: AdapterVersion) -> Version:
        return cls(str(row.id), row.name, row.status.value, row.base_model, row.path, row.files_deleted_at is not None)


@dataclass
class Candidate:
    """A rewarded trajectory that may train: its calls parsed, its grouping facts."""

    member: Member
    calls: list[CallRecord]


@dataclass
class Lineage:
    """The version a run continues and which versions' samples it may train on."""

    head: AdapterVersion | None  # None: the base model
    recent: set[str | None]  # the head and its ancestors within max_staleness (None: the base model)
    older: set[str | None]  # its ancestors further back

    @classmethod
    def of(cls, rows: list[AdapterVersion], max_staleness: int) -> Lineage:
        head = lineage_head(rows)
        chain = [str(v) if v is not None else None for v in ancestors(head, rows, len(rows) + 1)]
        return cls(head, set(chain[: max_staleness + 1]), set(chain[max_staleness + 1 :]))

    def staleness(self, calls: list[CallRecord]) -> str | None:
        """None when every call was sampled within the bound, else why the trajectory cannot train."""
        outside = {call.version for call in calls} - self.recent
        if not outside:
            return None
        return "too_stale" if outside <= self.older else "off_lineage"


@dataclass
class Selection:
    now: float
    candidates: dict[str, Candidate] = field(default_factory=dict)
    waiting: list[Member] = field(default_factory=list)
    versions: dict[str, Version] = field(default_factory=dict)
    lineage: Lineage = field(default_factory=lambda: Lineage(None, {None}, set()))
    skipped: dict[str, int] = field(default_factory=dict)
    stale: dict[str, str] = field(default_factory=dict)  # trajectory id -> off_lineage | too_stale: consumed

    @property
    def stale_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for reason in self.stale.values():
            counts[reason] = counts.get(reason, 0) + 1
        return counts

    @property
    def members(self) -> list[Member]:
        return [c.member for c in self.candidates.values()] + self.waiting

    def version_paths(self) -> dict[str, str]:
        """Saved weights of every version that may have sampled data (for behaviour logprobs)."""
        return {v.id: v.path for v in self.versions.values() if not v.files_deleted}

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def served_by(row: dict[str, Any], base_model: str, versions: dict[str, Version]) -> tuple[bool, str | None]:
    """(of this policy's model family?, adapter version id or None for the base) for one call."""
    if row["version"]:
        version = versions.get(row["version"])
        return (version is not None and version.base_model == base_model), row["version"]
    if row["upstream_model"] == base_model:
        return True, None
    for version in versions.values():
        if version.name == row["upstream_model"] and version.base_model == base_model:
            return True, version.id
    return False, None


def _answer_key(call: CallRecord) -> Any:
    if call.completion_ids:
        return call.completion_ids
    return [call.answer.get("content"), call.answer.get("tool_calls")]


def build_candidate(
    trajectory: dict[str, Any], rows: list[dict[str, Any]], base_model: str, versions: dict[str, Version]
) -> tuple[Candidate | None, str | None]:
    """A trajectory and its calls rows -> a Candidate, or None and the reason it cannot train."""
    answered = [r for r in rows if r["status_code"] == 200 and r["response"]]
    if not answered:
        return None, "no_answered_calls"
    calls: list[CallRecord] = []
    for index, row in enumerate(answered):
        family, version = served_by(row, base_model, versions)
        if not family:
            return None, "other_model"
        following = answered[index + 1]["request"] if index + 1 < len(answered) else None
        try:
            calls.append(parse_call(row["request"], row["response"], row["temperature"], version, following))
        except TokenizationError:
            return None, "unreadable_call"
    first = answered[0]["request"]
    member = Member(
        trajectory_id=trajectory["id"],
        tenant=trajectory["tenant"],
        reward=trajectory["reward"],
        group_id=trajectory["group_id"],
        task_key=task_key(first.get("messages") or [], first.get("tools")),
        greedy=any(is_greedy(r["temperature"]) for r in answered),
        completion_key=completion_key(_answer_key(c) for c in calls),
        last_call_at=trajectory["last_call_at"],
    )
    return Candidate(member, calls), None


def load_versions(connection: psycopg.Connection, policy: str) -> list[AdapterVersion]:
    with connection.cursor(row_factory=dict_row) as cursor:
        cursor.execute(_VERSIONS, {"policy": policy})
        return [AdapterVersion.from_row(r) for r in cursor.fetchall()]


def select(connection: psycopg.Connection, policy: str, base_model: str, learning: Any) -> Selection:
    """Read the candidates of one learner run (see the module docstring)."""
    with connection.cursor(row_factory=dict_row) as cursor:
        cursor.execute("SELECT extract(epoch FROM now())::float8 AS now")
        clock = cursor.fetchone()
        assert clock is not None  # SELECT now() always returns its one row
        selection = Selection(now=clock["now"])
        rows = load_versions(connection, policy)
        selection.versions = {str(row.id): Version.of(row) for row in rows}
        selection.lineage = Lineage.of(rows, learning.max_staleness)
        params = {
            "policy": policy,
            "reward_name": learning.reward_name,
            "max_age_s": learning.max_age_s,
            "limit": learning.max_trajectories,
            "wait_s": learning.reward_wait_s,
        }
        cursor.execute(_REWARDED, params)
        trajectories = cursor.fetchall()
        cursor.execute(_CALLS, {"ids": [t["id"] for t in trajectories]})
        calls: dict[str, list[dict[str, Any]]] = {}
        for row in cursor.fetchall():
            calls.setdefault(row["trajectory_id"], []).append(row)
        for trajectory in trajectories:
            candidate, reason = build_candidate(
                trajectory, calls.get(trajectory["id"], []), base_model, selection.versions
            )
            if candidate is None:
                selection.skip(reason or "unknown")
            elif (stale := selection.lineage.staleness(candidate.calls)) is not None:
                selection.stale[trajectory["id"]] = stale
            else:
                selection.candidates[trajectory["id"]] = candidate
        if learning.reward_wait_s > 0:
            cursor.execute(_WAITING, params)
            for row in cursor.fetchall():
                request = row["request"] or {}
                selection.waiting.append(
                    Member(
                        trajectory_id=row["id"],
                        tenant=row["tenant"],
                        reward=None,
                        group_id=row["group_id"],
                        task_key=task_key(request.get("messages") or [], request.get("tools")),
                        last_call_at=row["last_call_at"],
                    )
                )
    return selection


_NEW_GROUPS = """
SELECT count(DISTINCT coalesce('g:' || t.group_id, 't:' || md5(coalesce(fc.request->'messages', 'null'::jsonb)::text
                                                          || coalesce(fc.request->'tools', 'null'::jsonb)::text)))
FROM trajectories t
JOIN rewards r ON r.trajectory_id = t.id AND r.name = %(reward_name)s AND r.status = 'linked'
              AND r.superseded_at IS NULL
LEFT JOIN LATERAL (SELECT c.request FROM calls c WHERE c.trajectory_id = t.id
                   ORDER BY c.created_at, c.id LIMIT 1) fc ON true
WHERE t.policy = %(policy)s AND t.trained_in_run_id IS NULL AND t.merged_into IS NULL
  AND t.last_call_at >= now() - make_interval(secs => %(max_age_s)s)
"""


def count_new_groups(connection: psycopg.Connection, policy: str, learning: Any) -> int:
    """About how many groups of rewarded, untrained trajectories wait (cheap; for the trigger)."""
    with connection.cursor() as cursor:
        cursor.execute(
            _NEW_GROUPS, {"policy": policy, "reward_name": learning.reward_name, "max_age_s": learning.max_age_s}
        )
        count = cursor.fetchone()
        return int(count[0]) if count is not None else 0
