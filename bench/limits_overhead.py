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
import time
import urllib.request
import uuid
from typing import Any

from bench.gateway_overhead import endpoint
from bench.loadgen import LoadClient
from bench.report import machine_line, markdown_table
from bench.side_by_side import (
    added,
    arguments,
    interleaved_rounds,
    latency_cells,
    load_note,
    publish,
    side_by_side,
    sizes,
)
from bench.stats import median

SECTION_TITLE = "Limits overhead"
TARGETS = ("direct", "limits off", "limits on")
HIGH = {"requests_per_minute": 10**9, "tokens_per_minute": 10**12, "budget_usd": 10.0**9}


def limits_config() -> dict[str, Any]:
    return {"key": HIGH, "tenant_default": HIGH, "budget_window_s": 86400}


def gateway_config(upstream: str, limited: bool) -> dict[str, Any]:
    config: dict[str, Any] = {
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
    return await interleaved_rounds(clients, rounds, requests)


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
    rows = [[name, *latency_cells(results, name, None if name == "direct" else "direct")] for name in TARGETS]
    own_p50, own_p99 = added(results, "limits on", "limits off", 0), added(results, "limits on", "limits off", 1)
    off_p50 = median(r[0] for r in results["limits off"])
    table = markdown_table(["target", "p50 (ms)", "p99 (ms)", "added over direct, p50 / p99 (ms)"], rows)
    return (
        f"{machine_line()}\n\n"
        f"`python -m bench.limits_overhead`: the fake upstream and two gateways (one worker each, recording into "
        f"PostgreSQL), one without limits and one limiting requests, tokens and spend for every key and tenant "
        f"(limits too high to refuse anything: every call is checked, reserved and settled, and the counts are "
        f"exchanged with PostgreSQL every second; its answers carried `x-ratelimit-limit-requests: {header}`); "
        f"non-streamed chat completions, concurrency 1, {rounds} interleaved rounds of {requests} requests per "
        f"target; medians over rounds. {load_note(load)}.\n\n"
        f"{table}\n\n"
        f"- The limits add {own_p50:+.3f} ms at the median and {own_p99:+.3f} ms at p99 (limits on minus limits "
        f"off in the same round; the ratio of the medians is {(off_p50 + own_p50) / off_p50:.3f}).\n"
        f"- On the hot path, `Limiter.admit` + `Limiter.settle` (key and tenant scopes, requests, tokens and "
        f"spend) take {cost_us[0]:.2f} µs per call, measured in process (where 100 dict lookups took "
        f"{cost_us[1]:.2f} µs: about {cost_us[0] / cost_us[1] * 100:.0f} lookups' worth); no database round trip.\n"
    )


async def run(args: argparse.Namespace) -> str:
    load_start = os.getloadavg()[0]
    async with side_by_side("limits") as stack:
        for name, limited in (("limits off", False), ("limits on", True)):
            await stack.add_gateway(name, gateway_config(stack.upstream_url, limited))
        header = limited_headers(stack.urls["limits on"])
        if not header:
            raise RuntimeError("the limited gateway answered without x-ratelimit headers: limits are not on")
        rounds, requests = sizes(args)
        results = await measure(stack.urls, rounds, requests)
        cost = cpu_cost_us(5_000 if args.quick else 50_000)
        return render(results, rounds, requests, cost, (load_start, os.getloadavg()[0]), header)


def main() -> None:
    args = arguments(__doc__, 9, 300).parse_args()
    publish(args, SECTION_TITLE, asyncio.run(run(args)))


if __name__ == "__main__":
    main()
