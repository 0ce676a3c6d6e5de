"""A gateway's background workers, seen from outside: a failing worker is named in /readyz and
counted in /metrics, and the lifecycle's NOTIFY switches adapter versions without the poll."""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import openai
import pytest

from apprentice.promotion import lifecycle
from apprentice.store.engine import make_async_engine
from tests.conftest import wait_for
from tests.test_adapter_routing import add_version
from tests.test_durability import proxied
from tests.test_operations import metric

POLL = "adapter-version-poll"
LISTENER = "adapter-notify-listener"
WORKERS = {
    "api-key-refresh",
    POLL,
    LISTENER,
    "journal-shipper",
    "trajectory-stitcher",
    "reward-linker",
    "limit-sync",  # per-key and per-tenant limit counts exchanged between processes
    "history-maintenance",  # partitions of calls created ahead, retention (docs/history.md)
}


def readiness(gateway) -> httpx.Response:  # noqa: ANN001
    return httpx.get(gateway.url + "/readyz", timeout=10)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_worker_is_reported_in_readyz_and_metrics(start_gateway, db, workers):
    gateway = start_gateway(workers=workers, adapter_poll_interval_s=0.1)
    ready = readiness(gateway)
    assert ready.status_code == 200 and ready.json()["status"] == "ready" and ready.json()["failing_workers"] == []
    assert set(ready.json()["checks"]["workers"]) == WORKERS
    assert all(worker["ok"] for worker in ready.json()["checks"]["workers"].values())

    # Only the version poll reads this table: it fails, every other worker and the store are fine.
    db.execute("ALTER TABLE adapter_versions RENAME TO adapter_versions_away")
    try:
        degraded = wait_for(lambda: (r := readiness(gateway)).json()["failing_workers"] and r, message="degraded")
        body = degraded.json()
        assert degraded.status_code == 200, "a failing worker does not take the gateway out of rotation"
        assert body["status"] == "degraded" and body["failing_workers"] == [POLL]
        poll = body["checks"]["workers"][POLL]
        assert poll["ok"] is False and poll["consecutive_failures"] >= 3
        assert "UndefinedTable" in poll["last_error"] and "adapter_versions" in poll["last_error"]
        assert body["checks"]["store"]["ok"] is True

        text = httpx.get(gateway.url + "/metrics").text
        assert metric(text, f'apprentice_worker_failures_total{{worker="{POLL}"}}') >= 3
        assert metric(text, f'apprentice_worker_consecutive_failures{{worker="{POLL}"}}') >= 3
        assert metric(text, 'apprentice_worker_failures_total{worker="journal-shipper"}') == 0
        assert metric(text, 'apprentice_worker_consecutive_failures{worker="journal-shipper"}') == 0
        # "min" across processes: 0 until every process's shipper has made its first pass, which
        # on a loaded machine can come after the poll's third failure (CI: 0.0 with 2 processes).
        shipper_success = wait_for(
            lambda: metric(
                httpx.get(gateway.url + "/metrics").text,
                'apprentice_worker_last_success_timestamp_seconds{worker="journal-shipper"}',
            ),
            message="every process's journal shipper has made a pass",
        )
        assert time.time() - 30 < shipper_success <= time.time()
    finally:
        db.execute("ALTER TABLE adapter_versions_away RENAME TO adapter_versions")

    recovered = wait_for(lambda: (r := readiness(gateway)).json()["status"] == "ready" and r, message="recovered")
    assert recovered.json()["failing_workers"] == [] and recovered.json()["checks"]["workers"][POLL]["ok"]
    wait_for(
        lambda: (
            metric(
                httpx.get(gateway.url + "/metrics").text, f'apprentice_worker_consecutive_failures{{worker="{POLL}"}}'
            )
            == 0
        ),
        message="every process recovered",
    )


def promote(database_url: str, version_id: uuid.UUID) -> float:
    """Promote through the lifecycle (which sends the NOTIFY); return when its transaction committed."""

    async def run() -> float:
        engine = make_async_engine(database_url)
        try:
            await lifecycle.promote(engine, version_id, actor="test")
            return time.monotonic()
        finally:
            await engine.dispose()

    return asyncio.run(run())


def served_model(client: openai.OpenAI) -> str:
    completion = client.chat.completions.create(model="agent", messages=[{"role": "user", "content": uuid.uuid4().hex}])
    return completion.model  # the fake upstream echoes the model it was asked for


def test_notify_switches_versions_long_before_the_poll(start_gateway, fake_upstream, database_url, db):
    policy = {"name": "agent", "base_model": "fake-base", "endpoints": [fake_upstream.api_base]}
    gateway = start_gateway(policies=[policy], adapter_poll_interval_s=600)
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    assert served_model(client) == "fake-base"

    # A status changed by hand sends no NOTIFY: with a 600 s poll the gateway does not see it.
    add_version(db, "agent", 1, "promoted")
    time.sleep(1.5)
    assert served_model(client) == "fake-base"

    v2 = add_version(db, "agent", 2, "candidate")
    committed = promote(database_url, v2)
    wait_for(lambda: served_model(client) == "agent-v2", timeout=5, interval=0.01, message="switch on NOTIFY")
    switch_s = time.monotonic() - committed
    assert switch_s < 1.0, f"the switch took {switch_s:.3f}s; only the NOTIFY can explain a switch this fast"


def test_the_listener_reconnects_after_the_database_drops(start_gateway, fake_upstream, database_url, db):
    proxy, via_proxy = proxied(database_url)
    try:
        policy = {"name": "agent", "base_model": "fake-base", "endpoints": [fake_upstream.api_base]}
        gateway = start_gateway(database_url=via_proxy, policies=[policy], adapter_poll_interval_s=600)
        client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
        assert served_model(client) == "fake-base"
        proxy.cut()
        listener = wait_for(
            lambda: (w := readiness(gateway).json()["checks"]["workers"][LISTENER])["failures"] and w,
            message="the listener sees the drop",
        )
        assert listener["last_error"]
        proxy.restore()
        # The poll failed during the outage too and retries after its back-off (a wake does not
        # cut a back-off short): once both are back, the switch is the NOTIFY's alone.
        wait_for(
            lambda: all(
                readiness(gateway).json()["checks"]["workers"][name]["consecutive_failures"] == 0
                for name in (LISTENER, POLL)
            ),
            message="the listener reconnected",
        )

        v1 = add_version(db, "agent", 1, "candidate")
        committed = promote(database_url, v1)
        wait_for(lambda: served_model(client) == "agent-v1", timeout=5, interval=0.01, message="switch on NOTIFY")
        assert time.monotonic() - committed < 1.0
    finally:
        proxy.close()
