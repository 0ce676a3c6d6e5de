"""The promotion state machine and the periodic job against PostgreSQL, with scripted
inference endpoints (httpx MockTransport): locking, idempotency, gates, evaluation,
reviewed mode, rollback, reconciliation and retention."""

from __future__ import annotations

import asyncio
import atexit
import json
import random
import shutil
import struct
import tempfile
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest

from apprentice.promotion import actions, lifecycle, listing, policies, reconcile, tick
from apprentice.promotion.lifecycle import TransitionError
from apprentice.settings import Settings
from apprentice.store.engine import make_async_engine
from tests.test_promotion_units import FakeVLLM, client_for

ENDPOINT = "http://vllm:8000"
# Whole (tiny) adapter directories: the promotion job checks a version's files before any load.
ADAPTERS = Path(tempfile.mkdtemp(prefix="promotion-lifecycle-adapters-"))
atexit.register(shutil.rmtree, ADAPTERS, True)


def adapter_path(number: int) -> str:
    """A directory the `adapter_files` gate accepts: a LoRA config and a one-tensor safetensors file."""
    directory = ADAPTERS / f"v{number}"
    if not directory.is_dir():
        directory.mkdir()
        (directory / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
        header = json.dumps({"q.lora_A.weight": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
        (directory / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(4))
    return str(directory)


def settings_for(database_url: str, **promotion) -> Settings:
    return Settings(
        database_url=database_url,
        policies=[
            {
                "name": "agent",
                "base_model": "base",
                "endpoints": [f"{ENDPOINT}/v1"],
                "promotion": {"min_samples": 10, "canary_share": 0.3, "settle_s": 0, **promotion},
            }
        ],
    )


def add_run(db, *, status: str = "succeeded", loss: float | None = 0.2, kl: float | None = 0.01) -> uuid.UUID:
    run_id = uuid.uuid4()
    db.execute(
        "INSERT INTO training_runs (id, policy, status, loss, kl, finished_at) VALUES (%s, 'agent', %s, %s, %s, "
        "CASE WHEN %s = 'running' THEN NULL ELSE now() END)",
        (run_id, status, loss, kl, status),
    )
    return run_id


def add_version(
    db, number: int, *, status: str = "candidate", run: uuid.UUID | None = None, path: str | None = None
) -> uuid.UUID:
    version_id = uuid.uuid4()
    db.execute(
        "INSERT INTO adapter_versions (id, policy, version, name, status, base_model, path, training_run_id) "
        "VALUES (%s, 'agent', %s, %s, %s, 'base', %s, %s)",
        (version_id, number, f"agent-v{number}", status, path or adapter_path(number), run),
    )
    return version_id


def status_of(db, version_id: uuid.UUID) -> str:
    return db.execute("SELECT status FROM adapter_versions WHERE id = %s", (version_id,)).fetchone()[0]


def add_rewarded(db, version_id: uuid.UUID | None, values: list[float], since: datetime | None = None) -> None:
    """Rewarded runs served by `version_id` (None: the base model), each recorded with the arm it
    was drawn for: the canary's for a lineage version, the incumbent's for the promoted one."""
    at = since or datetime.now(timezone.utc)
    status = db.execute("SELECT status FROM adapter_versions WHERE id = %s", (version_id,)).fetchone()
    arm = "incumbent" if version_id is None or (status and status[0] == "promoted") else "canary"
    for value in values:
        trajectory = uuid.uuid4()
        db.execute(
            "INSERT INTO trajectories (id, tenant, model, policy, adapter_version_id, first_call_at, "
            "last_call_at, call_count, arm, arm_version_id, arm_share, arm_unit, task_key) "
            "VALUES (%s, 't', 'agent', 'agent', %s, %s, %s, 1, %s, %s, 0.3, %s, 'task')",
            (trajectory, version_id, at, at, arm, version_id, f"run:{trajectory}"),
        )
        db.execute(
            "INSERT INTO rewards (id, tenant, target_kind, target, trajectory_id, status, linked_at, name, "
            "value, content_hash, source, observed_at) VALUES (%s, 't', 'trajectory', %s, %s, 'linked', "
            "now(), 'reward', %s, '\\x00', 'key', now())",
            (uuid.uuid4(), str(trajectory), trajectory, value),
        )


def add_experiment(
    db,
    *,
    share: float,
    canary: tuple[uuid.UUID, float],
    incumbent: tuple[uuid.UUID | None, float],
    units: int,
    at: datetime,
    rng: random.Random,
) -> None:
    """`units` runs assigned as the gateway assigns them: the canary's arm with probability
    `share`; each arm's rewards uniform within 0.1 of its (version, mean)."""
    for _ in range(units):
        drawn = rng.random() < share
        version, mean = canary if drawn else incumbent
        trajectory = uuid.uuid4()
        db.execute(
            "INSERT INTO trajectories (id, tenant, model, policy, adapter_version_id, first_call_at, "
            "last_call_at, call_count, arm, arm_version_id, arm_share, arm_unit, task_key) "
            "VALUES (%s, 't', 'agent', 'agent', %s, %s, %s, 1, %s, %s, %s, %s, 'task')",
            (trajectory, version, at, at, "canary" if drawn else "incumbent", version, share, f"run:{trajectory}"),
        )
        db.execute(
            "INSERT INTO rewards (id, tenant, target_kind, target, trajectory_id, status, linked_at, name, "
            "value, content_hash, source, observed_at) VALUES (%s, 't', 'trajectory', %s, %s, 'linked', "
            "now(), 'reward', %s, '\\x00', 'key', now())",
            (uuid.uuid4(), str(trajectory), trajectory, rng.uniform(mean - 0.1, mean + 0.1)),
        )


@pytest.fixture
async def engine(database_url):
    engine = make_async_engine(database_url)
    yield engine
    await engine.dispose()


@pytest.fixture
def vllm():
    fake = FakeVLLM()
    return fake, client_for({ENDPOINT: fake})


async def test_transitions_are_recorded_idempotent_and_guarded(db, engine):
    v1, v2 = add_version(db, 1), add_version(db, 2)
    result = await lifecycle.start_canary(engine, v1, actor="alice", share=0.25, reason="looks fine")
    assert result.changed and result.version.status == "canary" and result.version.canary_share == 0.25
    again = await lifecycle.start_canary(engine, v1, actor="bob", share=0.5)
    assert not again.changed and again.version.canary_share == 0.25

    with pytest.raises(TransitionError, match="already has a canary"):
        await lifecycle.start_canary(engine, v2, actor="bob", share=0.5)
    await lifecycle.promote(engine, v1, actor="auto", reason="better")
    promoted = await lifecycle.promote(engine, v2, actor="alice")  # "promote now" of a candidate
    assert [v.name for v in promoted.side_effects] == ["agent-v1"]
    assert (status_of(db, v1), status_of(db, v2)) == ("retired", "promoted")

    with pytest.raises(TransitionError, match="agent-v2 is promoted: it cannot become rejected"):
        await lifecycle.reject(engine, v2, actor="alice")
    assert not (await lifecycle.rollback(engine, v2, actor="alice")).changed  # already promoted: nothing to do
    with pytest.raises(TransitionError, match="agent-v3 is candidate: it cannot become promoted .only from retired"):
        await lifecycle.rollback(engine, add_version(db, 3), actor="alice")
    back = await lifecycle.rollback(engine, v1, actor="carol", reason="v2 answers badly")
    assert back.changed and (status_of(db, v1), status_of(db, v2)) == ("promoted", "retired")
    assert not (await lifecycle.rollback(engine, v1, actor="carol")).changed

    rows = db.execute(
        "SELECT v.name, t.from_status, t.to_status, t.actor, t.reason FROM adapter_transitions t "
        "JOIN adapter_versions v ON v.id = t.adapter_version_id ORDER BY t.id"
    ).fetchall()
    assert rows == [
        ("agent-v1", "candidate", "canary", "alice", "looks fine"),
        ("agent-v1", "canary", "promoted", "auto", "better"),
        ("agent-v1", "promoted", "retired", "alice", "replaced by agent-v2"),
        ("agent-v2", "candidate", "promoted", "alice", None),
        ("agent-v2", "promoted", "retired", "carol", "replaced by agent-v1: v2 answers badly"),
        # v3, a candidate newer than the version rolled back to, belonged to the line given up on
        ("agent-v3", "candidate", "rejected", "carol", "lineage given up: rolled back to agent-v1"),
        ("agent-v1", "retired", "promoted", "carol", "v2 answers badly"),
    ]


async def test_concurrent_transitions_serialise(db, engine):
    versions = [add_version(db, n) for n in range(1, 7)]
    starts = await asyncio.gather(
        *(lifecycle.start_canary(engine, v, actor=f"admin{i}", share=0.2) for i, v in enumerate(versions)),
        return_exceptions=True,
    )
    assert sum(1 for r in starts if isinstance(r, lifecycle.TransitionResult)) == 1
    assert all("already has a canary" in str(r) for r in starts if isinstance(r, Exception))

    # Everyone promotes a different version at once: one wins last, the others were retired in turn.
    outcomes = await asyncio.gather(*(lifecycle.promote(engine, v, actor="admin") for v in versions))
    assert all(o.changed for o in outcomes)
    statuses = sorted(status_of(db, v) for v in versions)
    assert statuses == ["promoted"] + ["retired"] * 5
    # each promotion retired exactly the one before it: a chain with no gaps or doubles
    retired = db.execute("SELECT count(*) FROM adapter_transitions WHERE to_status = 'retired'").fetchone()[0]
    assert retired == 5
    # and the same promotion asked twice at once writes one transition
    target = next(v for v in versions if status_of(db, v) == "retired")
    twice = await asyncio.gather(
        lifecycle.rollback(engine, target, actor="a"), lifecycle.rollback(engine, target, actor="b")
    )
    assert sorted(o.changed for o in twice) == [False, True]


async def test_gates_keep_bad_candidates_out_and_the_good_one_becomes_canary(db, engine, vllm, database_url):
    fake, client = vllm
    settings = settings_for(database_url, kl_bound=0.1)
    nan = add_version(db, 1, run=add_run(db, loss=float("nan")))
    drifted = add_version(db, 2, run=add_run(db, kl=0.7))
    failed = add_version(db, 3, run=add_run(db, status="failed"))
    running = add_version(db, 4, run=add_run(db, status="running", loss=None, kl=None))
    report = await tick.promotion_tick(engine, settings, client=client)
    assert not report.errors
    assert [status_of(db, v) for v in (nan, drifted, failed, running)] == ["rejected"] * 3 + ["candidate"]
    assert fake.requests == [] or all(
        b.get("lora_name") not in ("agent-v1", "agent-v2", "agent-v3") for _, b in fake.requests
    )
    reason = db.execute("SELECT reason FROM adapter_transitions WHERE adapter_version_id = %s", (nan,)).fetchone()[0]
    assert reason == "gates failed: loss_finite: the loss is nan"
    gates = db.execute("SELECT gates FROM adapter_versions WHERE id = %s", (nan,)).fetchone()[0]
    assert gates["outcome"] == "fail" and gates["checks"][1]["value"] == "nan"
    # an admin cannot push the NaN one into a canary either
    with pytest.raises(TransitionError):
        await actions.approve(engine, settings, nan, actor="alice", client=client)

    good_old = add_version(db, 5, run=add_run(db))
    good = add_version(db, 6, run=add_run(db))
    report = await tick.promotion_tick(engine, settings, client=client)
    # the older passing version stays a candidate: in the lineage, the newest one's ancestor
    assert (status_of(db, good), status_of(db, good_old)) == ("canary", "candidate")
    assert fake.loaded == {"agent-v6": adapter_path(6)}
    assert db.execute("SELECT canary_share FROM adapter_versions WHERE id = %s", (good,)).fetchone()[0] == 0.3


async def test_automatic_and_reviewed_verdicts(db, engine, vllm, database_url):
    fake, client = vllm
    rng = random.Random(5)
    incumbent = add_version(db, 1, status="promoted")
    fake.loaded["agent-v1"] = adapter_path(1)
    reviewed = settings_for(database_url, mode="reviewed")
    automatic = settings_for(database_url)

    canary = add_version(db, 2, run=add_run(db))
    await tick.promotion_tick(engine, reviewed, client=client)
    assert status_of(db, canary) == "canary"
    add_rewarded(db, canary, [rng.uniform(0.6, 1.0) for _ in range(60)])
    add_rewarded(db, incumbent, [rng.uniform(0.0, 0.5) for _ in range(60)])
    old = datetime.now(timezone.utc) - timedelta(hours=1)
    add_rewarded(db, incumbent, [1.0] * 20, since=old)  # before the canary started: not compared
    report = await tick.promotion_tick(engine, reviewed, client=client)
    assert status_of(db, canary) == "canary", "a reviewed policy waits for the admin"
    assert any(a["action"] == "awaiting_review" for a in report.actions)
    detail = await listing.version_detail(engine, reviewed, canary)
    assert detail.version.evaluation["verdict"] == "better" and detail.version.evaluation["decision"] == "review"
    assert detail.version.evaluation["canary"]["n"] == 60 and detail.version.evaluation["incumbent"]["n"] == 60
    result = await actions.approve(engine, reviewed, "agent-v2", actor="alice", client=client)
    assert result.transition.changed and status_of(db, canary) == "promoted" and status_of(db, incumbent) == "retired"

    # automatic: a worse canary is rejected, a canary with no verdict times out
    worse = add_version(db, 3, run=add_run(db))
    await tick.promotion_tick(engine, automatic, client=client)
    assert status_of(db, worse) == "canary"
    add_rewarded(db, worse, [rng.uniform(0.0, 0.3) for _ in range(60)])
    add_rewarded(db, canary, [rng.uniform(0.5, 1.0) for _ in range(60)])
    await tick.promotion_tick(engine, automatic, client=client)
    assert status_of(db, worse) == "rejected"
    reason = db.execute(
        "SELECT reason FROM adapter_transitions WHERE adapter_version_id = %s AND to_status = 'rejected'", (worse,)
    ).fetchone()[0]
    assert reason.startswith("lineage significantly worse: mean difference -")

    slow = add_version(db, 4, run=add_run(db))
    await tick.promotion_tick(engine, automatic, client=client)
    assert status_of(db, slow) == "canary"
    later = datetime.now(timezone.utc) + timedelta(days=2)
    await tick.promotion_tick(engine, automatic, client=client, now=later)
    assert status_of(db, slow) == "rejected" and status_of(db, canary) == "promoted"


async def test_pause_blocks_automatic_canaries(db, engine, vllm, database_url):
    _, client = vllm
    settings = settings_for(database_url)
    state = await actions.set_paused(engine, settings, "agent", True, actor="alice")
    assert state.learning_paused and state.updated_by == "alice"
    assert (await actions.set_paused(engine, settings, "agent", True, actor="bob")).updated_by == "alice"
    version = add_version(db, 1, run=add_run(db))
    await tick.promotion_tick(engine, settings, client=client)
    assert status_of(db, version) == "candidate"
    await actions.set_paused(engine, settings, "agent", False, actor="alice")
    await tick.promotion_tick(engine, settings, client=client)
    assert status_of(db, version) == "canary"
    with pytest.raises(policies.PolicyNotConfigured):
        await actions.set_paused(engine, settings, "nobody", True, actor="alice")


async def test_rollback_reconcile_and_retention(db, engine, vllm, database_url, tmp_path: Path):
    fake, client = vllm
    settings = settings_for(database_url, keep_last=2, unload_grace_s=0)
    paths = {}
    for n in range(1, 6):
        paths[n] = tmp_path / f"v{n}"
        paths[n].mkdir()
        (paths[n] / "adapter_config.json").write_text("{}")
    v1 = add_version(db, 1, status="retired", path=str(paths[1]))
    add_version(db, 2, status="rejected", path=str(paths[2]))
    v3 = add_version(db, 3, status="promoted", path=str(paths[3]))
    v4 = add_version(db, 4, status="rejected", path=str(paths[4]))
    v5 = add_version(db, 5, status="candidate", path=str(paths[5]), run=add_run(db, status="running"))
    fake.loaded.update({"agent-v2": str(paths[2]), "unrelated": "/x"})

    report = await tick.promotion_tick(engine, settings, client=client)
    # the promoted version the endpoint lacked is loaded; the rejected one unloaded; others untouched
    assert fake.loaded == {"agent-v3": str(paths[3]), "unrelated": "/x"}
    assert {(a["version"], a["action"]) for a in report.actions} >= {
        ("agent-v3", "reloaded"),
        ("agent-v2", "unloaded"),
        ("agent-v2", "files_deleted"),
    }
    # newest 2 (v5, v4) kept, v1 (was promoted) and v3 kept, v2 deleted
    assert [p.exists() for p in paths.values()] == [True, False, True, True, True]
    assert db.execute("SELECT name FROM adapter_versions WHERE files_deleted_at IS NOT NULL").fetchall() == [
        ("agent-v2",)
    ]

    result = await actions.rollback(engine, settings, "agent", "v1", actor="alice", client=client)
    assert result.transition.changed and [e.action for e in result.endpoints] == ["loaded"]
    assert (status_of(db, v1), status_of(db, v3)) == ("promoted", "retired")
    assert "agent-v3" in fake.loaded  # the replaced version stays loaded until the next reconcile

    db.execute("UPDATE adapter_versions SET files_deleted_at = now() WHERE id = %s", (v3,))
    with pytest.raises(TransitionError, match="files were deleted"):
        await actions.rollback(engine, settings, "agent", str(v3), actor="alice", client=client)
    with pytest.raises(lifecycle.VersionNotFound):
        await actions.rollback(engine, settings, "agent", "v9", actor="alice", client=client)
    # v5, newer than the version rolled back to, was the line given up on: rejected with the rollback
    assert status_of(db, v5) == "rejected" and status_of(db, v4) == "rejected"


def test_the_learner_scheduler_runs_the_promotion_job(db, database_url):
    from learner.jobs.scheduler import Learner

    learner = Learner(settings_for(database_url), database_url=database_url, promotion_interval_s=30)
    assert "promotion" in {job.id for job in learner.build(blocking=False).get_jobs()}
    assert "lineage" not in {job.id for job in learner.build(blocking=False).get_jobs()}
    diverged = add_version(db, 1, run=add_run(db, loss=float("inf")))
    report = learner.promote()
    assert report is not None and status_of(db, diverged) == "rejected"
    often = Learner(
        settings_for(database_url), database_url=database_url, promotion_interval_s=30, lineage_interval_s=5
    )
    jobs = {job.id: job for job in often.build(blocking=False).get_jobs()}
    assert jobs["lineage"].trigger.interval.total_seconds() == 5 and jobs["lineage"].kwargs == {"lineage_only": True}
    # no promotion pass here, no lineage pass either: the process that runs promotion does both
    alone = Learner(settings_for(database_url), database_url=database_url, lineage_interval_s=5)
    assert not {"promotion", "lineage"} & {job.id for job in alone.build(blocking=False).get_jobs()}


async def test_the_lineage_pass_moves_and_decides_the_canary_and_leaves_the_endpoints_alone(
    db, engine, vllm, database_url
):
    """Between full passes the learner runs the lineage's steps alone, every few seconds: a new
    candidate becomes the canary and a lineage that is better is promoted by it, while the
    endpoints' unloads (tens of seconds on a busy server) wait for the full pass, under a lock of
    their own, so that a full pass unloading never holds a verdict up."""
    fake, client = vllm
    rng = random.Random(7)
    settings = settings_for(database_url, unload_grace_s=0)
    old = add_version(db, 1, status="rejected")
    fake.loaded["agent-v1"] = adapter_path(1)  # stopped serving long ago: the endpoints' step unloads it
    incumbent = add_version(db, 2, status="promoted")
    fake.loaded["agent-v2"] = adapter_path(2)
    canary = add_version(db, 3, run=add_run(db))

    waiting = await tick.promotion_tick(engine, settings, client=client, lineage_only=True)
    assert status_of(db, canary) == "canary" and "agent-v1" in fake.loaded, "no unload in a lineage pass"
    assert waiting.quiet >= {"evaluating", "skipped"}

    add_rewarded(db, canary, [rng.uniform(0.6, 1.0) for _ in range(60)])
    add_rewarded(db, incumbent, [rng.uniform(0.0, 0.4) for _ in range(60)])
    newer = add_version(db, 4, run=add_run(db))  # trained meanwhile: the canary follows it, then the verdict
    report = await tick.promotion_tick(engine, settings, client=client, lineage_only=True)
    assert [a["action"] for a in report.actions] == ["canary", "promoted"], report.actions
    assert [status_of(db, v) for v in (old, incumbent, canary, newer)] == [
        "rejected",
        "retired",
        "candidate",
        "promoted",
    ]
    assert "agent-v1" in fake.loaded

    # A full pass while another process holds the endpoints' lock (unloading on a slow server):
    # the lineage's steps run, the endpoints' are skipped, not waited for.
    newest = add_version(db, 5, run=add_run(db))
    with psycopg.connect(database_url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(hashtext('apprentice.promotion.endpoints.agent'))")
        report = await tick.promotion_tick(engine, settings, client=client)
    assert status_of(db, newest) == "canary" and "agent-v1" in fake.loaded
    assert ("skipped", "another process holds apprentice.promotion.endpoints.agent") in {
        (a["action"], a["detail"]) for a in report.actions
    }
    await tick.promotion_tick(engine, settings, client=client)
    assert "agent-v1" not in fake.loaded, "the next full pass unloads it"


async def test_reconciler_unload_cannot_undo_a_concurrent_rollback(db, engine, database_url):
    fake = FakeVLLM()

    async def slow(request):  # every endpoint answer takes a while, so the two interleave
        await asyncio.sleep(0.02)
        return fake(request)

    import httpx

    settings = settings_for(database_url, unload_grace_s=0)
    v1 = add_version(db, 1, status="retired")
    add_version(db, 2, status="promoted")
    db.execute(
        "INSERT INTO adapter_transitions (adapter_version_id, policy, from_status, to_status, actor, created_at) "
        "VALUES (%s, 'agent', 'promoted', 'retired', 'auto', now() - interval '1 hour')",
        (v1,),
    )
    fake.loaded.update({"agent-v1": adapter_path(1), "agent-v2": adapter_path(2)})
    async with httpx.AsyncClient(transport=httpx.MockTransport(slow)) as client:
        await asyncio.gather(
            reconcile.reconcile(engine, settings.policies[0], client=client),
            actions.rollback(engine, settings, "agent", "v1", actor="alice", client=client),
        )
    assert status_of(db, v1) == "promoted"
    assert "agent-v1" in fake.loaded, "the promoted adapter must be loaded whatever the interleaving"


async def test_the_canary_follows_the_lineage_and_the_verdict_counts_every_lineage_version(
    db, engine, vllm, database_url
):
    from apprentice.promotion.lineage import lineage_head
    from apprentice.promotion.status import VersionStatus

    fake, client = vllm
    rng = random.Random(11)
    settings = settings_for(database_url)
    v1 = add_version(db, 1, status="promoted")
    fake.loaded["agent-v1"] = adapter_path(1)
    v2 = add_version(db, 2, run=add_run(db))
    await tick.promotion_tick(engine, settings, client=client)
    assert status_of(db, v2) == "canary"
    add_rewarded(db, v2, [rng.uniform(0.5, 1.0) for _ in range(8)])
    add_rewarded(db, v1, [rng.uniform(0.0, 0.5) for _ in range(8)])
    await tick.promotion_tick(engine, settings, client=client)
    assert status_of(db, v2) == "canary", "fewer than min_samples: no verdict"
    started = db.execute(
        "SELECT created_at FROM adapter_transitions WHERE adapter_version_id = %s AND to_status = 'canary'", (v2,)
    ).fetchone()[0]

    # a newer gated version of the lineage: loaded, then the canary moves to it with the same share
    v3 = add_version(db, 3, run=add_run(db))
    db.execute("UPDATE adapter_versions SET parent_version_id = %s WHERE id = %s", (v2, v3))
    report = await tick.promotion_tick(engine, settings, client=client)
    assert (status_of(db, v2), status_of(db, v3)) == ("candidate", "canary")
    assert {"agent-v2", "agent-v3"} <= set(fake.loaded), "the superseded canary stays loaded for the grace"
    assert db.execute("SELECT canary_share FROM adapter_versions WHERE id = %s", (v3,)).fetchone()[0] == 0.3
    assert ("agent-v3", "canary") in {(a["version"], a["action"]) for a in report.actions}
    moves = db.execute(
        "SELECT v.name, t.from_status, t.to_status, t.reason FROM adapter_transitions t JOIN "
        "adapter_versions v ON v.id = t.adapter_version_id WHERE t.created_at > %s ORDER BY t.id",
        (started,),
    ).fetchall()
    assert moves == [
        ("agent-v2", "canary", "candidate", "superseded by agent-v3"),
        ("agent-v3", "candidate", "canary", "gates passed; the canary follows its lineage from agent-v2"),
    ]
    evaluation = (await listing.version_detail(engine, settings, v3)).version.evaluation
    assert evaluation["canary_since"] == started.isoformat(), "the lineage's clock, not the latest move's"
    assert evaluation["canary"]["n"] == 8 and evaluation["newest"]["canary"]["n"] == 0
    assert evaluation["lineage"] == ["agent-v2", "agent-v3"]

    # the lineage's evidence adds up: v2's eight and v3's sixty against the promoted version's 68
    add_rewarded(db, v3, [rng.uniform(0.5, 1.0) for _ in range(60)])
    add_rewarded(db, v1, [rng.uniform(0.0, 0.5) for _ in range(60)])
    await tick.promotion_tick(engine, settings, client=client)
    assert (status_of(db, v3), status_of(db, v1), status_of(db, v2)) == ("promoted", "retired", "candidate")
    reason = db.execute(
        "SELECT reason FROM adapter_transitions WHERE adapter_version_id = %s AND to_status = 'promoted'", (v3,)
    ).fetchone()[0]
    assert reason.startswith("lineage significantly better: mean difference +")

    # the next lineage: its newest version alone significantly worse rejects the whole lineage
    v4 = add_version(db, 4, run=add_run(db))
    await tick.promotion_tick(engine, settings, client=client)
    v5 = add_version(db, 5, run=add_run(db))
    await tick.promotion_tick(engine, settings, client=client)
    assert (status_of(db, v4), status_of(db, v5)) == ("candidate", "canary")
    v5_since = db.execute(
        "SELECT max(created_at) FROM adapter_transitions WHERE adapter_version_id = %s AND to_status = 'canary'",
        (v5,),
    ).fetchone()[0]
    # v4's period (before v5 became the canary): much better; v5's own: much worse
    add_experiment(
        db,
        share=0.3,
        canary=(v4, 0.9),
        incumbent=(v3, 0.5),
        units=400,
        at=v5_since - timedelta(milliseconds=1),
        rng=rng,
    )
    add_experiment(db, share=0.3, canary=(v5, 0.1), incumbent=(v3, 0.5), units=200, at=v5_since, rng=rng)
    await tick.promotion_tick(engine, settings, client=client)
    assert (status_of(db, v4), status_of(db, v5), status_of(db, v3)) == ("rejected", "rejected", "promoted")
    reasons = {r[0] for r in db.execute("SELECT reason FROM adapter_transitions WHERE to_status = 'rejected'")}
    assert len(reasons) == 1 and reasons.pop().startswith("newest version agent-v5 significantly worse")
    async with engine.connect() as connection:
        versions = await lifecycle.versions_of(connection, "agent", tuple(VersionStatus))
    assert lineage_head(versions).name == "agent-v3", "the learner starts again from the promoted version"

    # reviewed: the canary keeps following the lineage, the verdict waits for the admin
    reviewed = settings_for(database_url, mode="reviewed")
    v6 = add_version(db, 6, run=add_run(db))
    await tick.promotion_tick(engine, reviewed, client=client)
    v7 = add_version(db, 7, run=add_run(db))
    report = await tick.promotion_tick(engine, reviewed, client=client)
    assert (status_of(db, v6), status_of(db, v7)) == ("candidate", "canary")
    assert ("agent-v7", "awaiting_review") in {(a["version"], a["action"]) for a in report.actions}
    # the admin's rejection of the canary rejects its lineage
    result = await actions.reject(engine, reviewed, "agent-v7", actor="alice")
    assert [v.name for v in result.transition.side_effects] == ["agent-v6"]
    assert (status_of(db, v6), status_of(db, v7)) == ("rejected", "rejected")


def test_the_admin_api_shows_the_lineage_and_what_each_version_trained_on(start_gateway, fake_upstream, db):
    import httpx

    gateway = start_gateway(policies=[{"name": "agent", "base_model": "base", "endpoints": [fake_upstream.api_base]}])
    v1 = add_version(db, 1, status="promoted")
    v2 = add_version(db, 2, status="candidate", run=add_run(db))
    v3 = add_version(db, 3, status="canary", run=(run3 := add_run(db)))
    db.execute("UPDATE adapter_versions SET parent_version_id = %s WHERE id = %s", (v1, v2))
    db.execute("UPDATE adapter_versions SET parent_version_id = %s WHERE id = %s", (v2, v3))
    db.execute("UPDATE training_runs SET samples = 48 WHERE id = %s", (run3,))
    add_rewarded(db, v1, [0.5] * 3)
    add_rewarded(db, v2, [0.5] * 2)
    add_rewarded(db, None, [0.5])
    db.execute("UPDATE trajectories SET trained_in_run_id = %s", (run3,))

    def get(path: str) -> dict:
        response = httpx.get(f"{gateway.base_url}/admin{path}", timeout=30)
        assert response.status_code == 200, response.text
        return response.json()

    policy = get("/policies/agent")
    assert [v["name"] for v in policy["lineage"]] == ["agent-v2", "agent-v3"]
    assert policy["lineage_head"]["name"] == "agent-v3" and policy["candidates"] == 1
    detail = get("/versions/agent-v3")
    assert detail["parent"] == {"id": str(v2), "name": "agent-v2"}
    assert detail["lineage"] is True and detail["lineage_head"] == "agent-v3" and detail["samples"] == 48
    assert [(s["name"], s["trajectories"]) for s in detail["sampled_by"]] == [
        ("agent-v1", 3),
        ("agent-v2", 2),
        (None, 1),
    ]
    listing = {v["name"]: v for v in get("/policies/agent/versions")["data"]}
    assert listing["agent-v1"]["lineage"] is False and listing["agent-v1"]["parent"] is None
    assert listing["agent-v2"]["parent"]["name"] == "agent-v1" and listing["agent-v2"]["sampled_by"] == []
    assert listing["agent-v3"]["sampled_by"] == detail["sampled_by"]
    assert get("/policies")["data"][0]["lineage_head"]["name"] == "agent-v3"
