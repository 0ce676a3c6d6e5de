"""An inference endpoint dies while a canary serves (issue 15).

Two local inference servers (the tiny model, real PEFT adapters) behind one policy, a gateway
and PostgreSQL; the test process runs the promotion job. One server is SIGKILLed while calls
run: they fail over to the other. When no endpoint holds the version a call is routed to, the
call fails with a 503 that names that version, and it is recorded without a version (none
answered it). When the server is back (empty, as after a restart), the promotion job loads the
serving adapters into it again.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import httpx

from tests.conftest import wait_for
from tests.support.promotion import AUTH, LocalServerProcess, add_candidate, admin, start_gateways, status_of, tick

POLICY = "failover"


def call(gateway: Any, task: str, stream: bool = False) -> httpx.Response:
    body = {"model": POLICY, "max_tokens": 3, "stream": stream, "messages": [{"role": "user", "content": task}]}
    return httpx.post(f"{gateway.base_url}/chat/completions", headers=AUTH, json=body, timeout=120)


def served_by(response: httpx.Response) -> str:
    if response.headers["content-type"].startswith("text/event-stream"):
        first = next(line for line in response.text.splitlines() if line.startswith("data: {"))
        return httpx.Response(200, content=first[6:]).json()["model"]
    return response.json()["model"]


def calls(gateway: Any, count: int) -> list[httpx.Response]:
    return [call(gateway, f"task {uuid.uuid4().hex[:10]}", stream=i % 3 == 0) for i in range(count)]


def adapters_at(server: LocalServerProcess) -> set[str]:
    return {name for name in server.models() if name.startswith(f"{POLICY}-")}


def test_an_endpoint_dies_while_a_canary_serves(start_gateway, tiny, db, database_url, tmp_path):
    servers = [LocalServerProcess(tmp_path / f"server-{i}", tiny.base) for i in range(2)]
    for i, server in enumerate(servers):
        (tmp_path / f"server-{i}").mkdir()
        server.start()
    try:
        policy = {
            "name": POLICY,
            "base_model": "tiny",
            "endpoints": [server.api_base for server in servers],
            "temperature": 1.0,
            "promotion": {"canary_share": 0.5, "min_samples": 50, "unload_grace_s": 300},
        }
        gateway = start_gateways(start_gateway, tmp_path, policy, count=1)[0]
        add_candidate(db, POLICY, 1, tiny.adapters[1])
        assert admin(gateway, "POST", f"/versions/{POLICY}-v1/promote").status_code == 200
        v2 = add_candidate(db, POLICY, 2, tiny.adapters[2])
        tick(database_url, policy)
        assert status_of(db, v2) == "canary"
        assert [adapters_at(s) for s in servers] == [{f"{POLICY}-v1", f"{POLICY}-v2"}] * 2
        wait_for(lambda: served_by(call(gateway, "warm")) in {f"{POLICY}-v1", f"{POLICY}-v2"}, timeout=10)

        # One endpoint dies: every call is answered by the other, canary and promoted alike.
        servers[0].kill()
        answers = calls(gateway, 16)
        assert [a.status_code for a in answers] == [200] * 16, [a.text[:200] for a in answers if a.status_code != 200]
        shares = Counter(served_by(a) for a in answers)
        assert set(shares) == {f"{POLICY}-v1", f"{POLICY}-v2"}, shares

        # The promotion job meanwhile: the dead endpoint is an error naming it; nothing changes state.
        errors = _tick_allowing_errors(database_url, policy)
        assert any(servers[0].api_base in error and "did not list its models" in error for error in errors), errors
        assert status_of(db, v2) == "canary"

        # The live endpoint loses the canary too: no endpoint holds it. Its calls fail with a 503
        # that names the version; the promoted version's calls still succeed.
        unloaded = httpx.post(f"{servers[1].api_base}/unload_lora_adapter", json={"lora_name": f"{POLICY}-v2"})
        assert unloaded.status_code == 200
        answers = calls(gateway, 16)
        failed = [a for a in answers if a.status_code != 200]
        assert failed and all(a.status_code == 503 for a in failed), [a.status_code for a in answers]
        for answer in failed:
            error = answer.json()["error"]
            assert error["code"] == "adapter_version_unavailable" and f"{POLICY}-v2" in error["message"], error
            # which endpoints failed, and how, is for the operator's log: no internal address
            assert servers[0].api_base.split("//")[1].split("/")[0] not in error["message"], error
        assert {served_by(a) for a in answers if a.status_code == 200} == {f"{POLICY}-v1"}
        failed_ids = [a.headers["x-apprentice-call-id"] for a in failed]
        ok = {a.headers["x-apprentice-call-id"]: served_by(a) for a in answers if a.status_code == 200}

        # Recorded as it happened: the failures without a version, each success with the one that answered.
        names = dict(db.execute("SELECT id::text, name FROM adapter_versions").fetchall())
        rows = wait_for(
            lambda: (
                (
                    found := db.execute(
                        "SELECT id::text, adapter_version_id::text, status_code, upstream_model, error::text "
                        "FROM calls WHERE id = ANY(%s::uuid[])",
                        (failed_ids + list(ok),),
                    ).fetchall()
                )
                and len(found) == len(failed_ids) + len(ok)
                and found
            ),
            timeout=30,
            message="calls recorded",
        )
        for call_id, version_id, status, upstream_model, error_text in rows:
            if call_id in ok:
                assert status == 200 and names[version_id] == upstream_model == ok[call_id]
            else:
                assert status == 503 and version_id is None and f"{POLICY}-v2" in error_text

        # The endpoint comes back empty (a restart): the promotion job loads what serves into it again.
        servers[0].start()
        assert adapters_at(servers[0]) == set()
        report_actions = tick(database_url, policy).actions
        reloaded = {(a["version"], a["detail"].split(" ")[0]) for a in report_actions if a["action"] == "reloaded"}
        assert reloaded == {
            (f"{POLICY}-v1", servers[0].api_base),
            (f"{POLICY}-v2", servers[0].api_base),
            (f"{POLICY}-v2", servers[1].api_base),
        }
        assert [adapters_at(s) for s in servers] == [{f"{POLICY}-v1", f"{POLICY}-v2"}] * 2
        answers = calls(gateway, 12)
        assert [a.status_code for a in answers] == [200] * 12
    finally:
        for server in servers:
            server.stop()


def _tick_allowing_errors(database_url: str, policy: dict[str, Any]) -> list[str]:
    """One promotion tick whose errors are expected: returns them."""
    import asyncio

    from apprentice.promotion.tick import promotion_tick
    from apprentice.settings import Settings
    from apprentice.store.engine import make_async_engine

    async def once() -> list[str]:
        engine = make_async_engine(database_url)
        try:
            report = await promotion_tick(engine, Settings(database_url=database_url, policies=[policy]))
            return report.errors
        finally:
            await engine.dispose()

    return asyncio.run(once())
