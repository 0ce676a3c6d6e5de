"""A real gateway whose policy endpoints are a DNS name that changes (issue 17).

A real DNS server (dnslib, 127.0.0.1, an ephemeral port) answers for the name; fake
OpenAI-compatible upstreams listen on 127.0.0.2-127.0.0.5 at one port (every 127.0.0.0/8
address is loopback on Linux), as the pods of a headless service would. The gateway refreshes
every 0.3 s: after the records change its calls go to the new set and no longer to a removed
address; a DNS outage or an empty answer keeps the last set (calls keep working, the failure
is on /readyz and /metrics); a name that never resolved gets a 503 in OpenAI's format naming
the policy; a mixed list serves its fixed entry beside the name's addresses.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from apprentice.processes import ManagedProcess
from tests.conftest import wait_for
from tests.support.dns_server import dns_fixture, port_free_on  # noqa: F401 (the fixture `dns`)
from tests.support.processes import REPO_ROOT

NAME = "vllm.apprentice.test"
HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
REFRESH_S = 0.3


class HostUpstream(ManagedProcess):
    """The fake upstream (tests/support/fake_upstream.py) on one loopback address."""

    def __init__(self, workdir: Path, host: str, port: int) -> None:
        self.host, self.port = host, port
        super().__init__(
            f"fake upstream {host}",
            [sys.executable, "-m", "tests.support.fake_upstream", "--host", host, "--port", str(port)],
            workdir / f"fake-upstream-{host}-{port}.log",
            cwd=REPO_ROOT,
            ready_url=f"http://{host}:{port}/v1/models",
        )

    def received(self) -> int:
        return len(httpx.get(f"http://{self.host}:{self.port}/_requests", timeout=10).json()["requests"])

    def clear(self) -> None:
        httpx.delete(f"http://{self.host}:{self.port}/_requests", timeout=10)


@pytest.fixture
def upstreams(tmp_path: Path) -> Iterator[dict[str, HostUpstream]]:
    port = port_free_on(HOSTS)
    started = {host: HostUpstream(tmp_path, host, port) for host in HOSTS}
    for process in started.values():
        process.start()
    try:
        for process in started.values():
            process.wait_ready(30.0)
        yield started
    finally:
        for process in started.values():  # all at once: each takes a moment to stop
            process.terminate()
        for process in started.values():
            process.wait_stopped(time.monotonic() + 30)


def chat(gateway: Any, model: str, text: str = "hello") -> httpx.Response:
    body = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": text}]}
    return httpx.post(f"{gateway.base_url}/chat/completions", json=body, timeout=30)


def spread(gateway: Any, upstreams: dict[str, HostUpstream], model: str, calls: int = 8) -> dict[str, int]:
    """Send `calls` calls (each must succeed) and count what each upstream received."""
    for process in upstreams.values():
        process.clear()
    answers = [chat(gateway, model, f"task {i}") for i in range(calls)]
    assert [a.status_code for a in answers] == [200] * calls, [a.text[:300] for a in answers if a.status_code != 200]
    return {host: process.received() for host, process in upstreams.items() if process.received()}


def metric(gateway: Any, line_start: str) -> float:
    for line in httpx.get(f"{gateway.url}/metrics", timeout=10).text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def discovery_error(gateway: Any) -> str:
    return str(
        httpx.get(f"{gateway.url}/readyz", timeout=10).json()["checks"]["workers"]["endpoint-discovery"]["last_error"]
    )


def test_calls_follow_the_dns_name_as_its_records_change(upstreams, dns, start_gateway):
    port = next(iter(upstreams.values())).port
    dns.records.set(NAME, ["127.0.0.2", "127.0.0.3"])
    gateway = start_gateway(
        policies=[
            {"name": "dynamic", "base_model": "fake-base", "endpoints": [f"dns+http://{NAME}:{port}/v1"]},
            {"name": "lost", "base_model": "fake-base", "endpoints": [f"dns+http://missing.apprentice.test:{port}/v1"]},
            {
                "name": "mixed",
                "base_model": "fake-base",
                "endpoints": [f"http://127.0.0.5:{port}/v1", f"dns+http://mixed.apprentice.test:{port}/v1"],
            },
        ],
        endpoint_discovery={"nameservers": [dns.nameserver], "refresh_s": REFRESH_S, "timeout_s": 0.5},
    )

    # Resolved at start: the calls are balanced over the name's two addresses.
    assert spread(gateway, upstreams, "dynamic") == {"127.0.0.2": 4, "127.0.0.3": 4}

    # A pod goes, another comes: the calls go to the new set and never to the removed address.
    dns.records.set(NAME, ["127.0.0.3", "127.0.0.4"])
    wait_for(lambda: set(spread(gateway, upstreams, "dynamic", 4)) == {"127.0.0.3", "127.0.0.4"}, timeout=15)
    assert spread(gateway, upstreams, "dynamic") == {"127.0.0.3": 4, "127.0.0.4": 4}

    # A DNS outage: lookups fail, the last set keeps serving, and the failure is visible.
    failures = f'apprentice_endpoint_lookup_failures_total{{name="{NAME}"}}'
    before = metric(gateway, failures)
    dns.records.failing = True
    wait_for(lambda: metric(gateway, failures) >= before + 3, timeout=30)
    readyz = httpx.get(f"{gateway.url}/readyz")
    assert readyz.status_code == 200 and readyz.json()["status"] == "degraded"  # still serving: not unready
    assert "endpoint-discovery" in readyz.json()["failing_workers"]
    assert f"{NAME} (kept 2 known address(es)): A: SERVFAIL" in discovery_error(gateway)
    assert spread(gateway, upstreams, "dynamic") == {"127.0.0.3": 4, "127.0.0.4": 4}

    # No ready pod (NXDOMAIN) is no reason to drop every endpoint either.
    dns.records.failing = False
    dns.records.remove(NAME)
    time.sleep(REFRESH_S * 4)
    assert spread(gateway, upstreams, "dynamic") == {"127.0.0.3": 4, "127.0.0.4": 4}
    assert metric(gateway, 'apprentice_policy_endpoints{policy="dynamic"}') == 2

    # The name answers again: back to what it says, and the worker recovers.
    dns.records.set(NAME, ["127.0.0.2"])
    wait_for(lambda: set(spread(gateway, upstreams, "dynamic", 3)) == {"127.0.0.2"}, timeout=15)
    wait_for(lambda: NAME not in discovery_error(gateway), timeout=15)  # only the never-resolved names fail now

    # A name that never resolved: a 503 in OpenAI's format that names the policy.
    lost = chat(gateway, "lost")
    assert lost.status_code == 503, lost.text
    error = lost.json()["error"]
    assert error["code"] == "policy_endpoints_unresolved" and error["type"] == "service_unavailable"
    assert "`lost`" in error["message"] and "missing.apprentice.test" in error["message"]

    # A mixed list: its fixed entry serves alone until the name resolves, then beside it.
    assert spread(gateway, upstreams, "mixed", 4) == {"127.0.0.5": 4}
    dns.records.set("mixed.apprentice.test", ["127.0.0.4"])
    wait_for(lambda: set(spread(gateway, upstreams, "mixed", 4)) == {"127.0.0.4", "127.0.0.5"}, timeout=15)


def test_a_promoted_policy_behind_a_teacher_with_unresolved_names_gets_a_503(dns, fake_upstream, start_gateway, db):
    """Found by review: a policy with a teacher that is not its fallback, a promoted version and a
    DNS name that never resolved had no target at all; the handler read the first of none (a bare
    500, the call unrecorded). Its calls get the 503 that names the policy, and are recorded."""
    db.execute(
        "INSERT INTO adapter_versions (id, policy, version, name, status, base_model, path) "
        "VALUES (gen_random_uuid(), 'tutored', 1, 'tutored-v1', 'promoted', 'fake-base', '/nowhere')"
    )
    teacher = {
        "model_name": "teacher",
        "litellm_params": {"model": "openai/teacher-rule", "api_base": fake_upstream.api_base, "api_key": "sk-t"},
    }
    gateway = start_gateway(
        model_list=[teacher],
        policies=[
            {
                "name": "tutored",
                "base_model": "fake-base",
                "endpoints": ["dns+http://never.apprentice.test:8000/v1"],
                "teacher": {"model": "teacher", "fallback": False},
            }
        ],
        endpoint_discovery={"nameservers": [dns.nameserver], "refresh_s": REFRESH_S, "timeout_s": 0.5},
        adapter_poll_interval_s=0.1,
    )
    for stream in (False, True):
        body = {"model": "tutored", "stream": stream, "messages": [{"role": "user", "content": f"stream {stream}"}]}
        answer = httpx.post(f"{gateway.base_url}/chat/completions", json=body, timeout=30)
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert error["code"] == "policy_endpoints_unresolved" and "never.apprentice.test" in error["message"]
    wait_for(lambda: db.execute("SELECT count(*) FROM calls WHERE status_code = 503").fetchone()[0] == 2, timeout=20)
