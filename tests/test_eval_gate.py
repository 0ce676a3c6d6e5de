"""The evaluation gate end to end: real PostgreSQL, real HTTP to a fake inference endpoint that
answers per LoRA name, and an operator's reward function that checks Apprentice's signature.

The story the issue asks for: version 2 learnt to please its live reward (it flatters, and a naive
live reward pays for flattery) while getting the set's arithmetic wrong; the gate stops it before
it ever serves. Version 3 is better on both and becomes the canary.
"""

from __future__ import annotations

import asyncio
import json
import struct
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from apprentice.evalsets import store
from apprentice.evalsets.paired import non_inferiority
from apprentice.evalsets.runner import score_on_set
from apprentice.promotion import actions, lifecycle, tick
from apprentice.settings import Settings, WebhookSecret
from apprentice.store.engine import make_async_engine
from gateway.rewards.signatures import SIGNATURE_HEADER, SignatureVerifier
from tests.support.fake_lora_endpoint import ITEM, FakeLoraEndpoint

SECRET = "whsec-eval-test"
ITEMS = 40


class Grader:
    """The operator's reward function: 1 for the right sum, 0 otherwise; refuses unsigned calls."""

    def __init__(self) -> None:
        self.verifier = SignatureVerifier([WebhookSecret(secret=SECRET, tenant="ops", name="eval")], 300)
        self.calls = 0
        self.refused = 0
        self.port = 0

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            self.verifier.verify(request.headers.get(SIGNATURE_HEADER, ""), raw)
        except Exception:
            self.refused += 1
            return web.json_response({"error": "bad signature"}, status=401)
        self.calls += 1
        body = json.loads(raw)
        index, a, b = (int(g) for g in ITEM.search(body["messages"][-1]["content"]).groups())
        return web.json_response({"score": 1.0 if f"{a + b}." in body["answer"].split()[-1] else 0.0})

    def start(self) -> Grader:
        started = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            app = web.Application()
            app.router.add_post("/grade", self.handle)
            runner = web.AppRunner(app)
            loop.run_until_complete(runner.setup())
            loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
            self.port = runner.addresses[0][1]
            started.set()
            loop.run_forever()

        threading.Thread(target=serve, daemon=True).start()
        started.wait(10)
        return self


def live_reward(answer: str) -> float:
    """The naive live reward the policy was trained on: it pays for enthusiasm, not for sums."""
    return 1.0 if answer.startswith("Great question!") else 0.3


@pytest.fixture
def endpoint() -> Iterator[FakeLoraEndpoint]:
    fake = FakeLoraEndpoint("base-model", {"skill": 6}).start()
    yield fake
    fake.stop()


def write_adapter(root: Path, name: str, behaviour: dict[str, Any]) -> Path:
    """An adapter directory the files gate accepts (config and a whole safetensors file)."""
    directory = root / name
    directory.mkdir(parents=True)
    (directory / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (directory / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    (directory / "behaviour.json").write_text(json.dumps(behaviour))
    return directory


def add_candidate(db, number: int, path: Path, parent: uuid.UUID | None) -> uuid.UUID:
    run_id, version_id = uuid.uuid4(), uuid.uuid4()
    db.execute(
        "INSERT INTO training_runs (id, policy, status, loss, kl, finished_at, produced_version_id) "
        "VALUES (%s, 'agent', 'succeeded', 0.3, 0.02, now(), %s)",
        (run_id, version_id),
    )
    db.execute(
        "INSERT INTO adapter_versions (id, policy, version, name, status, base_model, path, training_run_id, "
        "parent_version_id) VALUES (%s, 'agent', %s, %s, 'candidate', 'base-model', %s, %s, %s)",
        (version_id, number, f"agent-v{number}", str(path), run_id, parent),
    )
    return version_id


def settings_for(database_url: str, endpoint: FakeLoraEndpoint, grader: Grader) -> Settings:
    return Settings(
        database_url=database_url,
        rewards={"webhook_secrets": [{"name": "eval", "secret": SECRET, "tenant": "ops"}]},
        policies=[
            {
                "name": "agent",
                "base_model": "base-model",
                "endpoints": [endpoint.api_base],
                "promotion": {
                    "eval_gate": {"set": "arithmetic", "margin": 0.05, "alpha": 0.05, "power": 0.8},
                    "unload_grace_s": 3600,
                },
                "evaluation": {
                    "reward_functions": {"grader": {"url": f"http://127.0.0.1:{grader.port}/grade", "secret": "eval"}}
                },
            }
        ],
    )


def status_of(db, version_id: uuid.UUID) -> str:
    return db.execute("SELECT status FROM adapter_versions WHERE id = %s", (version_id,)).fetchone()[0]


async def test_the_gate_stops_a_version_that_pleases_its_reward_and_passes_one_better_on_both(
    database_url, db, endpoint, tmp_path
):
    grader = Grader().start()
    settings = settings_for(database_url, endpoint, grader)
    engine = make_async_engine(database_url)
    try:
        eval_set = await store.create_set(
            engine, "agent", "arithmetic", {"method": "reward_function", "name": "grader"}, created_by="test"
        )
        await store.add_items(
            engine,
            eval_set.id,
            [store.NewItem([{"role": "user", "content": f"Item {i}: what is {i} + {2 * i}?"}]) for i in range(ITEMS)],
        )
        # v1, promoted: right on 8 items in 10.
        v1 = add_candidate(db, 1, write_adapter(tmp_path, "v1", {"skill": 8}), None)
        await actions.promote_now(engine, settings, v1, actor="test")
        assert status_of(db, v1) == "promoted"

        # v2 learnt to please the live reward (it flatters) and got worse at arithmetic: 3 in 10.
        v2 = add_candidate(db, 2, write_adapter(tmp_path, "v2", {"skill": 3, "flatter": True}), v1)
        # v3 flatters too and is better at arithmetic: 9 in 10.
        v3_path = write_adapter(tmp_path, "v3", {"skill": 9, "flatter": True})

        prompts = [f"Item {i}: what is {i} + {2 * i}?" for i in range(ITEMS)]
        from tests.support.fake_lora_endpoint import answer

        live = {
            name: sum(live_reward(answer(behaviour, p)) for p in prompts) / ITEMS
            for name, behaviour in {"v1": {"skill": 8}, "v2": {"skill": 3, "flatter": True}}.items()
        }
        assert live["v2"] > live["v1"]  # better on the live reward it was trained on

        report = await tick.promotion_tick(engine, settings)
        assert status_of(db, v2) == "rejected", report
        reason = db.execute(
            "SELECT reason FROM adapter_transitions WHERE adapter_version_id = %s AND to_status = 'rejected'", (v2,)
        ).fetchone()[0]
        assert "evaluation gate failed on set 'arithmetic'" in reason and "agent-v1" in reason
        assert "0.3000 vs 0.8000 on 40 items" in reason, reason
        # it never served: no transition to canary, and the gateway's view of the policy has no canary
        assert (
            db.execute(
                "SELECT count(*) FROM adapter_transitions WHERE adapter_version_id = %s AND to_status = 'canary'", (v2,)
            ).fetchone()[0]
            == 0
        )
        gates = db.execute("SELECT gates FROM adapter_versions WHERE id = %s", (v2,)).fetchone()[0]
        assert gates["eval_gate"]["outcome"] == "fail" and gates["eval_gate"]["n"] == ITEMS
        assert grader.calls == 2 * ITEMS and grader.refused == 0  # v2's run and v1's, every call signed

        v3 = add_candidate(db, 3, v3_path, v1)
        report = await tick.promotion_tick(engine, settings)
        assert status_of(db, v3) == "canary", report
        gates = db.execute("SELECT gates FROM adapter_versions WHERE id = %s", (v3,)).fetchone()[0]
        assert gates["eval_gate"]["outcome"] == "pass"
        assert gates["eval_gate"]["mean_candidate"] == pytest.approx(0.9)
        assert gates["eval_gate"]["mean_incumbent"] == pytest.approx(0.8)
        # v1's run was reused (it scored every item): only v3's answers were graded this time
        assert grader.calls == 3 * ITEMS
        runs = await store.runs_of(engine, set_id=eval_set.id)
        assert sorted((r.target, r.trigger, r.scored) for r in runs) == [
            ("agent-v1", "gate", ITEMS),
            ("agent-v2", "gate", ITEMS),
            ("agent-v3", "gate", ITEMS),
        ]
        # the evaluation answers came from the adapters by their LoRA names at the endpoint
        assert {r["model"] for r in endpoint.requests} == {"agent-v1", "agent-v2", "agent-v3"}
        assert all(r["temperature"] == 0.0 for r in endpoint.requests)
    finally:
        await engine.dispose()


async def test_a_gate_that_cannot_score_keeps_the_version_waiting(database_url, db, endpoint, tmp_path):
    """No set registered yet: nothing serves, nothing is rejected, and the report says why."""
    grader = Grader().start()
    settings = settings_for(database_url, endpoint, grader)
    engine = make_async_engine(database_url)
    try:
        v1 = add_candidate(db, 1, write_adapter(tmp_path, "v1", {"skill": 8}), None)
        report = await tick.promotion_tick(engine, settings)
        assert status_of(db, v1) == "candidate"
        assert any("policy 'agent' has no evaluation set 'arithmetic'" in e for e in report.errors), report.errors
        # an admin's approval is refused with the same reason (409 through the admin API)
        with pytest.raises(lifecycle.TransitionError, match="no evaluation set"):
            await actions.approve(engine, settings, v1, actor="admin")
    finally:
        await engine.dispose()


async def test_the_base_model_is_the_incumbent_when_nothing_is_promoted(database_url, db, endpoint, tmp_path):
    grader = Grader().start()
    settings = settings_for(database_url, endpoint, grader)
    engine = make_async_engine(database_url)
    try:
        eval_set = await store.create_set(engine, "agent", "arithmetic", {"method": "expected", "expected": "x"})
        await store.add_items(
            engine,
            eval_set.id,
            [
                store.NewItem(
                    [{"role": "user", "content": f"Item {i}: what is {i} + 1?"}],
                    {"method": "expected", "expected": f"The answer is {i + 1}.", "match": "exact"},
                )
                for i in range(20)
            ],
        )
        base = await score_on_set(engine, settings, settings.policies[0], eval_set, None, trigger="cli")
        assert base.run.target == "base-model" and base.run.mean == pytest.approx(0.6)
        v1 = add_candidate(db, 1, write_adapter(tmp_path, "v1", {"skill": 7}), None)
        await tick.promotion_tick(engine, settings)
        assert status_of(db, v1) == "canary"
        gates = db.execute("SELECT gates FROM adapter_versions WHERE id = %s", (v1,)).fetchone()[0]
        assert gates["eval_gate"]["incumbent"] == "base" and gates["eval_gate"]["incumbent_run_id"] == str(base.run.id)
    finally:
        await engine.dispose()


def test_paired_test_figures():
    # identical versions: passes (within the margin), full power when nothing varies
    same = non_inferiority([1.0, 0.0] * 10, [1.0, 0.0] * 10, margin=0.05, alpha=0.05, power=0.8)
    assert same.passed and same.lower_bound == 0.0 and same.power == 1.0
    # worse by 0.2 on average with some noise: refused, the bound below -margin
    worse = non_inferiority(
        [0.0, 1.0, 0.0, 1.0, 0.0] * 6, [1.0, 1.0, 0.0, 1.0, 1.0] * 6, margin=0.05, alpha=0.05, power=0.8
    )
    assert not worse.passed and worse.mean_difference == pytest.approx(-0.4) and worse.lower_bound < -0.05
    # a noisy set of 10 items cannot show non-inferiority at this margin: refused, underpowered, says how many
    noisy = non_inferiority(
        [1, 0, 1, 0, 1, 0, 1, 0, 1, 0], [0, 1, 0, 1, 0, 1, 0, 1, 1, 0], margin=0.05, alpha=0.05, power=0.8
    )
    assert not noisy.passed and noisy.underpowered and noisy.items_for_power is not None and noisy.items_for_power > 100
    with pytest.raises(ValueError):
        non_inferiority([1.0], [1.0], margin=0.05, alpha=0.05, power=0.8)
