"""How often a run's later call misses the version its run was assigned, in the deploy's shape.

Three gateway replicas of four processes each (deploy/: 3 x 4) in front of one inference
endpoint, a policy with a promoted version and a canary at share 0.5. Agents make runs of two
calls, the second continuing the first by content alone (the previous answer in its messages,
no trajectory or group id: the hardest case). How the calls reach the gateways:

- pinned: one keep-alive connection per agent to one replica (a client library's pool behind an
  L4 load balancer, Kubernetes' Service): the connection stays on one process;
- spread: every call to a random replica on a new connection (an L7 balancer that spreads each
  request): 11 of 12 continuations land on another process, where only the store lookup of
  gateway/trajectories/parents.py finds the run.

A miss is a run whose second call was served by another version than its first. Each shape runs
with the second call sent at once after the first answer and after 0.5 s (an agent's tool time).

    python -m bench.canary_stickiness            # writes docs/benchmarks.md
    python -m bench.canary_stickiness --runs 40 --no-write
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg

from apprentice.store.schema import upgrade
from bench.report import machine_line, markdown_table, write_section
from tests.support.fake_policy_endpoint import FakePolicyEndpoint
from tests.support.processes import GatewayProcess

SECTION_TITLE = "Canary stickiness: a run's calls across 3 replicas x 4 processes"
ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
REPLICAS, PROCESSES = 3, 4


def scratch_database() -> tuple[str, str]:
    name = f"apprentice_bench_sticky_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    url = ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    upgrade(url)
    return name, url


def drop_database(name: str) -> None:
    with psycopg.connect(ADMIN_URL, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def one_run(urls: list[str], pinned: httpx.AsyncClient | None, think_s: float, rng: random.Random) -> tuple:
    """Two calls of one run; returns (first version, second version, second call's latency)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {rng.randrange(4)}"}]
    served, latency = [], 0.0
    for turn in range(2):
        body = {"model": "agent", "messages": messages}
        started = time.perf_counter()
        if pinned is not None:
            response = await pinned.post("/chat/completions", json=body)
        else:
            async with httpx.AsyncClient(base_url=rng.choice(urls), timeout=120) as fresh:
                response = await fresh.post("/chat/completions", json=body)
        latency = time.perf_counter() - started
        response.raise_for_status()
        answer = response.json()
        served.append(answer["model"])
        messages += [answer["choices"][0]["message"], {"role": "user", "content": "go on"}]
        if turn == 0 and think_s:
            await asyncio.sleep(think_s)
    return served[0], served[1], latency


async def measure(urls: list[str], runs: int, spread: bool, think_s: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    semaphore = asyncio.Semaphore(8)
    clients = [httpx.AsyncClient(base_url=url, timeout=120) for url in urls]

    async def bounded(index: int) -> tuple:
        async with semaphore:
            pinned = None if spread else clients[index % len(clients)]
            return await one_run(urls, pinned, think_s, rng)

    results = await asyncio.gather(*(bounded(i) for i in range(runs)))
    for client in clients:
        await client.aclose()
    misses = sum(first != second for first, second, _ in results)
    latencies = sorted(latency * 1000 for _, _, latency in results)
    return {
        "misses": misses,
        "runs": runs,
        "canary": sum(first.endswith("-v2") for first, _, _ in results),
        "p50": statistics.median(latencies),
        "p99": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300, help="two-call runs per shape")
    parser.add_argument("--quick", action="store_true", help="1 replica x 2 processes, 10 runs a shape: a smoke run")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    replicas, processes = (1, 2) if args.quick else (REPLICAS, PROCESSES)
    runs = 10 if args.quick else args.runs
    name, url = scratch_database()
    work = Path(tempfile.mkdtemp(prefix="apprentice-sticky-"))
    gateways: list[GatewayProcess] = []
    rows = []
    try:
        with psycopg.connect(url, autocommit=True) as db:
            for number, status, share in ((1, "promoted", None), (2, "canary", 0.5)):
                db.execute(
                    "INSERT INTO adapter_versions (id, policy, version, name, status, base_model, path, canary_share)"
                    " VALUES (%s, 'agent', %s, %s, %s, 'base', '/nowhere', %s)",
                    (uuid.uuid4(), number, f"agent-v{number}", status, share),
                )
        with FakePolicyEndpoint("base", {}, {}) as endpoint:
            endpoint.loaded.update({"agent-v1", "agent-v2"})
            for replica in range(replicas):
                config = {
                    "database_url": url,
                    "data_dir": str(work / f"replica-{replica}"),
                    "auth": {"mode": "open"},
                    "adapter_poll_interval_s": 0.5,
                    "policies": [{"name": "agent", "base_model": "base", "endpoints": [endpoint.api_base]}],
                }
                gateway = GatewayProcess(work, config, workers=processes)
                gateway.start(timeout=600)
                gateways.append(gateway)
            urls = [g.base_url for g in gateways]
            for spread in (False, True):
                for think_s in (0.0, 0.5):
                    found = asyncio.run(measure(urls, runs, spread, think_s, seed=len(rows)))
                    rows.append(
                        [
                            "spread (new connection, random replica)" if spread else "pinned (keep-alive)",
                            f"{think_s:g} s",
                            found["runs"],
                            f"{found['canary'] / found['runs']:.0%}",
                            f"{found['misses']} ({found['misses'] / found['runs']:.1%})",
                            f"{found['p50']:.1f} / {found['p99']:.1f} ms",
                        ]
                    )
                    print(rows[-1], flush=True)
    finally:
        for gateway in gateways:
            gateway.stop()
        drop_database(name)
    body = (
        f"{machine_line()}\n\nCommand: `python -m bench.canary_stickiness {' '.join(sys.argv[1:])}`\n\n"
        f"{replicas} replicas x {processes} processes, a canary at share 0.5, runs of two calls continued by "
        "content alone (no ids). A miss: the second call served by another version than the first.\n\n"
        + markdown_table(
            [
                "how calls reach the gateways",
                "before the 2nd call",
                "runs",
                "canary arm",
                "misses",
                "2nd call p50 / p99",
            ],
            rows,
        )
        + "\n"
    )
    print(body)
    if not args.no_write:
        write_section(SECTION_TITLE, body)


if __name__ == "__main__":
    main()
