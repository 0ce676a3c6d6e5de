"""Reward ingest: how fast POST /v1/rewards stores rewards, and how fast pending ones link.

Starts the fake upstream and one gateway process (auth "open") on a scratch database of the
local PostgreSQL (created and dropped here), records some trajectories, then measures in
rounds and quotes medians over rounds:

- single rewards, one per request, at concurrency 32: rewards/s and request latency p50/p99;
- batches of 100 at concurrency 4: rewards/s;
- replays (every request a duplicate of an idempotency key already stored): requests/s;
- signed webhooks (HMAC header instead of a key), single rewards at concurrency 32;
- pending rewards: rewards posted (batches) for trajectories that do not exist yet, then the
  trajectories are recorded: the time until every reward is linked.

    python -m bench.reward_ingest           # about a minute; writes docs/benchmarks.md
    python -m bench.reward_ingest --quick   # smoke run, writes nothing

Run from the repository root: the gateway and the fake upstream are started by the tests' helpers.

$APPRENTICE_BENCH_PG_URL selects the server (default postgresql://postgres@127.0.0.1:5432/postgres).
Only loopback addresses are used; every loop is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import orjson
import psycopg

from apprentice.store.schema import upgrade
from bench.report import machine_line, markdown_table, write_section
from bench.stats import percentile
from gateway.rewards.signatures import sign
from tests.conftest import gateway_config
from tests.support.processes import FakeUpstreamProcess, GatewayProcess

SECTION_TITLE = "Reward ingest"
SECRET = "whsec_bench"
ADMIN_URL = os.environ.get("APPRENTICE_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def database(name: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(ADMIN_URL).set(database=name).render_as_string(hide_password=False)


async def post_all(base_url: str, bodies: list[bytes], concurrency: int, signed: bool = False) -> dict[str, float]:
    latencies: list[float] = []
    semaphore = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    failures = 0
    transport_errors: list[int] = []
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=60) as client:

        async def one(body: bytes) -> None:
            nonlocal failures
            headers = {"Content-Type": "application/json"}
            if signed:
                headers["Apprentice-Signature"] = sign(SECRET, body)
            async with semaphore:
                started = time.perf_counter()
                for attempt in range(3):  # a keep-alive connection closed under us: count it, resend
                    try:
                        response = await client.post("/rewards", content=body, headers=headers)
                        break
                    except httpx.TransportError:
                        transport_errors.append(attempt)
                        if signed:  # the same signature would be a replay
                            headers["Apprentice-Signature"] = sign(SECRET, body, int(time.time()) + attempt + 1)
                else:
                    raise RuntimeError("three transport errors in a row")
                latencies.append(time.perf_counter() - started)
            failures += response.status_code != 200 and not (signed and response.status_code == 409)

        started = time.perf_counter()
        await asyncio.gather(*(one(body) for body in bodies))
        elapsed = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{failures} of {len(bodies)} requests failed")
    if transport_errors:
        print(f"  ({len(transport_errors)} transport errors, resent)", flush=True)
    return {
        "elapsed": elapsed,
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
    }


def record_trajectories(base_url: str, names: list[str]) -> list[str]:
    ids = []
    with httpx.Client(base_url=base_url, timeout=30) as client:
        for name in names:
            response = client.post(
                "/chat/completions",
                headers={"X-Trajectory-Id": name},
                json={"model": "fake-model", "messages": [{"role": "user", "content": name}]},
            )
            response.raise_for_status()
            ids.append(response.headers["x-trajectory-id"])
    return ids


def count(url: str, query: str) -> int:
    with psycopg.connect(url) as connection:
        return connection.execute(query).fetchone()[0]


def wait_until(predicate, timeout: float) -> float:
    started = time.perf_counter()
    while not predicate():
        if time.perf_counter() - started > timeout:
            raise TimeoutError("timed out")
        time.sleep(0.02)
    return time.perf_counter() - started


def run_round(
    gateway: GatewayProcess, url: str, trajectories: list[str], sizes: dict[str, int], round_index: int
) -> dict[str, float]:
    tag = f"r{round_index}-{uuid.uuid4().hex[:6]}"
    results: dict[str, float] = {}
    n = sizes["single"]
    singles = [
        orjson.dumps(
            {
                "trajectory_id": trajectories[i % len(trajectories)],
                "reward": (i % 10) / 10,
                "idempotency_key": f"{tag}-s{i}",
            }
        )
        for i in range(n)
    ]
    single = asyncio.run(post_all(gateway.base_url, singles, 32))
    results.update(single_per_s=n / single["elapsed"], single_p50_ms=single["p50_ms"], single_p99_ms=single["p99_ms"])

    replay = asyncio.run(post_all(gateway.base_url, singles, 32))
    results.update(replay_per_s=n / replay["elapsed"], replay_p50_ms=replay["p50_ms"])

    signed_bodies = [
        orjson.dumps(
            {
                "trajectory_id": trajectories[i % len(trajectories)],
                "reward": 0.5,
                "name": "signed",
                "idempotency_key": f"{tag}-w{i}",
            }
        )
        for i in range(n)
    ]
    signed = asyncio.run(post_all(gateway.base_url, signed_bodies, 32, signed=True))
    results.update(signed_per_s=n / signed["elapsed"], signed_p50_ms=signed["p50_ms"])

    batch_size, batches = 100, sizes["batches"]
    bodies = [
        orjson.dumps(
            {
                "rewards": [
                    {
                        "trajectory_id": trajectories[(b * batch_size + i) % len(trajectories)],
                        "reward": 0.1,
                        "name": f"m{i % 5}",
                        "metrics": {"steps": i},
                    }
                    for i in range(batch_size)
                ]
            }
        )
        for b in range(batches)
    ]
    batch = asyncio.run(post_all(gateway.base_url, bodies, 4))
    results.update(batch_per_s=batch_size * batches / batch["elapsed"], batch_p50_ms=batch["p50_ms"])

    pending_n = sizes["pending"]
    names = [f"{tag}-late-{i}" for i in range(sizes["late_trajectories"])]
    pending_bodies = [
        orjson.dumps(
            {
                "rewards": [
                    {
                        "client_trajectory_id": names[(b * 100 + i) % len(names)],
                        "reward": 1.0,
                        "name": f"p{(b * 100 + i) // len(names)}",
                    }
                    for i in range(100)
                ]
            }
        )
        for b in range(pending_n // 100)
    ]
    asyncio.run(post_all(gateway.base_url, pending_bodies, 4))
    record_trajectories(gateway.base_url, names)
    recorded_at = time.perf_counter()
    expected_trajectories = len(trajectories) + len(names) * (round_index + 1)
    wait_until(lambda: count(url, "SELECT count(*) FROM trajectories") >= expected_trajectories, 60)
    stored = time.perf_counter() - recorded_at
    linked = wait_until(lambda: count(url, "SELECT count(*) FROM rewards WHERE status = 'pending'") == 0, 120)
    results.update(link_s=stored + linked, link_per_s=pending_n / max(stored + linked, 1e-9))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, one round, writes nothing")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sizes = (
        {"single": 300, "batches": 20, "pending": 1000, "late_trajectories": 20, "trajectories": 50}
        if args.quick
        else {"single": 2000, "batches": 100, "pending": 5000, "late_trajectories": 100, "trajectories": 200}
    )
    rounds = 1 if args.quick else args.rounds

    name = f"apprentice_bench_rewards_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    url = database(name)
    workdir = Path(tempfile.mkdtemp(prefix="reward-bench-"))
    upstream = FakeUpstreamProcess(workdir)
    gateway = None
    try:
        upgrade(url)
        upstream.start()
        config = gateway_config(
            url,
            workdir / "data",
            upstream.api_base,
            rewards={"webhook_secrets": [{"secret": SECRET, "tenant": "local"}], "max_batch": 1000},
            journal={"ship_interval_s": 0.05},
            log_level="warning",
        )
        gateway = GatewayProcess(workdir, config)
        gateway.start()
        trajectories = record_trajectories(gateway.base_url, [f"bench-{i}" for i in range(sizes["trajectories"])])
        wait_until(lambda: count(url, "SELECT count(*) FROM trajectories") >= len(trajectories), 60)
        all_rounds = []
        for index in range(rounds):
            result = run_round(gateway, url, trajectories, sizes, index)
            print(f"round {index + 1}/{rounds}: " + ", ".join(f"{k}={v:.1f}" for k, v in result.items()), flush=True)
            all_rounds.append(result)
    finally:
        if gateway is not None:
            gateway.stop()
        upstream.stop()
        with psycopg.connect(ADMIN_URL, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    median = {key: statistics.median(r[key] for r in all_rounds) for key in all_rounds[0]}
    rows = [
        [
            "single rewards, c=32",
            f"{median['single_per_s']:.0f} rewards/s",
            f"p50 {median['single_p50_ms']:.1f} ms, p99 {median['single_p99_ms']:.1f} ms",
        ],
        [
            "replays of stored idempotency keys, c=32",
            f"{median['replay_per_s']:.0f} requests/s",
            f"p50 {median['replay_p50_ms']:.1f} ms",
        ],
        [
            "signed webhooks (HMAC + replay row), c=32",
            f"{median['signed_per_s']:.0f} rewards/s",
            f"p50 {median['signed_p50_ms']:.1f} ms",
        ],
        [
            "batches of 100, c=4",
            f"{median['batch_per_s']:.0f} rewards/s",
            f"p50 {median['batch_p50_ms']:.1f} ms a batch",
        ],
        [
            f"{sizes['pending']} pending rewards linked when {sizes['late_trajectories']} trajectories land",
            f"{median['link_per_s']:.0f} rewards/s",
            f"{median['link_s']:.2f} s from the last call to all linked",
        ],
    ]
    body = "\n\n".join(
        [
            "`python -m bench.reward_ingest` (one gateway process, auth open, local PostgreSQL; "
            f"median of {rounds} rounds, {sizes['single']} single rewards a phase).",
            markdown_table(["phase", "throughput", "latency"], rows),
            "Single rewards are bound by the gateway's Python per request (one process); a batch is one "
            "transaction of a fixed number of statements whatever its size, so batching is the way to load "
            "history in bulk. Linking includes the time the shipper takes to store the late calls.",
            machine_line(),
        ]
    )
    print(body)
    if not args.quick:
        write_section(SECTION_TITLE, body)


if __name__ == "__main__":
    main()
