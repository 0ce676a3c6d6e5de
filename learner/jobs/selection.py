"""Which trajectories a learner run trains on, read from PostgreSQL.

Rewarded trajectories of the policy (a current reward of a name the policy's reward source
reads, see "Which reward" below), not trained on yet, not merged into another, whose last call
is within `max_age_s`; newest first, at most `max_trajectories`. The judge's own calls
(client trajectory id `apprentice-judge:...`) are never read: they are not the policy's work.
Each trajectory's calls are read in order and checked:

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
  rewards are still arriving waits (see grouping.classify and `RewardPlan.wait_s`).

Which reward (`PolicySettings.reward_source`, see `RewardPlan`):
- "webhook": the current reward named `learning.reward_name`.
- "judge": the current reward named `judge.reward_name` (the LLM judge's scores).
- "webhook_else_judge": both are read, and each group (grpo.grouping.group_key) trains on one
  of them: the webhook's when every rewarded member has one, else the judge's when it scored
  at least as many members as the webhook did, else the webhook's; members without the chosen
  reward drop out of that group this run. The two are never mixed within a group: GRPO's
  advantage compares each member's reward with the others' in its group, and a webhook's 0/1
  and a judge's relative score in [0, 1] are on different scales, so a mixed group would
  reward whichever member happened to be scored by the more generous source.

Pure reads, no locks: the run's advisory lock keeps other learners of the policy away, and
rows this reads may change meanwhile without harm (a late reward is used next time).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

import psycopg
from psycopg.rows import dict_row

from apprentice.grouping import JUDGE_TRAJECTORY_PREFIX, task_family, task_key, tenant_family_key
from apprentice.promotion.lineage import ancestors, lineage_head
from apprentice.promotion.rows import AdapterVersion
from apprentice.settings import LearningSettings, PolicySettings
from learner.grpo.grouping import Group, Member, completion_key, group_key, is_greedy
from learner.grpo.tokens import CallRecord, TokenizationError, parse_call

# What a policy trains on (PolicySettings.reward_source), and what one group trains on.
RewardSource = Literal["webhook", "judge", "webhook_else_judge"]
GroupSource = Literal["webhook", "judge"]

# How long past its due time (judge_wait_s after a group's last call) a group that the judge may
# score keeps waiting for it, besides one judge poll: time for one judging call of a group (a
# prompt of at most judge.max_group_size trajectories, usually well under a minute) and a retry.
# Not judge.timeout_s x max_attempts: every group would then wait that worst case (15 minutes
# by default) before training; a judge later than this costs only that group's unscored
# members this run (the group trains on what it has, never a mix).
JUDGE_GRACE_S = 120.0

# Untrained, unmerged trajectories of the policy, the judge's own and those recorded only for
# observability (trajectories.trainable: a key's or the policy's opt-out) left out: what every query reads.
_UNTRAINED = """
t.policy = %(policy)s AND t.trained_in_run_id IS NULL AND t.merged_into IS NULL AND t.trainable
  AND (t.client_trajectory_id IS NULL OR NOT starts_with(t.client_trajectory_id, %(judge_prefix)s))
"""

# A trajectory's first call, as `fc` (its request). The bound on created_at lets PostgreSQL prune
# the partitions of calls (see _CALLS below).
_FIRST_CALL = """LEFT JOIN LATERAL (SELECT c.request FROM calls c WHERE c.trajectory_id = t.id
                   AND c.created_at BETWEEN t.first_call_at - interval '1 day'
                                        AND t.last_call_at + interval '1 day'
                   ORDER BY c.created_at, c.id LIMIT 1) fc ON true"""

# The trajectory has a current reward (linked, not superseded) of one of the names read.
_REWARDED_BY_NAMES = """EXISTS (SELECT 1 FROM rewards r WHERE r.trajectory_id = t.id AND r.name = ANY(%(names)s)
                  AND r.status = 'linked' AND r.superseded_at IS NULL)"""

# Each trajectory with its current webhook reward and judge score (NULL: none, or not read:
# a NULL name matches no row); a trajectory with neither is not rewarded.
REWARDED = f"""
SELECT t.id::text AS id, t.tenant, t.group_id, extract(epoch FROM t.last_call_at)::float8 AS last_call_at,
       t.task_family, w.value AS webhook, j.value AS judge, j.judgement_id::text AS judgement
FROM trajectories t
LEFT JOIN rewards w ON w.trajectory_id = t.id AND w.name = %(webhook_name)s AND w.status = 'linked'
                   AND w.superseded_at IS NULL
LEFT JOIN rewards j ON j.trajectory_id = t.id AND j.name = %(judge_name)s AND j.status = 'linked'
                   AND j.superseded_at IS NULL
WHERE {_UNTRAINED}
  AND t.last_call_at >= now() - make_interval(secs => %(max_age_s)s)
  AND (w.value IS NOT NULL OR j.value IS NOT NULL)
ORDER BY t.last_call_at DESC
LIMIT %(limit)s
"""

# Unrewarded recent trajectories: only their group matters (is the group still filling up?).
_WAITING = f"""
SELECT t.id::text AS id, t.tenant, t.group_id, extract(epoch FROM t.last_call_at)::float8 AS last_call_at,
       fc.request
FROM trajectories t
{_FIRST_CALL}
WHERE {_UNTRAINED}
  AND t.last_call_at >= now() - make_interval(secs => %(wait_s)s)
  AND NOT {_REWARDED_BY_NAMES}
LIMIT %(limit)s
"""

# calls is partitioned by created_at (migration 0012): the bound from the trajectories' first
# calls (first_call_at is the minimum of their calls' created_at, merges included) lets
# PostgreSQL skip the partitions older than the run's trajectories at execution. The day of
# slack, here and in the first-call lookups, keeps rows written by other tools (tests, imports)
# whose trajectory times drift from their calls' found, for one more partition at most.
_CALLS = """
SELECT c.trajectory_id::text AS trajectory_id, c.status_code, c.upstream_model, c.adapter_version_id::text AS version,
       c.temperature, c.request, c.response
FROM calls c WHERE c.trajectory_id = ANY(%(ids)s::uuid[])
  AND c.created_at >= (SELECT min(t.first_call_at) - interval '1 day' FROM trajectories t
                       WHERE t.id = ANY(%(ids)s::uuid[]))
ORDER BY c.trajectory_id, c.created_at, c.id
"""

_VERSIONS = "SELECT * FROM adapter_versions WHERE policy = %(policy)s"


@dataclass(frozen=True)
class RewardPlan:
    """Which current rewards a policy's learner reads, and how long an unrewarded trajectory holds its group.

    `wait_s`: with the webhook alone, `learning.reward_wait_s`. When the judge's scores train
    (source "judge" or "webhook_else_judge"), a group is judged `judge_wait_s` after its last
    call, so its unscored members hold it for max(reward_wait_s, judge_wait_s) plus one judge
    poll plus JUDGE_GRACE_S: otherwise a group whose webhook rewards are partial would train on
    its webhook subset moments before the judge scores all of it.
    """

    source: RewardSource
    webhook_name: str | None  # None: webhook rewards are not read
    judge_name: str | None  # None: judge scores are not read
    wait_s: float

    @classmethod
    def of(cls, policy: PolicySettings) -> RewardPlan:
        source = policy.reward_source
        learning = policy.learning
        if source == "webhook":
            return cls(source, learning.reward_name, None, learning.reward_wait_s)
        judge = policy.judge
        if judge is None:  # Settings refuses this configuration; a bare PolicySettings may hold it
            raise ValueError(f"policy {policy.name!r}: reward source {source!r} needs a judge")
        wait_s = max(learning.reward_wait_s, policy.judge_wait_s) + judge.poll_interval_s + JUDGE_GRACE_S
        webhook_name = learning.reward_name if source == "webhook_else_judge" else None
        return cls(source, webhook_name, judge.reward_name, wait_s)

    def pools_families(self, learning: LearningSettings) -> bool:
        """Whether small groups may train against their family: only on the webhook's reward (its
        values mean the same across prompts); the judge's scores are relative within one group."""
        return learning.family_baseline and self.webhook_name is not None

    @property
    def names(self) -> list[str]:
        """The reward names read: a trajectory with a current reward of one of them is rewarded."""
        return [name for name in (self.webhook_name, self.judge_name) if name is not None]

    def params(self) -> dict[str, Any]:
        return {
            "webhook_name": self.webhook_name,
            "judge_name": self.judge_name,
            "names": self.names,
            "wait_s": self.wait_s,
            "judge_prefix": JUDGE_TRAJECTORY_PREFIX,
        }


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
    """A rewarded trajectory that may train: its calls parsed, its grouping facts, its rewards.

    `member.reward` is the value its group trains on, set by `assign_rewards` (None before).
    """

    member: Member
    calls: list[CallRecord]
    webhook: float | None = None  # its current webhook reward, when the plan reads it
    judge: float | None = None  # its current judge score, when the plan reads it
    judgement: str | None = None  # the judgement that scored it: the members it was compared with


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
    source: RewardSource = "webhook"  # the policy's resolved reward source
    wait_s: float = 0.0  # how long unrewarded members hold their group (RewardPlan.wait_s)
    group_sources: dict[str, GroupSource] = field(default_factory=dict)  # group key -> the reward it trains on
    # tenant_family_key -> (trajectory id, webhook reward) of the family's most recent rewarded
    # trajectories, trained or not: the baseline of groups too small to compare within. Empty
    # when the policy does not pool families (learning.family_baseline off, or the judge trains).
    family_rewards: dict[str, list[tuple[str, float]]] = field(default_factory=dict)

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

    def may_pool(self, group: Group) -> bool:
        """A group too small to compare within may train against its family: when the policy pools
        families (family_rewards were read) and the group trains on the webhook's reward."""
        return bool(self.family_rewards) and self.group_sources.get(group.key) == "webhook"


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
    trajectory: dict[str, Any],
    rows: list[dict[str, Any]],
    base_model: str,
    versions: dict[str, Version],
    policy: str | None = None,
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
        reward=None,
        group_id=trajectory["group_id"],
        task_key=task_key(first.get("messages") or [], first.get("tools")),
        greedy=any(is_greedy(r["temperature"]) for r in answered),
        completion_key=completion_key(_answer_key(c) for c in calls),
        last_call_at=trajectory["last_call_at"],
        # Recorded by the gateway since migration 0014; older rows: the same rule on the first call.
        family=trajectory.get("task_family") or task_family(policy, first.get("messages") or [], first.get("tools")),
        answers=len(calls),
    )
    return (
        Candidate(
            member,
            calls,
            webhook=trajectory.get("webhook"),
            judge=trajectory.get("judge"),
            judgement=trajectory.get("judgement"),
        ),
        None,
    )


def group_source(members: list[Candidate], source: RewardSource) -> GroupSource:
    """The reward one group trains on (see "Which reward" in the module docstring).

    Every candidate has at least one of the two, so "every rewarded member has the webhook's"
    is "every candidate has it". A tie goes to the judge: it scored its members side by side,
    for exactly this comparison, while the webhook's values of a partial group are whatever
    arrived.
    """
    if source == "webhook":
        return "webhook"
    if source == "judge":
        return "judge"
    webhook = sum(c.webhook is not None for c in members)
    if webhook == len(members):
        return "webhook"
    judged = sum(c.judge is not None for c in members)
    return "judge" if judged >= webhook else "webhook"


def assign_rewards(selection: Selection) -> None:
    """Give each candidate the reward its group trains on; drop those without it (counted).

    A dropped member is left untrained and unmarked: a later reward may bring it back.
    """
    groups: dict[str, list[str]] = {}
    for trajectory_id, candidate in selection.candidates.items():
        groups.setdefault(group_key(candidate.member), []).append(trajectory_id)
    for key, ids in groups.items():
        chosen = group_source([selection.candidates[i] for i in ids], selection.source)
        selection.group_sources[key] = chosen
        for trajectory_id in ids:
            candidate = selection.candidates[trajectory_id]
            value = candidate.webhook if chosen == "webhook" else candidate.judge
            if value is None:
                del selection.candidates[trajectory_id]
                selection.skip("other_reward_source")
            elif chosen == "judge" and candidate.judgement is not None:
                # A judge's scores compare only the members it read together: a large group is
                # judged in chunks, and each chunk is its own GRPO group.
                candidate.member = replace(candidate.member, reward=value, group_id=f"judgement:{candidate.judgement}")
                selection.group_sources[group_key(candidate.member)] = "judge"
            else:
                candidate.member = replace(candidate.member, reward=value)
        if chosen == "judge" and any(selection.candidates[i].judgement for i in ids if i in selection.candidates):
            del selection.group_sources[key]  # its members now train in their judgements' groups


def without_jit(cursor: psycopg.Cursor[Any]) -> None:
    """No JIT for the rest of the transaction. calls is partitioned (docs/history.md): a plan over
    every partition is costed before run-time pruning, high enough to trigger JIT, which then
    spent 7 s compiling a run's selection that executes in 0.1 s (bench/history_scale.py)."""
    cursor.execute("SET LOCAL jit = off")


def load_versions(connection: psycopg.Connection, policy: str) -> list[AdapterVersion]:
    with connection.cursor(row_factory=dict_row) as cursor:
        cursor.execute(_VERSIONS, {"policy": policy})
        return [AdapterVersion.from_row(r) for r in cursor.fetchall()]


# The most recent rewards of the candidates' families (webhook reward name, current, linked),
# trained or not, at most family_baseline_size per family: the baseline of pooled members.
_FAMILY_REWARDS = """
SELECT id, tenant, task_family, value FROM (
    SELECT t.id::text AS id, t.tenant, t.task_family, r.value,
           row_number() OVER (PARTITION BY t.tenant, t.task_family ORDER BY t.last_call_at DESC) AS n
    FROM trajectories t
    JOIN rewards r ON r.trajectory_id = t.id AND r.name = %(webhook_name)s AND r.status = 'linked'
                  AND r.superseded_at IS NULL
    WHERE t.policy = %(policy)s AND t.merged_into IS NULL AND t.task_family = ANY(%(families)s)
      AND (t.client_trajectory_id IS NULL OR NOT starts_with(t.client_trajectory_id, %(judge_prefix)s))
      AND t.last_call_at >= now() - make_interval(secs => %(max_age_s)s)
) recent WHERE n <= %(size)s
"""


def _family_rewards(
    cursor: psycopg.Cursor[Any], selection: Selection, plan: RewardPlan, policy: PolicySettings
) -> dict[str, list[tuple[str, float]]]:
    """Each candidate family's recent webhook rewards (see Selection.family_rewards); candidates
    whose family was computed from their first call (rows older than migration 0014) join theirs."""
    learning = policy.learning
    families = sorted({c.member.family for c in selection.candidates.values()})
    cursor.execute(
        _FAMILY_REWARDS,
        {
            **plan.params(),
            "policy": policy.name,
            "families": families,
            "max_age_s": learning.max_age_s,
            "size": learning.family_baseline_size,
        },
    )
    out: dict[str, list[tuple[str, float]]] = {}
    seen: set[str] = set()
    for row in cursor.fetchall():
        out.setdefault(tenant_family_key(row["tenant"], row["task_family"]), []).append((row["id"], row["value"]))
        seen.add(row["id"])
    for trajectory_id, candidate in selection.candidates.items():
        if trajectory_id not in seen and candidate.webhook is not None:
            member = candidate.member
            out.setdefault(tenant_family_key(member.tenant, member.family), []).append(
                (trajectory_id, candidate.webhook)
            )
    return out


def _waiting_member(row: dict[str, Any]) -> Member:
    request = row["request"] or {}
    return Member(
        trajectory_id=row["id"],
        tenant=row["tenant"],
        reward=None,
        group_id=row["group_id"],
        task_key=task_key(request.get("messages") or [], request.get("tools")),
        last_call_at=row["last_call_at"],
    )


def select(connection: psycopg.Connection, policy: PolicySettings) -> Selection:
    """Read the candidates of one learner run of `policy` (see the module docstring)."""
    learning = policy.learning
    plan = RewardPlan.of(policy)
    with connection.transaction(), connection.cursor(row_factory=dict_row) as cursor:
        without_jit(cursor)
        cursor.execute("SELECT extract(epoch FROM now())::float8 AS now")
        clock = cursor.fetchone()
        assert clock is not None  # SELECT now() always returns its one row
        selection = Selection(now=clock["now"], source=plan.source, wait_s=plan.wait_s)
        rows = load_versions(connection, policy.name)
        selection.versions = {str(row.id): Version.of(row) for row in rows}
        selection.lineage = Lineage.of(rows, learning.max_staleness)
        params = {
            **plan.params(),
            "policy": policy.name,
            "max_age_s": learning.max_age_s,
            "limit": learning.max_trajectories,
        }
        cursor.execute(REWARDED, params)
        trajectories = cursor.fetchall()
        cursor.execute(_CALLS, {"ids": [t["id"] for t in trajectories]})
        calls: dict[str, list[dict[str, Any]]] = {}
        for row in cursor.fetchall():
            calls.setdefault(row["trajectory_id"], []).append(row)
        for trajectory in trajectories:
            candidate, reason = build_candidate(
                trajectory, calls.get(trajectory["id"], []), policy.base_model, selection.versions, policy.name
            )
            if candidate is None:
                selection.skip(reason or "unknown")
            elif (stale := selection.lineage.staleness(candidate.calls)) is not None:
                selection.stale[trajectory["id"]] = stale
            else:
                selection.candidates[trajectory["id"]] = candidate
        assign_rewards(selection)
        if plan.pools_families(learning):
            selection.family_rewards = _family_rewards(cursor, selection, plan, policy)
        if plan.wait_s > 0:
            cursor.execute(_WAITING, params)
            selection.waiting.extend(_waiting_member(row) for row in cursor.fetchall())
    return selection


# Tenant-scoped like grouping.group_key; the task is approximated by a hash of the first call's
# messages and tools (grouping's task_key normalizes them first), which is close enough to decide
# whether a run is worth starting. What is counted is groups of single answers (see
# count_new_groups): a group of runs of k calls counts k, and groups too small to compare within
# count, pooled by family, one per min_group_size answers.
_NEW_GROUPS = f"""
WITH rewarded AS (
    SELECT t.tenant, t.task_family, greatest(t.call_count, 1) AS answers,
           coalesce('g:' || t.group_id, 't:' || md5(coalesce(fc.request->'messages', 'null'::jsonb)::text
                                                    || coalesce(fc.request->'tools', 'null'::jsonb)::text)) AS grp
    FROM trajectories t
    {_FIRST_CALL}
    WHERE {_UNTRAINED}
      AND t.last_call_at >= now() - make_interval(secs => %(max_age_s)s)
      AND {_REWARDED_BY_NAMES}
), groups AS (
    SELECT tenant, grp, min(task_family) AS family, count(*) AS members, sum(answers) AS answers
    FROM rewarded GROUP BY tenant, grp
), pools AS (
    SELECT sum(answers) AS answers FROM groups
    WHERE %(pool)s AND members < %(min_group_size)s GROUP BY tenant, family
)
SELECT coalesce((SELECT sum(greatest(round(answers::numeric / members), 1)) FROM groups
                 WHERE NOT %(pool)s OR members >= %(min_group_size)s), 0)
     + coalesce((SELECT sum(floor(answers::numeric / %(min_group_size)s)) FROM pools), 0)
"""


def count_new_groups(connection: psycopg.Connection, policy: PolicySettings) -> int:
    """About how many groups of rewarded (by a reward the policy trains on), untrained trajectories
    wait, counted in groups of single answers (cheap; for the trigger `min_new_groups`).

    A run of k calls trains k answers (every assistant turn), so a group of such runs counts as
    k groups (its mean calls per run, rounded): the same answers trigger as many runs whatever
    their shape. Groups with fewer rewarded members than `min_group_size` train against their
    family when the policy pools families (RewardPlan.pools_families): per tenant and family,
    their answers count one group per `min_group_size` of them; otherwise each counts as a group.
    """
    plan = RewardPlan.of(policy)
    learning = policy.learning
    params = {
        **plan.params(),
        "policy": policy.name,
        "max_age_s": learning.max_age_s,
        "min_group_size": learning.min_group_size,
        "pool": plan.pools_families(learning),
    }
    with connection.transaction(), connection.cursor() as cursor:
        without_jit(cursor)
        cursor.execute(_NEW_GROUPS, params)
        count = cursor.fetchone()
        return int(count[0]) if count is not None else 0
