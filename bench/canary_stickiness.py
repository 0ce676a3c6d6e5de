"""How often a run's later call misses the version its run was assigned, in the deploy's shape.

Three gateway replicas of four processes each (deploy/: 3 x 4) in front of one inference
endpoint, a policy with a promoted version and a canary at share 0.5. Agents make runs of two
calls, the second continuing the first by content alone (the previous answer in its messages,
no trajectory or group id: the hardest case). How the calls reach the gateways:

- pinned: each agent's own client, one keep-alive connection to one replica (a client library's
  pool behind an L4 load balancer, Kubernetes' Service): the connection stays on one process;
- spread: every call to a random replica on a new connection (an L7 balancer that spreads each
  request): 11 of 12 continuations land on another process, where only the store lookup of
  gateway/trajectories/parents.py finds the run.

Four prompts repeat. Each shape runs twice: with answers that differ from run to run, as sampled
text does ("correct #17"), and with answers that repeat ("correct"), where two runs of one prompt
are the same conversation and content alone cannot say which of them a second call continues.

Two figures per row:

- client misses: runs whose second call another version served than the first (what the agent
  saw). Where answers repeat, the gateway may join the second call to another run with the same
  content, which the client counts as a miss although every recorded run stays on one version;
- recorded mixed runs: runs as stored (after the shipper's stitching) whose calls two versions
  served: what the canary's arms and the learner see.

Each shape runs with the second call sent at once after the first answer and after 0.5 s (an
agent's tool time).

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

from bench.harness import scratch_database
from bench.report import machine_line, markdown_table, write_section
from tests.support.fake_policy_endpoint import FakePolicyEndpoint
from tests.support.processes import GatewayProcess

SECTION_TITLE = "Canary stickiness: a run's calls across 3 replicas x 4 processes"
REPLICAS, PROCESSES = 3, 4


async def one_run(
    clients: list[httpx.AsyncClient], pinned: httpx.AsyncClient | None, think_s: float, rng: random.Random
) -> tuple:
    """Two calls of one run; returns (first version, second version, second call's latency).

    Spread calls go to a random replica on a connection of their own (`Connection: close`), from
    clients made beforehand: a client made per call would time its own set-up (an SSL context,
    tens of milliseconds of CPU), not the gateway."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {rng.randrange(4)}"}]
    served, latency = [], 0.0
    for turn in range(2):
        body = {"model": "agent", "messages": messages}
        started = time.perf_counter()
        if pinned is not None:
            response = await pinned.post("/chat/completions", json=body)
        else:
            response = await rng.choice(clients).post("/chat/completions", json=body, headers={"Connection": "close"})
        latency = time.perf_counter() - started
        response.raise_for_status()
        answer = response.json()
        served.append(answer["model"])
        messages += [answer["choices"][0]["message"], {"role": "user", "content": "go on"}]
        if turn == 0 and think_s:
            await asyncio.sleep(think_s)
    return served[0], served[1], latency


_MIXED_RUNS = """
SELECT count(*) FROM (
    SELECT coalesce(t.merged_into, c.trajectory_id), count(DISTINCT c.adapter_version_id) AS versions
    FROM calls c JOIN trajectories t ON t.id = c.trajectory_id
    WHERE c.created_at >= %s
    GROUP BY 1
) AS runs WHERE versions > 1
"""


_SETTLED = """
SELECT count(*), count(*) FILTER (WHERE stitch_pending) FROM calls WHERE created_at >= %s
"""


async def recorded_mixed_runs(database_url: str, since: Any, calls: int, timeout_s: float = 30.0) -> int:
    """Runs stored since `since` whose calls two versions served, once the shipper has stored all
    `calls` and stitched every call that waited for its parent."""
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(database_url, autocommit=True) as db:
        while True:
            stored, pending = db.execute(_SETTLED, (since,)).fetchone()
            if (stored >= calls and pending == 0) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        row = db.execute(_MIXED_RUNS, (since,)).fetchone()
    return int(row[0]) if row else 0


async def measure(
    urls: list[str], database_url: str, runs: int, spread: bool, think_s: float, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    with psycopg.connect(database_url) as db:
        since = db.execute("SELECT now()").fetchone()[0]
    semaphore = asyncio.Semaphore(8)
    clients = [httpx.AsyncClient(base_url=url, timeout=120) for url in urls]

    async def bounded(index: int) -> tuple:
        if spread:
            async with semaphore:
                return await one_run(clients, None, think_s, rng)
        # The agent's own client: its one keep-alive connection stays on one process of its replica.
        async with httpx.AsyncClient(base_url=urls[index % len(urls)], timeout=120) as own:
            async with semaphore:
                return await one_run(clients, own, think_s, rng)

    results = await asyncio.gather(*(bounded(i) for i in range(runs)))
    for client in clients:
        await client.aclose()
    misses = sum(first != second for first, second, _ in results)
    latencies = sorted(latency * 1000 for _, _, latency in results)
    return {
        "misses": misses,
        "mixed": await recorded_mixed_runs(database_url, since, 2 * runs),
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
    with scratch_database("apprentice_bench_sticky") as url:
        work = Path(tempfile.mkdtemp(prefix="apprentice-sticky-"))
        gateways: list[GatewayProcess] = []
        rows = []
        try:
            with psycopg.connect(url, autocommit=True) as db:
                for number, status, share in ((1, "promoted", None), (2, "canary", 0.5)):
                    db.execute(
                        "INSERT INTO adapter_versions (id, policy, version, name, status, base_model, path, "
                        "canary_share) VALUES (%s, 'agent', %s, %s, %s, 'base', '/nowhere', %s)",
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
                for distinct in (True, False):
                    endpoint.distinct_answers = distinct
                    for spread in (False, True):
                        for think_s in (0.0, 0.5):
                            found = asyncio.run(measure(urls, url, runs, spread, think_s, seed=len(rows)))
                            rows.append(
                                [
                                    "differ" if distinct else "repeat",
                                    "spread (new connection, random replica)" if spread else "pinned (keep-alive)",
                                    f"{think_s:g} s",
                                    found["runs"],
                                    f"{found['canary'] / found['runs']:.0%}",
                                    f"{found['misses']} ({found['misses'] / found['runs']:.1%})",
                                    f"{found['mixed']} ({found['mixed'] / found['runs']:.1%})",
                                    f"{found['p50']:.1f} / {found['p99']:.1f} ms",
                                ]
                            )
                            print(rows[-1], flush=True)
        finally:
            for gateway in gateways:
                gateway.stop()
    body = (
        f"{machine_line()}\n\nCommand: `python -m bench.canary_stickiness {' '.join(sys.argv[1:])}`\n\n"
        f"{replicas} replicas x {processes} processes, a canary at share 0.5, runs of two calls continued by "
        "content alone (no ids), four prompts that repeat. Client misses: the second call served by "
        "another version than the first. Recorded mixed runs: stored runs (after stitching) whose calls "
        "two versions served.\n\n"
        + markdown_table(
            [
                "answers",
                "how calls reach the gateways",
                "before the 2nd call",
                "runs",
                "canary arm",
                "client misses",
                "recorded mixed runs",
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
