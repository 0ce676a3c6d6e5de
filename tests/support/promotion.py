"""The promotion cycle's test harness: the tiny local inference server with real PEFT adapters,
gateways with an admin key in front of it, what the learner writes when a run ends, the
promotion tick, agent runs across gateways, background load during every switch, and a canary
round rewarded through the API.

Used by tests/test_promotion_cycle.py and the tests built on the same setup (adapter files,
replicas, the fault-injecting inference endpoint, endpoint discovery). `tiny` and `local_server`
are module-scoped fixtures: a test module imports them by name.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from apprentice.promotion import actions
from apprentice.promotion.serving import ActionResult
from apprentice.promotion.tick import promotion_tick
from apprentice.promotion.tick_report import TickReport
from apprentice.settings import Settings
from apprentice.store.engine import make_async_engine
from tests.conftest import wait_for
from tests.support.processes import ModelServerProcess

ADMIN_KEY = "sk-admin-promotion-test"
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}


class LocalServerProcess(ModelServerProcess):
    """The local server on the tiny model, with a way to read which adapters it holds."""

    def __init__(self, workdir: Path, model_dir: Path) -> None:
        super().__init__(workdir, model_dir, "tiny", "--threads", "1", "--default-max-tokens", "4", start_timeout=120)

    def models(self) -> dict[str, str | None]:
        return {m["id"]: m.get("root") for m in httpx.get(f"{self.api_base}/models", timeout=30).json()["data"]}


@dataclass
class Models:
    base: Path
    adapters: dict[int, Path]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Models:
    """A tiny random Llama with SmolLM2's tokenizer, and three LoRA adapters that change its outputs."""
    from learner.models import fetch_default_model
    from tests.learner.conftest import make_adapter
    from tests.learner.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("promotion-models")
    base = build_tiny_model(root / "base", tokenizer_dir=fetch_default_model())
    return Models(base, {seed: make_adapter(base, root / f"adapter-{seed}", seed=seed) for seed in (1, 2, 3)})


@pytest.fixture(scope="module")
def local_server(tiny: Models, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServerProcess]:
    server = LocalServerProcess(tmp_path_factory.mktemp("serve-model"), tiny.base)
    server.start()
    yield server
    server.stop()


def policy_config(name: str, server: LocalServerProcess, **promotion: Any) -> dict[str, Any]:
    return {
        "name": name,
        "base_model": "tiny",
        "endpoints": [server.api_base],
        "temperature": 1.0,
        "promotion": {"canary_share": 0.5, "min_samples": 6, "unload_grace_s": 30, **promotion},
    }


def start_gateways(start_gateway, tmp_path: Path, policy: dict[str, Any], count: int) -> list[Any]:
    """`count` gateway processes on one database. run_task alternates a run's calls between them,
    so each second call finds its parent in the store (gateway/trajectories/parents.py). The
    margin is generous: in CI this runs beside training on two cores, where a second call may not
    find its parent within the default 0.3 s (one run of about 80 changed version at its second
    call once, from this or from a gateway's stale view; serves_canary closes the other). A miss
    is documented behaviour; bench/canary_stickiness.py measures it at the default."""
    return [
        start_gateway(
            data_dir=tmp_path / f"gateway-{i}",
            policies=[policy],
            adapter_poll_interval_s=0.2,
            auth={"mode": "keys", "admin_key": ADMIN_KEY},
            stitching={"parent_wait_margin_s": 5.0},
        )
        for i in range(count)
    ]


def add_candidate(db, policy: str, number: int, path: Path, *, loss: float = 0.31, kl: float = 0.02) -> uuid.UUID:
    """What the learner writes when a run ends: the run (succeeded) and its candidate version."""
    run_id, version_id = uuid.uuid4(), uuid.uuid4()
    db.execute(
        "INSERT INTO training_runs (id, policy, status, loss, kl, finished_at, produced_version_id) "
        "VALUES (%s, %s, 'succeeded', %s, %s, now(), %s)",
        (run_id, policy, loss, kl, version_id),
    )
    db.execute(
        "INSERT INTO adapter_versions (id, policy, version, name, status, base_model, path, training_run_id, "
        "rank, alpha) VALUES (%s, %s, %s, %s, 'candidate', 'tiny', %s, %s, 8, 16)",
        (version_id, policy, number, f"{policy}-v{number}", str(path), run_id),
    )
    return version_id


def status_of(db, version_id: uuid.UUID) -> str:
    return db.execute("SELECT status FROM adapter_versions WHERE id = %s", (version_id,)).fetchone()[0]


def tick(database_url: str, policy: dict[str, Any], now: datetime | None = None) -> TickReport:
    """One pass of the promotion job, as the learner's scheduler runs it."""
    settings = Settings(database_url=database_url, policies=[policy])

    async def once() -> TickReport:
        engine = make_async_engine(database_url)
        try:
            return await promotion_tick(engine, settings, now=now)
        finally:
            await engine.dispose()

    report = asyncio.run(once())
    assert not report.errors, report.errors
    return report


def promote_now(database_url: str, policy: dict[str, Any], ref: str) -> ActionResult:
    """An admin's promote-now, straight through the promotion actions (no gateway)."""

    async def once() -> ActionResult:
        engine = make_async_engine(database_url)
        try:
            settings = Settings(database_url=database_url, policies=[policy])
            return await actions.promote_now(engine, settings, ref, actor="admin")
        finally:
            await engine.dispose()

    return asyncio.run(once())


@dataclass
class Run:
    trajectory_id: str
    served: list[str]
    call_ids: list[str]


_counter = itertools.count()


def run_task(gateways: list[Any], policy: str, task: str, turns: int = 2) -> Run:
    """An agent run of `turns` calls, alternating between the gateway processes."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    served, ids, trajectory = [], [], None
    start = next(_counter)
    for turn in range(turns):
        gateway = gateways[(start + turn) % len(gateways)]
        response = httpx.post(
            f"{gateway.base_url}/chat/completions",
            headers=AUTH,
            timeout=120,
            json={"model": policy, "messages": messages, "max_tokens": 4},
        )
        assert response.status_code == 200, response.text
        body = response.json()
        served.append(body["model"])
        ids.append(response.headers["x-apprentice-call-id"])
        trajectory = trajectory or response.headers["x-trajectory-id"]
        answer = {k: v for k, v in body["choices"][0]["message"].items() if v is not None}
        messages += [answer, {"role": "user", "content": f"and then? {turn}"}]
    assert trajectory is not None
    return Run(trajectory, served, ids)


def post_rewards(gateway: Any, rewards: list[tuple[str, float]]) -> None:
    response = httpx.post(
        f"{gateway.base_url}/rewards",
        headers=AUTH,
        timeout=60,
        json={"rewards": [{"trajectory_id": t, "reward": v} for t, v in rewards]},
    )
    assert response.status_code == 200, response.text


def linked(db, trajectory_ids: list[str]) -> int:
    return db.execute(
        "SELECT count(*) FROM rewards WHERE status = 'linked' AND trajectory_id = ANY(%s::uuid[])",
        ([uuid.UUID(t) for t in trajectory_ids],),
    ).fetchone()[0]


def admin(gateway: Any, method: str, path: str, json: Any = None) -> httpx.Response:
    return httpx.request(method, f"{gateway.base_url}/admin{path}", headers=AUTH, json=json, timeout=120)


class BackgroundLoad:
    """Calls through every gateway until stopped (a third streamed); remembers each call it saw."""

    def __init__(self, gateways: list[Any], policy: str, concurrency: int = 2) -> None:
        self.gateways, self.policy, self.concurrency = gateways, policy, concurrency
        self.seen: list[tuple[str, str]] = []  # (call id, served model)
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> BackgroundLoad:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(60)

    async def _one(self, client: httpx.AsyncClient, gateway: Any, i: int) -> None:
        body = {"model": self.policy, "max_tokens": 3, "messages": [{"role": "user", "content": f"background {i}"}]}
        if i % 3 == 0:
            body["stream"] = True
            async with client.stream("POST", f"{gateway.base_url}/chat/completions", json=body) as response:
                data = b"".join([chunk async for chunk in response.aiter_bytes()])
                if response.status_code != 200 or not data.rstrip().endswith(b"data: [DONE]"):
                    self.failures.append(f"stream {response.status_code}: {data[-300:]!r}")
                    return
                model = next(line for line in data.split(b"\n") if line.startswith(b"data: {"))
                import orjson

                self.seen.append((response.headers["x-apprentice-call-id"], orjson.loads(model[6:])["model"]))
            return
        response = await client.post(f"{gateway.base_url}/chat/completions", json=body)
        if response.status_code != 200:
            self.failures.append(f"{response.status_code}: {response.text[:300]}")
            return
        self.seen.append((response.headers["x-apprentice-call-id"], response.json()["model"]))

    async def _worker(self, worker: int) -> None:
        async with httpx.AsyncClient(headers=AUTH, timeout=120) as client:
            for i in itertools.count(worker * 100_000):
                if self._stop.is_set():
                    return
                try:
                    await self._one(client, self.gateways[i % len(self.gateways)], i)
                except Exception as exc:  # a connection error is a failed call too
                    self.failures.append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.02)

    async def _main(self) -> None:
        await asyncio.gather(*(self._worker(w) for w in range(self.concurrency)))


def canary_round(
    db,
    gateways,
    policy: str,
    names: tuple[str, str],
    canary_reward: float,
    incumbent_reward: float,
    rng: random.Random,
    min_each: int = 20,
) -> list[Run]:
    """Runs until both arms have `min_each` runs; rewards them (canary vs incumbent) by POST /v1/rewards."""
    runs: list[Run] = []
    while min(sum(r.served[0] == name for r in runs) for name in names) < min_each:
        assert len(runs) < 200, f"the split never filled both arms: {[r.served[0] for r in runs]}"
        runs.append(run_task(gateways, policy, f"task {uuid.uuid4().hex[:8]}: name a colour"))
    assert all(len(set(r.served)) == 1 for r in runs), "every run stays on the version of its first call"
    assert {r.served[0] for r in runs} == set(names)
    rewards = [
        (r.trajectory_id, (canary_reward if r.served[0] == names[0] else incumbent_reward) + rng.uniform(-0.05, 0.05))
        for r in runs
    ]
    post_rewards(gateways[0], rewards)
    wait_for(lambda: linked(db, [r.trajectory_id for r in runs]) == len(runs), timeout=30, message="rewards linked")
    return runs


def serves_canary(gateways: list[Any], policy: str, name: str) -> None:
    """Within a few seconds, every gateway has served a new run on the canary `name`: each knows
    it, so a run started on it at one process is not continued by another that does not yet
    (which would serve the run's next call on the promoted version). A fixed sleep of three
    poll intervals was not always enough on a loaded CI machine."""

    def on_canary(gateway: Any) -> bool:
        return run_task([gateway], policy, f"canary probe {uuid.uuid4().hex[:6]}", turns=1).served == [name]

    for gateway in gateways:
        wait_for(lambda g=gateway: on_canary(g), timeout=15, interval=0.1, message=f"{gateway.base_url} serves {name}")


def routes_to(gateways: list[Any], policy: str, name: str) -> None:
    """Within a few seconds, every gateway sends new runs to `name`."""

    def all_there() -> bool:
        return all(run_task([g], policy, f"probe {uuid.uuid4().hex[:6]}", turns=1).served == [name] for g in gateways)

    wait_for(all_there, timeout=10, interval=0.2, message=f"every gateway on {name}")
    for gateway in gateways:  # and stays there
        assert {run_task([gateway], policy, f"check {i}", turns=1).served[0] for i in range(3)} == {name}
