"""PostgreSQL restarts during a promotion transition (issue 15).

A transition loads the adapter at the endpoints while it holds the policy's lock, then commits.
Here the database goes away (a TCP proxy in front of the shared server drops every connection
and refuses new ones, as a restart does) after the load and before the commit: the transition
must leave the previous state whole, the job must say what happened, and the next attempt,
with the database back, must complete it exactly once. The inference endpoint is scripted
(tests/test_promotion_units.FakeVLLM); the database is real.
"""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy.engine import make_url

from apprentice.promotion import actions, tick
from apprentice.store.engine import make_async_engine
from tests.support.tcp_proxy import CuttableProxy
from tests.test_promotion_lifecycle import ENDPOINT, adapter_path, add_run, add_version, settings_for, status_of
from tests.test_promotion_units import FakeVLLM, client_for


class CutOnLoad(FakeVLLM):
    """An endpoint that, once armed, drops the database right after it answers the request `on`."""

    def __init__(self, proxy: CuttableProxy, on: str) -> None:
        super().__init__()
        self.proxy, self.on, self.armed = proxy, on, False

    def __call__(self, request: httpx.Request) -> httpx.Response:
        response = super().__call__(request)
        if self.armed and request.url.path.endswith(self.on):
            self.armed = False
            self.proxy.cut()
        return response


@pytest.fixture
def proxy(database_url):
    url = make_url(database_url)
    proxy = CuttableProxy(url.host or "127.0.0.1", url.port or 5432).start()
    yield proxy, url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    proxy.close()


def transitions(db) -> list[tuple[str, str]]:
    return db.execute(
        "SELECT v.name, t.to_status FROM adapter_transitions t JOIN adapter_versions v "
        "ON v.id = t.adapter_version_id ORDER BY t.id"
    ).fetchall()


async def test_a_canary_start_cut_by_a_restart_leaves_the_candidate_and_the_next_tick_completes_it(db, proxy):
    proxy, via_proxy = proxy
    v1 = add_version(db, 1, status="promoted", run=add_run(db))
    v2 = add_version(db, 2, run=add_run(db))
    fake = CutOnLoad(proxy, "/load_lora_adapter")
    fake.loaded["agent-v1"] = adapter_path(1)
    settings = settings_for(via_proxy)
    engine = make_async_engine(via_proxy)
    try:
        async with client_for({ENDPOINT: fake}) as client:
            fake.armed = True
            report = await tick.promotion_tick(engine, settings, client=client)
            # The previous state, whole: v2 a candidate, no transition; and the job says why.
            assert (status_of(db, v1), status_of(db, v2)) == ("promoted", "candidate")
            assert transitions(db) == []
            error = report.errors[0]  # then the steps after it, which find the database away
            assert error.startswith("agent: agent-v2 -> canary not committed (database: "), report.errors
            assert "server closed the connection" in error, error
            assert error.endswith("agent-v2 stays candidate, the next tick retries"), error
            assert all(e.startswith("agent: ") for e in report.errors[1:]), report.errors
            assert "agent-v2" in fake.loaded  # loaded before the cut: harmless, the reconciler owns it

            proxy.restore()
            report = await tick.promotion_tick(engine, settings, client=client)
            assert not report.errors, report.errors
            assert ("agent-v2", "canary") in {(a["version"], a["action"]) for a in report.actions}
            assert (status_of(db, v1), status_of(db, v2)) == ("promoted", "canary")
            assert transitions(db) == [("agent-v2", "canary")]
    finally:
        await engine.dispose()


async def test_a_promotion_cut_by_a_restart_leaves_both_versions_serving_as_they_were(db, proxy):
    proxy, via_proxy = proxy
    v1 = add_version(db, 1, status="promoted", run=add_run(db))
    v2 = add_version(db, 2, status="canary", run=add_run(db))
    db.execute("UPDATE adapter_versions SET canary_share = 0.3 WHERE id = %s", (v2,))
    fake = CutOnLoad(proxy, "/models")  # the canary is loaded already: the promotion only verifies it
    fake.loaded.update({"agent-v1": adapter_path(1), "agent-v2": adapter_path(2)})
    settings = settings_for(via_proxy)
    engine = make_async_engine(via_proxy)
    try:
        async with client_for({ENDPOINT: fake}) as client:
            fake.armed = True
            with pytest.raises(Exception) as cut:
                await actions.promote_now(engine, settings, "agent-v2", actor="admin", client=client)
            assert "connection" in str(cut.value).lower() or "server closed" in str(cut.value).lower(), cut.value
            assert (status_of(db, v1), status_of(db, v2)) == ("promoted", "canary")
            assert transitions(db) == []
            assert db.execute("SELECT canary_share FROM adapter_versions WHERE id = %s", (v2,)).fetchone()[0] == 0.3

            proxy.restore()
            done = await actions.promote_now(engine, settings, "agent-v2", actor="admin", client=client)
            assert done.transition.changed
            assert (status_of(db, v1), status_of(db, v2)) == ("retired", "promoted")
            assert transitions(db) == [("agent-v1", "retired"), ("agent-v2", "promoted")]
            again = await actions.promote_now(engine, settings, "agent-v2", actor="admin", client=client)
            assert not again.transition.changed
    finally:
        await engine.dispose()
