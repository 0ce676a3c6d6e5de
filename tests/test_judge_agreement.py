"""Judge agreement: the figures of gateway/judging/agreement.py against values computed by hand,
and GET /v1/admin/policies/{policy}/judge/agreement on a real gateway over rows inserted in SQL.

The hand-computed groups, used by both parts (webhook rewards w, judge scores j):

  A  w [1, 0, 0.5]  j [0.9, 0.2, 0.4]  ranks w [3, 1, 2], j [3, 1, 2]: rho = 1;
                                       pairs (0,1) (0,2) (1,2) all ordered alike: 3/3
  B  w [1, 0, 0.5]  j [0.4, 0.2, 0.9]  ranks w [3, 1, 2], j [2, 1, 3], d = [1, 0, -1], sum d^2 = 2:
                                       rho = 1 - 6*2 / (3*(9-1)) = 0.5;
                                       pairs (0,1) alike, (0,2) w 1 > 0.5 but j 0.4 < 0.9, (1,2) alike: 2/3
  C  w [1, 1, 0]    j [0.5, 0.8, 0.5]  average ranks w [2.5, 2.5, 1], j [1.5, 3, 1.5], both means 2:
                                       deviations w [.5, .5, -1], j [-.5, 1, -.5];
                                       rho = (-.25 + .5 + .5) / sqrt(1.5 * 1.5) = 0.75 / 1.5 = 0.5;
                                       pairs: (0,1) webhook tie, not counted; (0,2) judge tie 0.5;
                                       (1,2) alike 1: 1.5 over 2 pairs
  D  w [1, 0]       j [0.5, 0.5]       judge constant: rho undefined; one pair, judge tie: 0.5 over 1
  G  one trajectory with both values: counted as a trajectory, no group

Overall: trajectories 3+3+3+2+1 = 12, groups 4 (A-D); Spearman mean over A, B, C = (1 + .5 + .5)/3
= 2/3; pairwise (3 + 2 + 1.5 + .5) / (3 + 3 + 2 + 1) = 7/9 over 9 pairs in 4 groups.

A bootstrap over two groups is computable by hand too: a resample draws each of the two with
probability 1/2 twice, so its statistic is one of three values, the extremes each with
probability 1/4; of 1000 resamples about 250 fall on each extreme, so the 2.5% and 97.5%
percentiles are the extremes themselves. A and B: Spearman {1, 0.75, 0.5} -> [0.5, 1];
pairwise {3/3, (3+2)/6, 2/3} -> [2/3, 1].
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import httpx
import pytest

from gateway.judging.agreement import (
    DRAW_BUDGET,
    Interval,
    ScoredTrajectory,
    agreement,
    average_ranks,
    bucket_start,
    pair_scores,
    resamples_for,
    score_groups,
    spearman,
    summarize,
)

ADMIN_KEY = "sk-admin-judge-agreement-test"
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}

DAY_1 = datetime(2026, 3, 1, tzinfo=timezone.utc)
DAY_2 = datetime(2026, 3, 2, tzinfo=timezone.utc)

# (name, judged at, judge model, rubric hash, webhook values, judge values)
GROUPS = [
    ("A", DAY_1 + timedelta(hours=10, minutes=15), "judge-a", "r1", [1, 0, 0.5], [0.9, 0.2, 0.4]),
    ("B", DAY_1 + timedelta(hours=14, minutes=30), "judge-a", "r1", [1, 0, 0.5], [0.4, 0.2, 0.9]),
    ("C", DAY_2 + timedelta(hours=9), "judge-b", "r2", [1, 1, 0], [0.5, 0.8, 0.5]),
    ("D", DAY_2 + timedelta(hours=9, minutes=30), "judge-b", "r2", [1, 0], [0.5, 0.5]),
    ("G", DAY_2 + timedelta(hours=10), "judge-b", "r2", [1], [0.7]),
]


def scored_rows() -> list[ScoredTrajectory]:
    rows = []
    for _, judged_at, model, rubric, webhook, judge in GROUPS:
        judgement = uuid.uuid4()
        for w, j in zip(webhook, judge, strict=True):
            rows.append(ScoredTrajectory(judgement, uuid.uuid4(), float(w), float(j), judged_at, model, rubric))
    return rows


# --- per group ---------------------------------------------------------------------------------


def test_average_ranks_share_the_mean_rank_of_a_tie():
    assert average_ranks([1, 1, 0]) == [2.5, 2.5, 1]
    # sorted: 0.1 (1), 0.2 (2), 0.3 and 0.3 (ranks 3 and 4 -> 3.5 each)
    assert average_ranks([0.3, 0.1, 0.3, 0.2]) == [3.5, 1, 3.5, 2]
    assert average_ranks([5, 5, 5]) == [2, 2, 2]


@pytest.mark.parametrize(
    ("webhook", "judge", "rho", "pairs"),
    [
        ([1, 0, 0.5], [0.9, 0.2, 0.4], 1.0, (3.0, 3)),  # group A
        ([1, 0, 0.5], [0.4, 0.2, 0.9], 0.5, (2.0, 3)),  # group B
        ([1, 1, 0], [0.5, 0.8, 0.5], 0.5, (1.5, 2)),  # group C: ties on both sides
        ([1, 0], [0.5, 0.5], None, (0.5, 1)),  # group D: the judge is constant
        ([1, 1], [0.2, 0.9], None, (0.0, 0)),  # the webhook is constant: nothing to order
        # ranks w [1, 3, 2, 4], j [2, 1, 3, 4], d = [-1, 2, -1, 0], sum d^2 = 6:
        # rho = 1 - 6*6 / (4*(16-1)) = 0.4; pairs: (0,1) and (1,2) opposite, the other 4 alike: 4/6
        ([0.1, 0.4, 0.35, 0.8], [0.2, 0.1, 0.6, 0.7], 0.4, (4.0, 6)),
        ([0, 1, 2, 3], [3, 2, 1, 0], -1.0, (0.0, 6)),  # reversed: rho -1, every pair opposite
    ],
)
def test_spearman_and_pair_scores_by_hand(webhook, judge, rho, pairs):
    found = spearman(webhook, judge)
    assert found == (pytest.approx(rho) if rho is not None else None)
    assert pair_scores(webhook, judge) == pairs


def test_a_group_needs_two_members_with_both_values():
    groups = score_groups(scored_rows())
    assert [(g.members, g.spearman, g.pair_score, g.pairs) for g in groups] == [
        (3, pytest.approx(1.0), 3.0, 3),
        (3, pytest.approx(0.5), 2.0, 3),
        (3, pytest.approx(0.5), 1.5, 2),
        (2, None, 0.5, 1),
    ]
    assert spearman([1], [0.5]) is None
    with pytest.raises(ValueError):
        pair_scores([1, 0], [0.5])


# --- aggregates ----------------------------------------------------------------------------------


def test_overall_figures_by_hand():
    report = agreement(scored_rows(), bucket="day")
    overall = report.overall
    assert (overall.trajectories, overall.groups) == (12, 4)
    assert overall.spearman == pytest.approx(2 / 3) and overall.spearman_groups == 3
    assert overall.pairwise_accuracy == pytest.approx(7 / 9)
    assert (overall.pairs, overall.pairwise_groups) == (9, 4)
    # Intervals resample groups: their ends lie between the lowest and highest group value.
    assert overall.spearman_interval is not None and overall.pairwise_interval is not None
    assert 0.5 <= overall.spearman_interval.low <= 2 / 3 <= overall.spearman_interval.high <= 1.0
    assert 0.5 <= overall.pairwise_interval.low <= 7 / 9 <= overall.pairwise_interval.high <= 1.0
    assert report.resamples == 1000
    assert agreement(list(reversed(scored_rows())), bucket="day").overall == overall, "a fixed seed"


def test_bootstrap_over_two_groups_by_hand():
    groups = score_groups(scored_rows())[:2]  # A and B
    figures = summarize(groups, trajectories=6)
    assert figures.spearman == pytest.approx(0.75)
    assert figures.spearman_interval == Interval(low=pytest.approx(0.5), high=pytest.approx(1.0))
    assert figures.pairwise_accuracy == pytest.approx(5 / 6)
    assert figures.pairwise_interval == Interval(low=pytest.approx(2 / 3), high=pytest.approx(1.0))
    one = summarize(groups[:1], trajectories=3)
    assert one.spearman == pytest.approx(1.0) and one.spearman_interval is None, "one group shows no spread"
    none = summarize([], trajectories=1)
    assert (none.groups, none.spearman, none.pairwise_accuracy, none.pairwise_interval) == (0, None, None, None)


def test_buckets_by_day_and_hour():
    days = agreement(scored_rows(), bucket="day").buckets
    assert [(b.start, b.end) for b in days] == [(DAY_1, DAY_2), (DAY_2, DAY_2 + timedelta(days=1))]
    first, second = days[0].figures, days[1].figures
    assert (first.trajectories, first.groups, first.pairs) == (6, 2, 6)
    assert first.spearman == pytest.approx(0.75) and first.pairwise_accuracy == pytest.approx(5 / 6)
    # day 2: C, D and G; rho only from C; pairwise (1.5 + 0.5) / (2 + 1)
    assert (second.trajectories, second.groups, second.spearman_groups, second.pairs) == (6, 2, 1, 3)
    assert second.spearman == pytest.approx(0.5) and second.spearman_interval is None
    assert second.pairwise_accuracy == pytest.approx(2 / 3)

    hours = agreement(scored_rows(), bucket="hour").buckets
    assert [b.start for b in hours] == [
        DAY_1 + timedelta(hours=10),
        DAY_1 + timedelta(hours=14),
        DAY_2 + timedelta(hours=9),
        DAY_2 + timedelta(hours=10),
    ]
    assert [(b.figures.trajectories, b.figures.groups) for b in hours] == [(3, 1), (3, 1), (5, 2), (1, 0)]
    assert hours[3].figures.spearman is None and hours[3].figures.pairwise_accuracy is None


def test_bucket_start_is_utc():
    plus_two = timezone(timedelta(hours=2))
    assert bucket_start(datetime(2026, 3, 2, 1, 30, tzinfo=plus_two), "day") == DAY_1
    assert bucket_start(datetime(2026, 3, 2, 1, 30, tzinfo=plus_two), "hour") == DAY_1 + timedelta(hours=23)
    assert bucket_start(datetime(2026, 3, 2, 1, 30), "hour") == DAY_2 + timedelta(hours=1), "naive is UTC"


def test_judge_sources_most_trajectories_first():
    rows = scored_rows()
    rows += [
        ScoredTrajectory(uuid.uuid4(), uuid.uuid4(), 1.0, 0.5, DAY_2, "judge-b", "r2"),
    ]
    sources = agreement(rows, bucket="day").sources
    assert [(s.judge_model, s.rubric_hash, s.groups, s.trajectories) for s in sources] == [
        ("judge-b", "r2", 4, 7),
        ("judge-a", "r1", 2, 6),
    ]


def test_the_bootstrap_stays_cheap_for_many_groups():
    # Each group of two (w [1, 0], j [0.9, 0.1]) enters both intervals, overall and in its bucket:
    # 4 draws per group and resample.
    rows = []
    for _ in range(2500):
        judgement = uuid.uuid4()
        rows += [
            ScoredTrajectory(judgement, uuid.uuid4(), 1.0, 0.9, DAY_1, "m", "r"),
            ScoredTrajectory(judgement, uuid.uuid4(), 0.0, 0.1, DAY_1, "m", "r"),
        ]
    report = agreement(rows, bucket="day")
    assert report.resamples == resamples_for(4 * 2500) == DRAW_BUDGET // (4 * 2500) == 200
    assert report.overall.spearman_interval == Interval(low=1.0, high=1.0)
    assert resamples_for(10) == 1000 and resamples_for(10**9) == 100


# --- the admin endpoint --------------------------------------------------------------------------


def _trajectory(db, policy: str) -> uuid.UUID:
    trajectory = uuid.uuid4()
    db.execute(
        "INSERT INTO trajectories (id, tenant, model, policy, first_call_at, last_call_at, call_count) "
        "VALUES (%s, 'default', %s, %s, now(), now(), 1)",
        (trajectory, policy, policy),
    )
    return trajectory


def _judgement(db, policy: str, model: str, rubric: str, judged_at: datetime, trajectories, *, running=False):
    judgement = uuid.uuid4()
    db.execute(
        "INSERT INTO judgements (id, policy, tenant, group_key, judge_model, rubric_hash, mode, status, "
        "trajectory_ids, started_at, finished_at, members_key) "
        "VALUES (%s, %s, 'default', %s, %s, %s, 'always', %s, %s, %s, %s, md5(%s::text))",
        (
            judgement,
            policy,
            f"group-{judgement}",
            model,
            rubric,
            "running" if running else "judged",
            list(trajectories),
            judged_at - timedelta(minutes=1),
            None if running else judged_at,
            judgement,
        ),
    )
    return judgement


def _reward(db, trajectory, name, value, *, judgement=None, observed_at=None, superseded=False) -> None:
    db.execute(
        "INSERT INTO rewards (id, tenant, target_kind, target, trajectory_id, status, linked_at, name, value, "
        "content_hash, source, judgement_id, observed_at, superseded_at) "
        "VALUES (%s, 'default', 'trajectory', %s, %s, 'linked', now(), %s, %s, '\\x00', %s, %s, "
        "coalesce(%s, now()), CASE WHEN %s THEN now() END)",
        (
            uuid.uuid4(),
            str(trajectory),
            trajectory,
            name,
            value,
            "judge" if judgement else "webhook:ci",
            judgement,
            observed_at,
            superseded,
        ),
    )


def _insert_groups(db) -> None:
    """GROUPS for the policy `graded` (webhook reward `outcome`, judge reward `judge-score`), with
    rows that must not count: a score without webhook reward, a score under another name, a
    superseded webhook reward, a superseded judge score, another policy's judgement."""
    for name, judged_at, model, rubric, webhook, judge in GROUPS:
        members = [_trajectory(db, "graded") for _ in webhook]
        extra = [_trajectory(db, "graded") for _ in range(2)]
        judgement = _judgement(db, "graded", model, rubric, judged_at, members + extra, running=name == "G")
        for trajectory, w, j in zip(members, webhook, judge, strict=True):
            _reward(db, trajectory, "outcome", w)
            # G is still 'running' (scores stored, not yet marked judged): judged when scored.
            _reward(db, trajectory, "judge-score", j, judgement=judgement, observed_at=judged_at)
        if name == "A":
            _reward(db, extra[0], "judge-score", 0.5, judgement=judgement)  # no webhook reward
            _reward(db, extra[1], "outcome", 1.0)
            _reward(db, extra[1], "judge", 0.5, judgement=judgement)  # not the policy's judge name
        if name == "B":
            _reward(db, members[0], "judge-score", 0.0, judgement=judgement, superseded=True)
            _reward(db, extra[0], "outcome", 0.0, superseded=True)  # its only webhook reward is old
            _reward(db, extra[0], "judge-score", 0.9, judgement=judgement)
    # The policy `plain` has no judge configured: judge scores under the default name still count.
    members = [_trajectory(db, "plain") for _ in range(2)]
    judgement = _judgement(db, "plain", "cli-judge", "r9", DAY_1, members)
    for trajectory, w, j in zip(members, [0, 1], [0.3, 0.6], strict=True):
        _reward(db, trajectory, "reward", w)
        _reward(db, trajectory, "judge", j, judgement=judgement)


def _policies(api_base: str) -> list[dict]:
    judge = {
        "model": "fake-model",
        "reward_name": "judge-score",
        "api_key": "sk-judge-never-used",
        "wait_s": 10**9,  # the judge worker never finds a group ready here
        "poll_interval_s": 3600,
    }
    return [
        {
            "name": "graded",
            "base_model": "fake-base",
            "endpoints": [api_base],
            "learning": {"reward_name": "outcome"},
            "judge": judge,
        },
        {"name": "plain", "base_model": "fake-base", "endpoints": [api_base]},
    ]


def test_agreement_endpoint_on_a_gateway(start_gateway, fake_upstream, db):
    _insert_groups(db)
    gateway = start_gateway(policies=_policies(fake_upstream.api_base), auth={"mode": "keys", "admin_key": ADMIN_KEY})
    url = gateway.base_url + "/admin/policies/{}/judge/agreement"

    def get(policy: str, **params) -> httpx.Response:
        return httpx.get(url.format(policy), params=params, headers=AUTH, timeout=30)

    body = get("graded").json()
    assert body["object"] == "judge.agreement" and body["policy"] == "graded" and body["bucket"] == "day"
    assert (body["webhook_reward"], body["judge_reward"]) == ("outcome", "judge-score")
    assert body["since"] is None and body["rubric_hash"] is None and body["resamples"] == 1000
    overall = body["overall"]
    assert (overall["trajectories"], overall["groups"]) == (12, 4)
    assert overall["spearman"]["mean"] == pytest.approx(2 / 3) and overall["spearman"]["groups"] == 3
    assert overall["pairwise"]["accuracy"] == pytest.approx(7 / 9)
    assert (overall["pairwise"]["pairs"], overall["pairwise"]["groups"]) == (9, 4)
    assert 0.5 <= overall["spearman"]["interval"]["low"] <= overall["spearman"]["interval"]["high"] <= 1.0

    day_1, day_2 = body["buckets"]
    assert (day_1["start"], day_1["end"]) == ("2026-03-01T00:00:00Z", "2026-03-02T00:00:00Z")
    assert (day_1["trajectories"], day_1["groups"], day_1["pairwise"]["pairs"]) == (6, 2, 6)
    assert day_1["spearman"]["mean"] == pytest.approx(0.75)
    assert day_1["spearman"]["interval"] == {"low": pytest.approx(0.5), "high": pytest.approx(1.0)}
    assert day_1["pairwise"]["accuracy"] == pytest.approx(5 / 6)
    assert day_1["pairwise"]["interval"] == {"low": pytest.approx(2 / 3), "high": pytest.approx(1.0)}
    assert (day_2["trajectories"], day_2["groups"], day_2["spearman"]["groups"]) == (6, 2, 1)
    assert day_2["spearman"]["mean"] == pytest.approx(0.5) and day_2["spearman"]["interval"] is None
    assert day_2["pairwise"]["accuracy"] == pytest.approx(2 / 3) and day_2["pairwise"]["pairs"] == 3
    assert body["judges"] == [
        {"judge_model": "judge-a", "rubric_hash": "r1", "groups": 2, "trajectories": 6},
        {"judge_model": "judge-b", "rubric_hash": "r2", "groups": 3, "trajectories": 6},
    ]

    hours = get("graded", bucket="hour").json()["buckets"]
    assert [(b["start"], b["trajectories"], b["groups"]) for b in hours] == [
        ("2026-03-01T10:00:00Z", 3, 1),
        ("2026-03-01T14:00:00Z", 3, 1),
        ("2026-03-02T09:00:00Z", 5, 2),
        ("2026-03-02T10:00:00Z", 1, 0),  # G, judged when its scores were stored
    ]

    for since in ("2026-03-02T00:00:00Z", "2026-03-02T00:00:00", str(int(DAY_2.timestamp()))):
        later = get("graded", since=since).json()
        assert later["overall"]["trajectories"] == 6 and len(later["buckets"]) == 1, since
        assert later["overall"]["pairwise"]["accuracy"] == pytest.approx(2 / 3)
        assert later["since"] == "2026-03-02T00:00:00Z"
    rubric = get("graded", rubric_hash="r1").json()
    assert rubric["overall"]["trajectories"] == 6 and rubric["overall"]["spearman"]["mean"] == pytest.approx(0.75)
    assert [j["rubric_hash"] for j in rubric["judges"]] == ["r1"]

    plain = get("plain").json()
    assert (plain["webhook_reward"], plain["judge_reward"]) == ("reward", "judge")
    assert plain["overall"]["trajectories"] == 2 and plain["overall"]["spearman"]["mean"] == pytest.approx(1.0)
    assert plain["overall"]["pairwise"]["accuracy"] == pytest.approx(1.0)
    empty = get("plain", rubric_hash="no-such-rubric").json()
    assert empty["overall"] == {
        "trajectories": 0,
        "groups": 0,
        "spearman": {"mean": None, "groups": 0, "interval": None},
        "pairwise": {"accuracy": None, "pairs": 0, "groups": 0, "interval": None},
    }
    assert empty["buckets"] == [] and empty["judges"] == []

    unknown = get("nobody")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "policy_not_found"
    for params in ({"bucket": "week"}, {"since": "yesterday"}):
        bad = get("graded", **params)
        assert bad.status_code == 400, bad.text
        error = bad.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == f"query.{next(iter(params))}"
    assert httpx.get(url.format("graded"), timeout=30).status_code == 401

    spec = httpx.get(gateway.url + "/openapi.json", timeout=30).json()
    operation = spec["paths"]["/v1/admin/policies/{policy}/judge/agreement"]["get"]
    assert {p["name"] for p in operation["parameters"]} == {"policy", "bucket", "since", "rubric_hash"}
    assert "JudgeAgreementOut" in operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
