"""The promotion job over endpoints given as a DNS name (issue 17).

A real DNS server (dnslib on 127.0.0.1) answers for the name, and real local inference servers
(the tiny model, real PEFT adapters) listen on 127.0.0.2 and 127.0.0.3 at one port, as two
pods of a headless service would. A promoted version is loaded where the name points; when a
replica appears in the records, the next tick loads the promoted adapter there; when one goes
from the records, the job stops calling it. A name that never resolved makes the job wait: a
candidate is not rejected for it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx

from apprentice.processes import ManagedProcess
from apprentice.promotion import actions
from apprentice.promotion.tick import promotion_tick
from apprentice.promotion.tick_report import TickReport
from apprentice.settings import Settings
from apprentice.store.engine import make_async_engine
from tests.support.dns_server import TestDnsServer, dns_fixture, port_free_on  # noqa: F401 (the fixture `dns`)
from tests.support.processes import ModelServerProcess
from tests.support.promotion import add_candidate, status_of

POLICY = "grown"
NAME = "tiny-headless.apprentice.test"
HOSTS = ["127.0.0.2", "127.0.0.3"]
REFRESH_S = 0.2


class HostModelServer(ModelServerProcess):
    """`apprentice serve-model` on the tiny model, bound to one loopback address."""

    def __init__(self, workdir: Path, model_dir: Path, host: str, port: int) -> None:
        super().__init__(
            workdir, model_dir, "tiny", "--threads", "1", "--default-max-tokens", "4", host=host, port=port
        )

    def adapters(self) -> set[str]:
        data = httpx.get(f"{self.api_base}/models", timeout=30).json()["data"]
        return {card["id"] for card in data if card["id"].startswith(f"{POLICY}-")}


def settings_for(database_url: str, dns: TestDnsServer, endpoint: str) -> Settings:
    return Settings(
        database_url=database_url,
        policies=[
            {
                "name": POLICY,
                "base_model": "tiny",
                "endpoints": [endpoint],
                "promotion": {"canary_share": 0.5, "min_samples": 6, "unload_grace_s": 300},
            }
        ],
        endpoint_discovery={"nameservers": [dns.nameserver], "refresh_s": REFRESH_S, "timeout_s": 1.0},
    )


def run(coroutine_factory: Any, database_url: str) -> Any:
    async def once() -> Any:
        engine = make_async_engine(database_url)
        try:
            return await coroutine_factory(engine)
        finally:
            await engine.dispose()

    return asyncio.run(once())


def tick(database_url: str, settings: Settings) -> TickReport:
    """One pass of the promotion job, as the learner's scheduler runs it, past the refresh period."""
    time.sleep(REFRESH_S * 1.5)
    return run(lambda engine: promotion_tick(engine, settings), database_url)


def test_a_name_that_never_resolved_makes_the_job_wait_not_reject(db, database_url, dns, tiny):
    settings = settings_for(database_url, dns, f"dns+http://{NAME}:8000/v1")
    v1 = add_candidate(db, POLICY, 1, tiny.adapters[1])
    report = tick(database_url, settings)
    assert status_of(db, v1) == "candidate"  # waits for an endpoint: the adapter is not at fault
    assert any(a["action"] == "load_failed" and "has not resolved" in a["detail"] for a in report.actions), report
    assert f"{POLICY}: endpoint dns+http://{NAME}:8000/v1 has not resolved to any address" in report.errors


def test_the_job_loads_the_promoted_adapter_where_the_name_points(db, database_url, dns, tiny, tmp_path):
    port = port_free_on(HOSTS)
    servers = {host: HostModelServer(tmp_path, tiny.base, host, port) for host in HOSTS}
    first, second = servers.values()
    for server in servers.values():  # both start in parallel; the second is named in the records later
        ManagedProcess.start(server)
    try:
        for server in servers.values():
            server.wait_ready(180)
        dns.records.set(NAME, [first.host])
        settings = settings_for(database_url, dns, f"dns+http://{NAME}:{port}/v1")

        v1 = add_candidate(db, POLICY, 1, tiny.adapters[1])
        result = run(lambda engine: actions.promote_now(engine, settings, v1, actor="test"), database_url)
        assert result.transition.changed and status_of(db, v1) == "promoted"
        assert [(e.endpoint, e.action) for e in result.endpoints] == [(first.api_base, "loaded")]
        assert first.adapters() == {f"{POLICY}-v1"} and second.adapters() == set()

        # A replica appears in the records: the next tick loads the promoted adapter there.
        dns.records.set(NAME, [first.host, second.host])
        report = tick(database_url, settings)
        assert not report.errors, report.errors
        assert {(a["version"], a["action"], a["detail"]) for a in report.actions if a["action"] == "reloaded"} == {
            (f"{POLICY}-v1", "reloaded", f"{second.api_base} had lost it")
        }
        assert second.adapters() == {f"{POLICY}-v1"}
        answer = httpx.post(
            f"{second.api_base}/chat/completions",
            json={"model": f"{POLICY}-v1", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
            timeout=60,
        )
        assert answer.status_code == 200 and answer.json()["model"] == f"{POLICY}-v1", answer.text

        # The first replica goes (killed, and gone from the records): the job no longer calls it.
        first.kill()
        dns.records.set(NAME, [second.host])
        report = tick(database_url, settings)
        assert not report.errors, report.errors

        # A DNS outage keeps the last set: the tick still reconciles the replica it knows.
        dns.records.failing = True
        report = tick(database_url, settings)
        assert not report.errors, report.errors
        assert second.adapters() == {f"{POLICY}-v1"}
    finally:
        for server in servers.values():
            server.stop()
