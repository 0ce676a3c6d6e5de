"""The canary is an experiment by run, end to end: a gateway, PostgreSQL and the promotion job.

A handful of prompts of very different difficulty repeat. Before, the arm was a hash of the
prompt, so every run of a prompt went to one arm and the comparison measured the prompts. Now:
- A/A: each arm's share of 2,000 runs matches the setting (two-sided binomial test at 1%),
  overall and within every prompt; a client's group stays on one arm; each run records the arm
  it was drawn for, the version, the share and its task.
- A/B: a version prepared to be better on every prompt is promoted by the promotion job within
  the run; one prepared to be worse is rejected.
"""

from __future__ import annotations

import asyncio
import math
import random
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx

from apprentice.promotion.clock import database_now
from apprentice.promotion.tick import promotion_tick
from apprentice.promotion.tick_report import TickReport
from apprentice.settings import Settings
from apprentice.store.engine import make_async_engine
from tests.conftest import wait_for
from tests.support.fake_policy_endpoint import FakePolicyEndpoint

PROMPTS = {"easy": 0.9, "medium": 0.55, "hard": 0.25, "very hard": 0.05}


def binomial_two_sided_p(successes: int, n: int, p: float) -> float:
    """The exact two-sided binomial p-value: the probability of outcomes no likelier than observed."""

    def log_pmf(k: int) -> float:
        return (
            math.lgamma(n + 1)
            - math.lgamma(k + 1)
            - math.lgamma(n - k + 1)
            + k * math.log(p)
            + (n - k) * math.log1p(-p)
        )

    probabilities = [math.exp(log_pmf(k)) for k in range(n + 1)]
    observed = probabilities[successes]
    return min(1.0, sum(q for q in probabilities if q <= observed * (1 + 1e-9)))


def add_version(db, policy: str, number: int, status: str, share: float | None = None, path: str = "/nowhere"):
    version_id = uuid.uuid4()
    db.execute(
        "INSERT INTO adapter_versions (id, policy, version, name, status, base_model, path, canary_share) "
        "VALUES (%s, %s, %s, %s, %s, 'base', %s, %s)",
        (version_id, policy, number, f"{policy}-v{number}", status, path, share),
    )
    return version_id


def add_candidate(db, policy: str, number: int, directory: Path) -> uuid.UUID:
    """What the learner writes when a run ends: the run and its candidate, with whole adapter files."""
    directory.mkdir(parents=True)
    (directory / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 8, "lora_alpha": 16}')
    header = b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}'
    (directory / "adapter_model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    run_id, version_id = uuid.uuid4(), uuid.uuid4()
    db.execute(
        "INSERT INTO training_runs (id, policy, status, loss, kl, finished_at, produced_version_id) "
        "VALUES (%s, %s, 'succeeded', 0.3, 0.01, now(), %s)",
        (run_id, policy, version_id),
    )
    db.execute(
        "INSERT INTO adapter_versions (id, policy, version, name, status, base_model, path, training_run_id, "
        "rank, alpha) VALUES (%s, %s, %s, %s, 'candidate', 'base', %s, %s, 8, 16)",
        (version_id, policy, number, f"{policy}-v{number}", str(directory), run_id),
    )
    return version_id


def policy_config(endpoint: FakePolicyEndpoint, **promotion: Any) -> dict[str, Any]:
    return {
        "name": "agent",
        "base_model": "base",
        "endpoints": [endpoint.api_base],
        "reward_range": [0.0, 1.0],
        "promotion": {
            "canary_share": 0.5,
            "min_samples": 16,
            "confidence": 0.9,
            "settle_s": 0,
            "unload_grace_s": 600,
            **promotion,
        },
    }


async def send_runs(base_url: str, prompts: list[str], *, group: str | None = None, concurrency: int = 16) -> list:
    """One call per run; returns (prompt, trajectory id, served model, answer) per run."""
    semaphore = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:

        async def one(prompt: str) -> tuple[str, str, str, str]:
            async with semaphore:
                headers = {"X-Group-Id": group} if group else {}
                response = await client.post(
                    "/chat/completions",
                    headers=headers,
                    json={"model": "agent", "messages": [{"role": "user", "content": prompt}]},
                )
            assert response.status_code == 200, response.text
            body = response.json()
            return prompt, response.headers["x-trajectory-id"], body["model"], body["choices"][0]["message"]["content"]

        return await asyncio.gather(*(one(p) for p in prompts))


def test_each_arm_gets_its_share_of_runs_of_every_prompt(start_gateway, db):
    rng = random.Random(3)
    with FakePolicyEndpoint("base", PROMPTS, {}) as endpoint:
        v1 = add_version(db, "agent", 1, "promoted")
        v2 = add_version(db, "agent", 2, "canary", share=0.5)
        endpoint.loaded.update({"agent-v1", "agent-v2"})
        gateway = start_gateway(policies=[policy_config(endpoint)], adapter_poll_interval_s=0.2)
        prompts = [rng.choice(list(PROMPTS)) for _ in range(2000)]
        runs = asyncio.run(send_runs(gateway.base_url, prompts))
        groups = [f"group-{g}" for g in range(30)]
        grouped = {g: asyncio.run(send_runs(gateway.base_url, ["medium"] * 4, group=g)) for g in groups}

        total = 2000 + 4 * len(groups)
        rows = wait_for(
            lambda: (
                (
                    r := db.execute(
                        "SELECT id::text, arm, arm_version_id, arm_share, arm_unit, task_key, adapter_version_id, "
                        "group_id FROM trajectories WHERE policy = 'agent'"
                    ).fetchall()
                )
                and len(r) == total
                and r
            ),
            timeout=120,
            message="every run stored",
        )
    by_id = {row[0]: row for row in rows}
    # Every run records the arm it was drawn for, and was served by that arm's version.
    for _prompt, trajectory, served, _ in runs:
        _, arm, arm_version, share, unit, task, served_version, _ = by_id[trajectory]
        assert share == 0.5 and unit == f"run:{trajectory}" and task
        assert (arm, arm_version, served_version, served) in (
            ("canary", v2, v2, "agent-v2"),
            ("incumbent", v1, v1, "agent-v1"),
        )
    canary = sum(by_id[t][1] == "canary" for _, t, _, _ in runs)
    p_value = binomial_two_sided_p(canary, len(runs), 0.5)
    assert p_value > 0.01, f"{canary} of {len(runs)} runs in the canary's arm at a share of 0.5 (p = {p_value:.2g})"
    # Within every prompt too: the arm does not depend on the prompt.
    per_prompt = Counter((p, by_id[t][1]) for p, t, _, _ in runs)
    tasks = {p: by_id[t][5] for p, t, _, _ in runs}
    assert len(set(tasks.values())) == len(PROMPTS), "one task key per prompt"
    for prompt in PROMPTS:
        n = per_prompt[(prompt, "canary")] + per_prompt[(prompt, "incumbent")]
        p_prompt = binomial_two_sided_p(per_prompt[(prompt, "canary")], n, 0.5)
        assert p_prompt > 0.01 / len(PROMPTS), f"{prompt}: {per_prompt[(prompt, 'canary')]} of {n} (p = {p_prompt:.2g})"
    # A client's group is one unit: all its runs in one arm, and groups of one prompt in both arms.
    group_arms = {g: {by_id[t][1] for _, t, _, _ in grouped[g]} for g in groups}
    assert all(len(arms) == 1 for arms in group_arms.values()), group_arms
    assert {a for arms in group_arms.values() for a in arms} == {"canary", "incumbent"}
    assert {by_id[t][4] for _, t, _, _ in grouped[groups[0]]} == {f"group:{groups[0]}"}


def test_a_group_keeps_its_arm_and_version_when_the_canary_moves_along_its_lineage(start_gateway, db):
    """A client's group whose runs straddle the canary's move to the lineage's next version (what a
    live loop does every few seconds) stays one unit: one arm, and on this process one version.
    Drawn with the canary's own version, each of the 40 groups would have drawn afresh for its
    later runs (all 40 keeping their arm: 0.5 ** 40)."""
    with FakePolicyEndpoint("base", PROMPTS, {}) as endpoint:
        v1 = add_version(db, "agent", 1, "promoted")
        v2 = add_version(db, "agent", 2, "canary", share=0.5)
        endpoint.loaded.update({"agent-v1", "agent-v2", "agent-v3"})
        gateway = start_gateway(policies=[policy_config(endpoint)], adapter_poll_interval_s=0.2)
        groups = [f"straddling-{g}" for g in range(40)]
        first = {g: asyncio.run(send_runs(gateway.base_url, ["medium"] * 2, group=g)) for g in groups}
        # The learner's next version becomes the canary; the old one goes back to candidate.
        db.execute("UPDATE adapter_versions SET status = 'candidate', canary_share = NULL WHERE id = %s", (v2,))
        v3 = add_version(db, "agent", 3, "canary", share=0.5)
        wait_for(
            lambda: any(
                served == "agent-v3" for *_, served, _ in asyncio.run(send_runs(gateway.base_url, ["easy"] * 8))
            ),
            timeout=30,
            message="the gateway serves the new canary",
        )
        later = {g: asyncio.run(send_runs(gateway.base_url, ["medium"] * 2, group=g)) for g in groups}
        fresh = asyncio.run(send_runs(gateway.base_url, ["medium"] * 4, group="after-the-move"))
    served_by_group = {g: {served for *_, served, _ in first[g] + later[g]} for g in groups}
    assert all(len(served) == 1 for served in served_by_group.values()), served_by_group
    assert {s for served in served_by_group.values() for s in served} == {"agent-v1", "agent-v2"}
    assert {served for *_, served, _ in fresh} <= {"agent-v1", "agent-v3"} and len({s for *_, s, _ in fresh}) == 1
    ids = [t for g in groups for _, t, _, _ in first[g] + later[g]]
    rows = wait_for(
        lambda: (
            (
                r := db.execute(
                    "SELECT id::text, arm, arm_version_id, arm_unit FROM trajectories WHERE id::text = ANY(%s)", (ids,)
                ).fetchall()
            )
            and len(r) == len(ids)
            and r
        ),
        timeout=60,
        message="every run stored",
    )
    by_id = {row[0]: row for row in rows}
    for g in groups:
        recorded = {(by_id[t][1], by_id[t][2], by_id[t][3]) for _, t, _, _ in first[g] + later[g]}
        assert recorded in ({("canary", v2, f"group:{g}")}, {("incumbent", v1, f"group:{g}")}), (g, recorded)
    assert v3 is not None


def tick(database_url: str, policy: dict[str, Any]) -> TickReport:
    settings = Settings(database_url=database_url, policies=[policy])

    async def once() -> TickReport:
        engine = make_async_engine(database_url, pool_size=2, max_overflow=2)
        try:
            now = await database_now(engine) + timedelta(seconds=1)
            return await promotion_tick(engine, settings, now=now)
        finally:
            await engine.dispose()

    report = asyncio.run(once())
    assert not report.errors, report.errors
    return report


def status_of(db, version_id: uuid.UUID) -> str:
    return db.execute("SELECT status FROM adapter_versions WHERE id = %s", (version_id,)).fetchone()[0]


def wait_for_linked(db, ids: list[uuid.UUID]) -> None:
    query = "SELECT count(*) FROM rewards WHERE status = 'linked' AND trajectory_id = ANY(%s)"
    wait_for(lambda: db.execute(query, (ids,)).fetchone()[0] == len(ids), timeout=60, message="rewards linked")


def drive_until_decided(gateway, db, database_url: str, policy: dict[str, Any], version: uuid.UUID, seed: int) -> int:
    """Batches of runs over the repeating prompts, each rewarded by its answer, and a promotion
    tick after each batch, until the version leaves the canary; returns the runs it took."""
    rng = random.Random(seed)
    sent = 0
    while status_of(db, version) == "canary":
        assert sent < 1600, f"no verdict after {sent} runs"
        runs = asyncio.run(send_runs(gateway.base_url, [rng.choice(list(PROMPTS)) for _ in range(48)]))
        sent += len(runs)
        rewards = [{"trajectory_id": t, "reward": 1.0 if answer == "correct" else 0.0} for _, t, _, answer in runs]
        response = httpx.post(f"{gateway.base_url}/rewards", json={"rewards": rewards}, timeout=60)
        assert response.status_code == 200, response.text
        wait_for_linked(db, [uuid.UUID(t) for _, t, _, _ in runs])
        tick(database_url, policy)
    return sent


def test_a_better_version_is_promoted_and_a_worse_one_rejected(start_gateway, db, database_url, tmp_path):
    effects = {"agent-v2": 0.3, "agent-v3": -0.3}
    with FakePolicyEndpoint("base", PROMPTS, effects, seed=5) as endpoint:
        policy = policy_config(endpoint)
        add_version(db, "agent", 1, "promoted")
        gateway = start_gateway(policies=[policy], adapter_poll_interval_s=0.2)
        better = add_candidate(db, "agent", 2, tmp_path / "v2")
        tick(database_url, policy)  # gates pass: the candidate becomes the canary, loaded at the endpoint
        assert status_of(db, better) == "canary" and "agent-v2" in endpoint.loaded
        runs = drive_until_decided(gateway, db, database_url, policy, better, seed=1)
        assert status_of(db, better) == "promoted", f"after {runs} runs"

        worse = add_candidate(db, "agent", 3, tmp_path / "v3")
        tick(database_url, policy)
        assert status_of(db, worse) == "canary"
        runs = drive_until_decided(gateway, db, database_url, policy, worse, seed=2)
        assert status_of(db, worse) == "rejected", f"after {runs} runs"
        assert status_of(db, better) == "promoted"
        evaluation = db.execute("SELECT evaluation FROM adapter_versions WHERE id = %s", (worse,)).fetchone()[0]
        interval = evaluation["interval"]
        assert evaluation["verdict"] == "worse" and interval["wealth_worse"] >= interval["threshold_worse"]
        assert interval["difference"] < 0
