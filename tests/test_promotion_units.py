"""Promotion's pure parts: statistics, the decision, gates, the transition table, retention
planning, and the LoRA loading client against a scripted vLLM-like endpoint."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import sys
import uuid
from datetime import datetime, timezone

import httpx
import pytest

from apprentice.promotion import evaluation as ev
from apprentice.promotion import lifecycle, loading
from apprentice.promotion.gates import evaluate_gates, json_number
from apprentice.promotion.retention import plan_retention
from apprentice.promotion.rows import AdapterVersion, TrainingRun
from apprentice.promotion.status import VersionStatus
from tests.support.canary import interleaved_units

# ---------------------------------------------------------------- statistics


@pytest.mark.parametrize(
    ("p", "df", "expected"),
    [
        (0.975, 1, 12.706204736),
        (0.975, 10, 2.228138852),
        (0.95, 30, 1.697260887),
        (0.995, 5, 4.032142984),
        (0.975, math.inf, 1.959963985),
        (0.025, 10, -2.228138852),
    ],
)
def test_t_quantiles_match_tables(p, df, expected):
    assert ev.t_ppf(p, df) == pytest.approx(expected, abs=1e-6)


def test_welch_interval_by_hand():
    # a: mean 3, var 2.5, n 5; b: mean 7, var 14, n 6 -> se^2 = 0.5 + 2.3333, df 6.9723
    interval = ev.welch_interval([1, 2, 3, 4, 5], [2, 4, 6, 8, 10, 12], 0.95)
    se = math.sqrt(0.5 + 14 / 6)
    assert interval.difference == -4.0
    assert interval.df == pytest.approx(6.97226, abs=1e-4)
    assert interval.high - interval.difference == pytest.approx(ev.t_ppf(0.975, interval.df) * se)
    assert interval.low < 0 and interval.high < 0  # significantly lower, barely
    same = ev.welch_interval([0.5, 0.5, 0.5], [0.5, 0.5])
    assert (same.low, same.high) == (0.0, 0.0)


def test_bootstrap_is_seeded_and_close_to_welch():
    rng = random.Random(3)
    a = [rng.gauss(0.6, 0.2) for _ in range(200)]
    b = [rng.gauss(0.5, 0.2) for _ in range(200)]
    boot = ev.bootstrap_interval(a, b, seed=7)
    assert boot == ev.bootstrap_interval(a, b, seed=7)
    welch = ev.welch_interval(a, b)
    assert boot.low == pytest.approx(welch.low, abs=0.02) and boot.high == pytest.approx(welch.high, abs=0.02)


def test_compare_and_decide():
    rng = random.Random(1)
    good = [min(1, max(0, rng.gauss(0.8, 0.1))) for _ in range(40)]
    bad = [min(1, max(0, rng.gauss(0.3, 0.1))) for _ in range(40)]
    noise = [rng.random() for _ in range(40)]

    few = ev.compare(interleaved_units(good[:5], bad), min_samples=10)
    assert few.verdict == ev.INSUFFICIENT and few.interval is None and few.canary.n == 5
    assert ev.decide(few, mode="automatic", elapsed_s=10, timeout_s=100) == ev.WAIT
    assert ev.decide(few, mode="automatic", elapsed_s=100, timeout_s=100) == ev.TIMEOUT

    better = ev.compare(interleaved_units(good, bad), min_samples=10)
    assert better.verdict == ev.BETTER and better.interval.low > 0
    assert ev.decide(better, mode="automatic", elapsed_s=0, timeout_s=100) == ev.PROMOTE
    assert ev.decide(better, mode="reviewed", elapsed_s=1e9, timeout_s=100) == ev.REVIEW

    worse = ev.compare(interleaved_units(bad, good), method="bootstrap", min_samples=10)
    assert worse.verdict == ev.WORSE and worse.interval.high < 0
    assert ev.decide(worse, mode="automatic", elapsed_s=0, timeout_s=100) == ev.REJECT

    unclear = ev.compare(interleaved_units(noise[:20], noise[20:]), min_samples=10)
    assert unclear.verdict == ev.INCONCLUSIVE
    assert json.loads(json.dumps(better.as_json()))["interval"]["low"] > 0


def test_min_samples_counts_rewarded_runs_not_units():
    """A client's named group of 8 runs is one unit: 2 units an arm hold the 16 runs min_samples asks."""
    groups = [dataclasses.replace(unit, runs=8) for unit in interleaved_units([0.9, 0.8], [0.1, 0.2])]
    assert ev.compare(groups, method="sequential", min_samples=16).verdict != ev.INSUFFICIENT
    assert ev.compare(groups, method="sequential", min_samples=17).verdict == ev.INSUFFICIENT
    runs = interleaved_units([0.9, 0.8], [0.1, 0.2])  # the same values as single runs: 2 runs an arm
    assert ev.compare(runs, method="sequential", min_samples=16).verdict == ev.INSUFFICIENT
    one_group = [dataclasses.replace(unit, runs=40) for unit in interleaved_units([0.9], [0.1])]
    assert ev.compare(one_group, method="welch", min_samples=16).verdict == ev.INSUFFICIENT, "two units an arm"


def test_sequential_compare_and_the_lineage_decision():
    rng = random.Random(2)
    good = [float(rng.random() < 0.8) for _ in range(200)]
    bad = [float(rng.random() < 0.4) for _ in range(200)]
    better = ev.compare(interleaved_units(good, bad), method="sequential", min_samples=10, reward_range=(0.0, 1.0))
    assert better.verdict == ev.BETTER and better.interval.df is None
    # wider than Welch's at the same confidence: the price of looking at every tick
    welch = ev.compare(interleaved_units(good, bad), method="welch", min_samples=10)
    assert better.interval.high - better.interval.low > welch.interval.high - welch.interval.low
    # no declared range: the observed one (here the same, 0..1)
    assert ev.compare(interleaved_units(good, bad), method="sequential", min_samples=10).interval == better.interval
    worse = ev.compare(interleaved_units(bad, good), method="sequential", min_samples=10)
    unclear = ev.compare(interleaved_units(good[:12], bad[:12]), method="sequential", min_samples=10)
    few = ev.compare(interleaved_units(good[:3], bad), method="sequential", min_samples=10)
    assert (worse.verdict, unclear.verdict, few.verdict) == (ev.WORSE, ev.INCONCLUSIVE, ev.INSUFFICIENT)
    constant = ev.compare(interleaved_units([1.0] * 20, [1.0] * 20), method="sequential", min_samples=10)
    assert constant.verdict == ev.INCONCLUSIVE

    def decide(lineage, newest, mode="automatic", elapsed=0.0):
        return ev.decide_lineage(lineage, newest, mode=mode, elapsed_s=elapsed, timeout_s=100)

    assert decide(better, few) == ev.PROMOTE
    assert decide(better, unclear) == ev.PROMOTE
    assert decide(better, worse) == ev.REJECT, "the newest version alone must not be significantly worse"
    assert decide(worse, few) == ev.REJECT
    assert decide(unclear, few) == ev.WAIT and decide(unclear, few, elapsed=100) == ev.TIMEOUT
    assert decide(better, few, mode="reviewed") == decide(worse, worse, mode="reviewed") == ev.REVIEW


def test_the_budget_is_spent_only_on_verdicts_the_rule_acts_on():
    """Promotion gets alpha / 2, rejection alpha / 2 over the lineage and all its newest versions;
    a newest version's "better" decides nothing and is never tested."""
    alpha = 0.1
    lineage, first = ev.decision_alphas(alpha, newest_index=1)
    assert (lineage.better, lineage.worse, first.better) == (pytest.approx(0.05), pytest.approx(0.04), 0.0)
    newest_worse = math.fsum(ev.decision_alphas(alpha, newest_index=k)[1].worse for k in range(1, 200_000))
    assert lineage.better == pytest.approx(alpha / 2)
    assert lineage.worse + newest_worse == pytest.approx(alpha / 2, rel=1e-4), "wrong rejections: at most alpha / 2"
    # the rejections keep what the two-sided tests at alpha_split's alphas spent on them
    lineage_interval, newest_interval = ev.alpha_split(alpha, newest_index=3)
    assert lineage.worse == pytest.approx(lineage_interval / 2)
    assert ev.decision_alphas(alpha, newest_index=3)[1].worse == pytest.approx(newest_interval / 2)

    # Thresholds per direction: a lineage wealth of 21 promotes (1 / 0.05 = 20), not at 2 / 0.08 = 25.
    rng = random.Random(5)
    good = [float(rng.random() < 0.7) for _ in range(400)]
    bad = [float(rng.random() < 0.4) for _ in range(400)]
    units = interleaved_units(good, bad)
    found = ev.compare(units, method="sequential", min_samples=10, direction_alphas=lineage, confidence=0.92)
    assert found.interval.threshold_better == pytest.approx(20) and found.interval.threshold_worse == pytest.approx(25)
    newest = ev.compare(units, method="sequential", min_samples=10, direction_alphas=first, confidence=0.99)
    assert newest.interval.wealth_better > 1e6 and newest.interval.threshold_better is None
    assert newest.verdict == ev.INCONCLUSIVE, "a newest version's gain is not a verdict"
    assert ev.compare(
        interleaved_units(bad, good), method="sequential", min_samples=10, direction_alphas=first
    ).verdict == (ev.WORSE)
    default = ev.compare(units, method="sequential", min_samples=10, confidence=0.92).interval
    assert default.threshold_better == default.threshold_worse == pytest.approx(25), "two-sided at alpha by default"


# ---------------------------------------------------------------- gates

A_RUN = TrainingRun(
    id=uuid.uuid4(),
    policy="agent",
    status="succeeded",
    trigger="manual",
    kind="rl",
    host=None,
    pid=None,
    started_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
    finished_at=None,
    from_version_id=None,
    produced_version_id=None,
    trajectories=None,
    groups=None,
    groups_equal_rewards=None,
    groups_greedy=None,
    samples=None,
    tokens=None,
    loss=0.25,
    mean_reward=None,
    mean_advantage=None,
    kl=0.01,
    clip_fraction=None,
    duration_s=None,
    code_version=None,
    config={},
    metrics={},
    error=None,
)


def run(**fields):
    return dataclasses.replace(A_RUN, **fields)


def test_gates():
    assert evaluate_gates(run(), kl_bound=0.1).passed
    assert evaluate_gates(None, kl_bound=0.1).outcome == "fail"
    assert evaluate_gates(run(status="running"), kl_bound=0.1).outcome == "wait"
    failed = evaluate_gates(run(status="failed", error="CUDA OOM"), kl_bound=0.1)
    assert failed.outcome == "fail" and "CUDA OOM" in failed.failures()[0]

    nan = evaluate_gates(run(loss=float("nan")), kl_bound=0.1)
    assert nan.outcome == "fail" and nan.failures() == ["loss_finite: the loss is nan"]
    assert json.dumps(nan.as_json(), allow_nan=False)  # storable in jsonb
    assert evaluate_gates(run(loss=None), kl_bound=0.1).outcome == "fail"
    assert evaluate_gates(run(metrics={"grad_norm": "NaN"}), kl_bound=0.1).outcome == "fail"

    far = evaluate_gates(run(kl=0.5), kl_bound=0.1)
    assert far.outcome == "fail" and "0.5 > bound 0.1" in far.failures()[0]
    assert evaluate_gates(run(kl=0.5), kl_bound=None).passed
    # the learner's KL to the incumbent in metrics wins over the kl column
    assert evaluate_gates(run(kl=0.5, metrics={"kl_to_incumbent": 0.05}), kl_bound=0.1).passed
    unmeasured = evaluate_gates(run(kl=None), kl_bound=0.1)
    assert unmeasured.passed and "not measured" in unmeasured.checks[2]["detail"]
    assert evaluate_gates(run(kl=float("inf")), kl_bound=None).outcome == "fail"
    assert json_number(float("-inf")) == "-inf" and json_number(1.5) == 1.5


# ---------------------------------------------------------------- state machine and retention


def test_transition_table():
    allowed = {(a, b) for a in lifecycle.STATUSES for b in lifecycle.STATUSES if lifecycle.is_allowed(a, b)}
    assert allowed == {
        ("candidate", "canary"),
        ("candidate", "promoted"),
        ("canary", "promoted"),
        ("retired", "promoted"),
        ("promoted", "retired"),
        ("candidate", "rejected"),
        ("canary", "rejected"),
        ("canary", "candidate"),
    }  # the last: superseded in its lineage


def test_retention_plan_keeps_last_k_and_everything_ever_promoted():
    ids = {n: uuid.uuid4() for n in range(1, 9)}
    statuses = {
        1: "retired",
        2: "rejected",
        3: "rejected",
        4: "retired",
        5: "rejected",
        6: "promoted",
        7: "rejected",
        8: "candidate",
    }
    versions = [version_row(ids[n], n, s) for n, s in statuses.items()]
    gone = datetime(2026, 1, 1, tzinfo=timezone.utc)
    versions[2] = dataclasses.replace(versions[2], files_deleted_at=gone)  # v3: already gone
    ever_promoted = {ids[1], ids[4], ids[6], ids[5]}  # v5: promoted once (kept whatever its status)
    doomed = plan_retention(versions, keep_last=3, ever_promoted=ever_promoted)
    assert [v.version for v in doomed] == [2]
    # a candidate left behind by its lineage's promotion (older than the promoted version) goes too
    versions[3] = dataclasses.replace(versions[3], status=VersionStatus.CANDIDATE)  # v4, never promoted now
    doomed = plan_retention(versions, keep_last=3, ever_promoted=ever_promoted - {ids[4]})
    assert [v.version for v in doomed] == [4, 2]


def version_row(version_id: uuid.UUID, number: int, status: str) -> AdapterVersion:
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return AdapterVersion.from_row(
        {
            "id": version_id,
            "policy": "agent",
            "version": number,
            "name": f"agent-v{number}",
            "status": status,
            "base_model": "base",
            "path": f"/adapters/v{number}",
            "parent_version_id": None,
            "training_run_id": None,
            "rank": None,
            "alpha": None,
            "target_modules": None,
            "canary_share": None,
            "gates": {},
            "evaluation": {},
            "files_deleted_at": None,
            "created_at": at,
            "updated_at": at,
        }
    )


# ---------------------------------------------------------------- loading against a scripted endpoint


class FakeVLLM:
    """Answers like vLLM's LoRA API; `script` injects failures per request path."""

    def __init__(self, script: dict[str, list[int]] | None = None) -> None:
        self.loaded: dict[str, str] = {}
        self.script = script or {}
        self.requests: list[tuple[str, dict]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = json.loads(request.content) if request.content else {}
        self.requests.append((path, body))
        if self.script.get(path):
            status = self.script[path].pop(0)
            if status == -1:
                raise httpx.ConnectError("connection refused", request=request)
            return httpx.Response(status, json={"error": {"message": "busy", "type": "x", "code": status}})
        if path.endswith("/models"):
            return httpx.Response(
                200,
                json={
                    "object": "list",
                    "data": [{"id": "base", "root": "/base"}]
                    + [{"id": n, "root": p, "parent": "base"} for n, p in self.loaded.items()],
                },
            )
        if path.endswith("/load_lora_adapter"):
            name, lpath = body["lora_name"], body["lora_path"]
            if "missing" in lpath:
                return httpx.Response(
                    404,
                    json={
                        "error": {
                            "message": f"Loading lora {name} failed: No adapter found for {lpath}",
                            "type": "NotFoundError",
                            "code": 404,
                        }
                    },
                )
            if name in self.loaded and not body.get("load_inplace"):
                return httpx.Response(
                    400,
                    json={
                        "error": {
                            "message": f"The lora adapter '{name}' has already been "
                            "loaded. If you want to load the adapter in "
                            "place, set 'load_inplace' to True.",
                            "type": "InvalidUserInput",
                            "code": 400,
                        }
                    },
                )
            self.loaded[name] = lpath
            return httpx.Response(200, text=f"Success: LoRA adapter '{name}' added successfully.")
        if path.endswith("/unload_lora_adapter"):
            if body["lora_name"] not in self.loaded:
                return httpx.Response(
                    404,
                    json={
                        "error": {
                            "message": f"The lora adapter '{body['lora_name']}' cannot be found.",
                            "type": "NotFoundError",
                            "code": 404,
                        }
                    },
                )
            del self.loaded[body["lora_name"]]
            return httpx.Response(200, text="Success")
        return httpx.Response(404)


def client_for(fakes: dict[str, FakeVLLM]) -> httpx.AsyncClient:
    def route(request: httpx.Request) -> httpx.Response:
        return fakes[f"{request.url.scheme}://{request.url.host}:{request.url.port}"](request)

    return httpx.AsyncClient(transport=httpx.MockTransport(route))


async def test_loading_is_idempotent_retried_and_verified():
    fakes = {"http://a:8000": FakeVLLM(), "http://b:8000": FakeVLLM({"/v1/load_lora_adapter": [503, -1]})}
    endpoints = ["http://a:8000/v1", "http://b:8000/v1"]
    async with client_for(fakes) as client:
        outcomes = await loading.ensure_loaded(endpoints, "p-v1", "/adapters/v1", client=client, backoff_s=0.01)
        assert [(o.action, o.attempts) for o in outcomes] == [("loaded", 1), ("loaded", 3)]
        assert all(f.loaded == {"p-v1": "/adapters/v1"} for f in fakes.values())

        again = await loading.ensure_loaded(endpoints, "p-v1", "/adapters/v1", client=client)
        assert [o.action for o in again] == ["present", "present"]

        # vLLM's 400 "already loaded" (another process won the race) counts as loaded
        racing = FakeVLLM()
        racing.loaded["p-v2"] = "/adapters/v2"
        original = racing.__call__

        listing_hidden = False

        def hide_first_listing(request):
            nonlocal listing_hidden
            if request.url.path.endswith("/models") and not listing_hidden:
                listing_hidden = True
                return httpx.Response(200, json={"data": [{"id": "base"}]})
            return original(request)

        async with httpx.AsyncClient(transport=httpx.MockTransport(hide_first_listing)) as racing_client:
            done = await loading.ensure_loaded(["http://c:1/v1"], "p-v2", "/adapters/v2", client=racing_client)
            assert done[0].action == "loaded"

        # the same name over another path is replaced in place
        moved = await loading.ensure_loaded(endpoints[:1], "p-v1", "/adapters/v1-retrained", client=client)
        assert moved[0].action == "reloaded" and fakes["http://a:8000"].loaded["p-v1"] == "/adapters/v1-retrained"

        with pytest.raises(loading.LoadError) as missing:
            await loading.ensure_loaded(endpoints, "p-v3", "/adapters/missing", client=client, backoff_s=0.01)
        assert missing.value.permanent and "No adapter found" in str(missing.value)
        assert (
            sum(
                1
                for p, _ in fakes["http://a:8000"].requests
                if p.endswith("load_lora_adapter") and _["lora_name"] == "p-v3"
            )
            == 1
        )  # a 404 is not retried

        fakes["http://b:8000"].script["/v1/models"] = [500] * 10
        with pytest.raises(loading.LoadError) as down:
            await loading.ensure_loaded(endpoints, "p-v4", "/adapters/v4", client=client, attempts=2, backoff_s=0.01)
        assert not down.value.permanent and list(down.value.failures) == ["http://b:8000/v1"]

        fakes["http://b:8000"].script.clear()
        gone = await loading.unload(endpoints, "p-v1", client=client)
        assert [o.action for o in gone] == ["unloaded", "unloaded"]
        assert [o.action for o in await loading.unload(endpoints, "p-v1", client=client)] == ["absent", "absent"]


@pytest.mark.parametrize(
    "job, others",
    [("tick", ("actions", "listing")), ("actions", ("tick", "listing")), ("listing", ("tick", "actions"))],
)
def test_each_promotion_job_loads_without_the_others(job, others):
    """The admin actions, the periodic tick and the read models share only the modules below them
    (pyproject.toml, `promotion-jobs-layers`): a test of one runs without the others loaded."""
    import subprocess

    code = (
        f"import sys, apprentice.promotion.{job}; "
        f"loaded = [m for m in {others!r} if 'apprentice.promotion.' + m in sys.modules]; "
        "assert not loaded, loaded"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_promotion_does_not_import_torch():
    import subprocess

    code = (
        "import sys, apprentice.promotion.actions, apprentice.promotion.tick, apprentice.promotion.listing, "
        "gateway.endpoints.admin.routes; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
