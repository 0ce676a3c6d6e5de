"""What per-key limits add to a call (docs/limits.md).

One fake upstream (`tests.support.fake_upstream`) and two gateways (one worker each, recording
into the same PostgreSQL): one without limits, one with requests, tokens and a budget limited
for every key and tenant (limits high enough that nothing is refused, so every call takes the
whole path: the check, the reservation, the settlement with the usage and the price, and the
exchange of the counts with PostgreSQL every second). Non-streamed chat completions at
concurrency 1, in interleaved rounds (direct, limits off, limits on), so that the noise of a
shared machine falls on each alike:

- the latency each gateway adds: its p50 (p99) minus the direct call's in the same round,
  median over rounds; the limits' own cost: limits-on minus limits-off in the same round;
- the hot-path part alone: `Limiter.admit` + `Limiter.settle` for one call, in process.

    python -m bench.limits_overhead             # about 1-2 minutes; writes docs/benchmarks.md
    python -m bench.limits_overhead --quick     # smoke run, writes nothing
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from apprentice.processes import ManagedProcess, free_port
from bench.gateway_overhead import REPO, apprentice_argv, drop_database, endpoint, log, recreate_database, wait_ready
from bench.loadgen import LoadClient
from bench.report import machine_line, markdown_table, write_section
from bench.stats import median, percentile

SECTION_TITLE = "Limits overhead"
HOST = "127.0.0.1"
ADMIN_URL = os.environ.get("APPRENTICE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
TARGETS = ("direct", "limits off", "limits on")
HIGH = {"requests_per_minute": 10**9, "tokens_per_minute": 10**12, "budget_usd": 10.0**9}


def limits_config() -> dict[str, Any]:
    return {"key": HIGH, "tenant_default": HIGH, "budget_window_s": 86400}


def gateway_config(upstream: str, data_dir: Path, database_url: str, limited: bool) -> dict[str, Any]:
    config: dict[str, Any] = {
        "database_url": database_url,
        "data_dir": str(data_dir),
        "auth": {"mode": "open"},
        "model_list": [
            {
                "model_name": "fake-model",
                "litellm_params": {"model": "openai/fake-model", "api_base": upstream},
                "model_info": {"input_cost_per_token": 1e-7, "output_cost_per_token": 4e-7},
            }
        ],
    }
    if limited:
        config["limits"] = limits_config()
    return config


def cpu_cost_us(samples: int = 50_000) -> tuple[float, float]:
    """`admit` + `settle` for one call of a key limited by itself and its tenant, in process; and,
    to read it on a busy machine, what 100 dict lookups take in the same process."""
    from apprentice.settings import LimitSettings
    from gateway.auth.keys import KeyInfo
    from gateway.limits.limiter import Limiter
    from gateway.limits.prices import Prices
    from gateway.upstreams.routing import UpstreamTarget

    limiter = Limiter(LimitSettings.model_validate(limits_config()), Prices([]))
    key = KeyInfo(uuid.uuid4(), "bench", "acme", "client", {"requests_per_minute": 10**9})
    target = UpstreamTarget("fake-model", True, "http://x", "gpt-4o-mini", None, 1.0, litellm_model="gpt-4o-mini")
    limiter.prices.load()
    for _ in range(1000):
        limiter.settle(limiter.admit(key, 30), target, 12, 20)
    runs = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(samples):
            limiter.settle(limiter.admit(key, 30), target, 12, 20)
        runs.append((time.perf_counter() - started) / samples * 1e6)
    table: dict[int, int] = {}
    started = time.perf_counter()
    for _ in range(samples // 10):
        for number in range(100):
            table.get(number)
    return median(runs), (time.perf_counter() - started) / (samples // 10) * 1e6


async def measure(urls: dict[str, str], rounds: int, requests: int) -> dict[str, list[tuple[float, float]]]:
    """Per target, its (p50, p99) in ms in each round, targets interleaved within a round."""
    clients = {name: LoadClient(endpoint(url, False), 1) for name, url in urls.items()}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in urls}
    try:
        for client in clients.values():  # warm-up: connections, caches, the journal's first segment
            await client.run(max(20, requests // 5))
        for number in range(rounds):
            for name in TARGETS:
                samples, _ = await clients[name].run(requests)
                bad = sum(1 for s in samples if not s.ok)
                if bad:
                    raise RuntimeError(f"{name}: {bad} of {len(samples)} requests failed")
                totals = [s.total * 1000.0 for s in samples]
                results[name].append((median(totals), percentile(totals, 0.99)))
            log(f"round {number + 1}/{rounds} done")
    finally:
        for client in clients.values():
            client.close()
    return results


def limited_headers(url: str) -> str:
    """The x-ratelimit headers of one call to the limited gateway: proof the limits were on."""
    request = urllib.request.Request(
        url + "/chat/completions",
        data=json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.headers.get("x-ratelimit-limit-requests") or ""


def render(
    results: dict[str, list[tuple[float, float]]],
    rounds: int,
    requests: int,
    cost_us: tuple[float, float],
    load: tuple[float, float],
    header: str,
) -> str:
    def added(name: str, base: str, index: int) -> float:
        return median(a[index] - b[index] for a, b in zip(results[name], results[base], strict=True))

    rows: list[list[object]] = []
    for name in TARGETS:
        p50 = median(r[0] for r in results[name])
        p99 = median(r[1] for r in results[name])
        over = (
            "(baseline)" if name == "direct" else f"{added(name, 'direct', 0):+.3f} / {added(name, 'direct', 1):+.3f}"
        )
        rows.append([name, f"{p50:.3f}", f"{p99:.3f}", over])
    own_p50, own_p99 = added("limits on", "limits off", 0), added("limits on", "limits off", 1)
    off_p50 = median(r[0] for r in results["limits off"])
    table = markdown_table(["target", "p50 (ms)", "p99 (ms)", "added over direct, p50 / p99 (ms)"], rows)
    busy = load[0] >= 1.5 or load[1] >= 1.5
    return (
        f"{machine_line()}\n\n"
        f"`python -m bench.limits_overhead`: the fake upstream and two gateways (one worker each, recording into "
        f"PostgreSQL), one without limits and one limiting requests, tokens and spend for every key and tenant "
        f"(limits too high to refuse anything: every call is checked, reserved and settled, and the counts are "
        f"exchanged with PostgreSQL every second; its answers carried `x-ratelimit-limit-requests: {header}`); "
        f"non-streamed chat completions, concurrency 1, {rounds} interleaved rounds of {requests} requests per "
        f"target; medians over rounds. Load average at start / end: {load[0]:.2f} / {load[1]:.2f}"
        f"{' (a busy shared machine: read the figures as rough)' if busy else ''}.\n\n"
        f"{table}\n\n"
        f"- The limits add {own_p50:+.3f} ms at the median and {own_p99:+.3f} ms at p99 (limits on minus limits "
        f"off in the same round; the ratio of the medians is {(off_p50 + own_p50) / off_p50:.3f}).\n"
        f"- On the hot path, `Limiter.admit` + `Limiter.settle` (key and tenant scopes, requests, tokens and "
        f"spend) take {cost_us[0]:.2f} µs per call, measured in process (where 100 dict lookups took "
        f"{cost_us[1]:.2f} µs: about {cost_us[0] / cost_us[1] * 100:.0f} lookups' worth); no database round trip.\n"
    )


async def run(args: argparse.Namespace) -> str:
    load_start = os.getloadavg()[0]
    workdir = Path(tempfile.mkdtemp(prefix="bench-limits-"))
    processes: list[ManagedProcess] = []

    def started(process: ManagedProcess, timeout: float = 30) -> ManagedProcess:
        process.start()
        processes.append(process)
        if process.ready_url:
            process.wait_ready(timeout)
        return process

    upstream_port = free_port()
    upstream_url = f"http://{HOST}:{upstream_port}/v1"
    database = "apprentice_bench_limits"
    database_url = recreate_database(ADMIN_URL, database)
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL" and not k.startswith("APPRENTICE_")}
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    try:
        started(
            ManagedProcess(
                "fake upstream",
                [sys.executable, "-m", "tests.support.fake_upstream", "--port", str(upstream_port)],
                workdir / "upstream.log",
                cwd=REPO,
                ready_url=f"{upstream_url}/models",
            )
        )
        urls = {"direct": upstream_url}
        for name, limited in (("limits off", False), ("limits on", True)):
            slug = name.replace(" ", "-")
            config = workdir / f"{slug}.yaml"
            config.write_text(json.dumps(gateway_config(upstream_url, workdir / slug, database_url, limited)))
            if len(urls) == 1:
                subprocess.run(
                    apprentice_argv() + ["db", "upgrade", "--config", str(config)],
                    check=True,
                    cwd=REPO,
                    env=env,
                    timeout=300,
                )
            port = free_port()
            gateway = ManagedProcess(
                name,
                apprentice_argv() + ["gateway", "--config", str(config), "--host", HOST, "--port", str(port)],
                workdir / f"{slug}.log",
                cwd=REPO,
            )
            gateway.env = env
            started(gateway)
            urls[name] = f"http://{HOST}:{port}/v1"
            await wait_ready(urls[name], None, 120)
        header = limited_headers(urls["limits on"])
        if not header:
            raise RuntimeError("the limited gateway answered without x-ratelimit headers: limits are not on")
        rounds, requests = (2, 30) if args.quick else (args.rounds, args.requests)
        results = await measure(urls, rounds, requests)
        cost = cpu_cost_us(5_000 if args.quick else 50_000)
        return render(results, rounds, requests, cost, (load_start, os.getloadavg()[0]), header)
    finally:
        for process in reversed(processes):
            process.stop()
        drop_database(ADMIN_URL, database)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--quick", action="store_true", help="a smoke run; writes nothing")
    args = parser.parse_args()
    report = asyncio.run(run(args))
    print(report)
    if not args.quick:
        write_section(SECTION_TITLE, report)


if __name__ == "__main__":
    main()
