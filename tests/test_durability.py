"""Nothing completed is lost: not on a database outage, a SIGTERM or a SIGKILL, and no call
is ever stored twice."""

from __future__ import annotations

import time

import httpx
from sqlalchemy.engine import make_url

from tests.conftest import wait_for
from tests.support.load import LoadRunner
from tests.support.tcp_proxy import CuttableProxy


def stored_ids(db) -> list[str]:
    return [row[0] for row in db.execute("SELECT id::text FROM calls").fetchall()]


def assert_exactly_once(db, completed: list[str], in_flight_allowance: int = 0) -> None:
    ids = stored_ids(db)
    assert len(ids) == len(set(ids)), "a call was stored twice"
    missing = set(completed) - set(ids)
    assert not missing, f"{len(missing)} completed calls were lost"
    # Calls journaled while the client was being answered (cut off by a kill) may be stored too.
    assert len(ids) - len(set(completed)) <= in_flight_allowance


def proxied(database_url: str) -> tuple[CuttableProxy, str]:
    url = make_url(database_url)
    proxy = CuttableProxy(url.host or "127.0.0.1", url.port or 5432).start()
    return proxy, url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)


def test_database_outage_under_load(start_gateway, database_url, db):
    proxy, via_proxy = proxied(database_url)
    try:
        gateway = start_gateway(database_url=via_proxy)
        load = LoadRunner(gateway.base_url, concurrency=8).start()
        load.wait_for_completed(100)
        proxy.cut()
        cut_at = time.monotonic()
        before_cut = len(load.completed)
        time.sleep(4)
        served_during_outage = sum(1 for t in load.completed_at if t > cut_at)
        readiness = httpx.get(gateway.url + "/readyz", timeout=10)
        backlog = readiness.json()["checks"]["journal"]["backlog_bytes"]
        proxy.restore()
        load.wait_for_completed(len(load.completed) + 100)
        load.stop()
        assert served_during_outage > 50, "the gateway kept serving while PostgreSQL was away"
        assert readiness.status_code == 503 and backlog > 0
        wait_for(lambda: len(stored_ids(db)) >= len(load.completed), timeout=60, message="backlog drained")
        assert_exactly_once(db, load.completed)
        assert load.failures == 0
        assert before_cut < len(load.completed)
        ready = wait_for(lambda: httpx.get(gateway.url + "/readyz").status_code == 200, message="ready again")
        assert ready
    finally:
        proxy.close()


def test_sigkill_under_load_loses_nothing(start_gateway, database_url, db, tmp_path):
    """Kill -9 while the journal holds a backlog (the database is cut); restart; all shipped."""
    proxy, via_proxy = proxied(database_url)
    data_dir = tmp_path / "kill-data"
    try:
        gateway = start_gateway(database_url=via_proxy, data_dir=data_dir)
        load = LoadRunner(gateway.base_url, concurrency=8).start()
        load.wait_for_completed(60)
        proxy.cut()
        load.wait_for_completed(len(load.completed) + 150)
        gateway.kill()
        load.stop()
        completed = list(load.completed)
        assert len(stored_ids(db)) < len(completed), "a backlog was waiting in the journal at the kill"
        proxy.restore()
        start_gateway(database_url=via_proxy, data_dir=data_dir)
        wait_for(lambda: len(stored_ids(db)) >= len(completed), timeout=60, message="journal shipped after restart")
        time.sleep(0.5)
        assert_exactly_once(db, completed, in_flight_allowance=8)
    finally:
        proxy.close()


def test_sigkill_with_shipping_running(start_gateway, db, tmp_path):
    """Kill -9 in the middle of normal operation: shipped and unshipped calls both survive once."""
    data_dir = tmp_path / "kill2"
    gateway = start_gateway(data_dir=data_dir)
    load = LoadRunner(gateway.base_url, concurrency=8).start()
    load.wait_for_completed(300)
    gateway.kill()
    load.stop()
    completed = list(load.completed)
    start_gateway(data_dir=data_dir)
    wait_for(lambda: len(stored_ids(db)) >= len(completed), timeout=60, message="all completed calls stored")
    time.sleep(0.5)
    assert_exactly_once(db, completed, in_flight_allowance=8)


def test_sigterm_ships_everything_before_exit(start_gateway, db):
    gateway = start_gateway(journal={"ship_interval_s": 2.0})
    load = LoadRunner(gateway.base_url, concurrency=4).start()
    load.wait_for_completed(200)
    load.stop()
    # uvicorn finishes its graceful shutdown, then re-raises SIGTERM so the exit status tells.
    assert gateway.stop() in (0, -15)
    assert "Application shutdown complete" in gateway.log_text()
    assert_exactly_once(db, load.completed)
    assert len(stored_ids(db)) == len(load.completed)
