"""Reward ingest: how fast POST /v1/rewards stores rewards, and how fast pending ones link.

Starts the fake upstream and one gateway process (auth "open") on a scratch database of the
local PostgreSQL (created and dropped here), records some trajectories, then measures in
rounds and quotes medians over rounds, every phase from the same client (aiohttp, whose
per-request cost is a fraction of httpx's: the client shares the machine's cores):

- chat calls (non-stream, to the fake upstream) at concurrency 32: calls/s and p50/p99, the
  yardstick the reward figures stand beside;
- single rewards, one per request, each to its own idempotency key, at concurrency 32:
  rewards/s, p50/p99, and rewards per PostgreSQL transaction (group commit);
- chat calls and single rewards at the same time (16 senders each);
- batches of 100 at concurrency 4: rewards/s;
- replays (every request a duplicate of an idempotency key already stored): requests/s;
- signed webhooks (HMAC header instead of a key), single rewards at concurrency 32;
- pending rewards: rewards posted (batches) for trajectories that do not exist yet, then the
  trajectories are recorded: the time until every reward is linked.

    python -m bench.reward_ingest           # about a minute; writes docs/benchmarks.md
    python -m bench.reward_ingest --quick   # smoke run, writes nothing
    python -m bench.reward_ingest --no-write  # full sizes, prints only

Run from the repository root: the gateway and the fake upstream are started by bench.harness.

$APPRENTICE_BENCH_PG_URL selects the server (default postgresql://postgres@127.0.0.1:5432/postgres).
Only loopback addresses are used; every loop is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import aiohttp
import httpx
import orjson
import psycopg

from bench.harness import scratch_database, start_gateway, start_upstream, write_config
from bench.report import machine_line, markdown_table, write_section
from bench.stats import percentile
from gateway.rewards.signatures import sign
from tests.conftest import gateway_config

SECTION_TITLE = "Reward ingest"
SECRET = "whsec_bench"
ADMIN_URL = os.environ.get("APPRENTICE_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


async def post_all(
    base_url: str,
    bodies: list[bytes],
    concurrency: int,
    signed: bool = False,
    path: str = "/rewards",
    answered: dict[str, float] | None = None,
) -> dict[str, float]:
    """POST every body with `concurrency` senders over keep-alive connections; raises on any answer
    but 200 (409 for a signed replay, which a webhook sender re-signs). Every sender's connection
    is opened before the clock starts (a first request's TCP handshake is not the gateway's
    latency). With `answered`, each answer's `id` is put there with the time it arrived
    (time.monotonic), for the shipper's lag."""
    latencies: list[float] = []
    failures = 0
    transport_errors = 0
    queue = list(reversed(bodies))
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(base_url=base_url + "/", connector=connector, timeout=timeout) as session:

        async def connect() -> None:
            async with session.get("models") as response:
                await response.read()

        await asyncio.gather(*(connect() for _ in range(concurrency)))

        async def sender() -> None:
            nonlocal failures, transport_errors
            while queue:
                body = queue.pop()
                headers = {"Content-Type": "application/json"}
                if signed:
                    headers["Apprentice-Signature"] = sign(SECRET, body)
                started = time.perf_counter()
                for attempt in range(3):  # a keep-alive connection closed under us: count it, resend
                    try:
                        async with session.post(path.lstrip("/"), data=body, headers=headers) as response:
                            content = await response.read()
                            status = response.status
                        if answered is not None and status == 200:
                            answered[orjson.loads(content)["id"]] = time.monotonic()
                        break
                    except aiohttp.ClientError:
                        transport_errors += 1
                        if signed:  # the same signature would be a replay
                            headers["Apprentice-Signature"] = sign(SECRET, body, int(time.time()) + attempt + 1)
                else:
                    raise RuntimeError("three transport errors in a row")
                latencies.append(time.perf_counter() - started)
                failures += status != 200 and not (signed and status == 409)

        started = time.perf_counter()
        await asyncio.gather(*(sender() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{failures} of {len(bodies)} requests to {path} failed")
    if transport_errors:
        print(f"  ({transport_errors} transport errors, resent)", flush=True)
    return {
        "elapsed": elapsed,
        "per_s": len(bodies) / elapsed,
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
    }


def chat_bodies(n: int, tag: str) -> list[bytes]:
    return [
        orjson.dumps({"model": "fake-model", "messages": [{"role": "user", "content": f"{tag} chat {i}"}]})
        for i in range(n)
    ]


LAG_POLL_S = 0.02


def watch_rows(url: str, answered: dict[str, float], landed: dict[str, float], stop: threading.Event) -> None:
    """Until `stop` and every answered call has landed (at most 30 s after `stop`): each call's
    row in `calls` is looked for every LAG_POLL_S by its response id, and the time it is first
    seen (time.monotonic) put in `landed`."""
    deadline = None
    with psycopg.connect(url, autocommit=True) as connection:
        while True:
            if stop.is_set():
                deadline = deadline or time.monotonic() + 30
                if len(landed) >= len(answered) or time.monotonic() > deadline:
                    return
            waiting = [response_id for response_id in list(answered) if response_id not in landed]
            if waiting:
                rows = connection.execute(
                    "SELECT response_id FROM calls WHERE response_id = ANY(%s)", (waiting,)
                ).fetchall()
                seen = time.monotonic()
                for (response_id,) in rows:
                    landed[response_id] = seen
            time.sleep(LAG_POLL_S)


async def side_by_side(
    base_url: str, url: str, chats: list[bytes], rewards: list[bytes], concurrency: int
) -> tuple[dict, dict, dict]:
    """Chat calls and rewards sent at the same time, `concurrency` senders each, and the shipper's
    lag: from a call's answer to its row in `calls`, seen by a poller every LAG_POLL_S (so each
    figure is late by up to that, plus the poll's own query)."""
    answered: dict[str, float] = {}
    landed: dict[str, float] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=watch_rows, args=(url, answered, landed, stop), daemon=True)
    watcher.start()
    try:
        chat, reward = await asyncio.gather(
            post_all(base_url, chats, concurrency, path="/chat/completions", answered=answered),
            post_all(base_url, rewards, concurrency),
        )
    finally:
        stop.set()
        await asyncio.to_thread(watcher.join)
    if len(landed) < len(answered):
        raise RuntimeError(f"{len(answered) - len(landed)} of {len(answered)} calls never landed in `calls`")
    lags = [landed[response_id] - answered_at for response_id, answered_at in answered.items()]
    lag = {"p50_ms": percentile(lags, 0.5) * 1000, "p99_ms": percentile(lags, 0.99) * 1000}
    return chat, reward, lag


def transactions(url: str) -> int:
    """Transactions committed in the database so far (pg_stat_database, flushed about every second)."""
    with psycopg.connect(url) as connection:
        connection.execute("SELECT pg_stat_clear_snapshot()")
        row = connection.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        return int(row[0]) if row else 0


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
    gateway_root: str, url: str, trajectories: list[str], sizes: dict[str, int], round_index: int
) -> dict[str, float]:
    base_url = f"{gateway_root}/v1"
    tag = f"r{round_index}-{uuid.uuid4().hex[:6]}"
    results: dict[str, float] = {}
    n = sizes["single"]

    def singles(label: str, count: int) -> list[bytes]:
        return [
            orjson.dumps(
                {
                    "trajectory_id": trajectories[i % len(trajectories)],
                    "reward": (i % 10) / 10,
                    "idempotency_key": f"{tag}-{label}{i}",
                }
            )
            for i in range(count)
        ]

    chat = asyncio.run(post_all(base_url, chat_bodies(n, tag), 32, path="/chat/completions"))
    results.update(chat_per_s=chat["per_s"], chat_p50_ms=chat["p50_ms"], chat_p99_ms=chat["p99_ms"])

    single_bodies = singles("s", n)
    time.sleep(1.2)  # pg_stat_database is flushed about every second
    before = transactions(url)
    single = asyncio.run(post_all(base_url, single_bodies, 32))
    time.sleep(1.2)
    committed = max(transactions(url) - before, 1)
    results.update(
        single_per_s=single["per_s"],
        single_p50_ms=single["p50_ms"],
        single_p99_ms=single["p99_ms"],
        rewards_per_transaction=n / committed,
    )

    mixed_chat, mixed_reward, lag = asyncio.run(
        side_by_side(base_url, url, chat_bodies(n // 2, tag + "m"), singles("m", n // 2), 16)
    )
    results.update(
        mixed_chat_per_s=mixed_chat["per_s"],
        mixed_chat_p50_ms=mixed_chat["p50_ms"],
        mixed_chat_p99_ms=mixed_chat["p99_ms"],
        mixed_reward_per_s=mixed_reward["per_s"],
        mixed_reward_p50_ms=mixed_reward["p50_ms"],
        mixed_reward_p99_ms=mixed_reward["p99_ms"],
        mixed_lag_p50_ms=lag["p50_ms"],
        mixed_lag_p99_ms=lag["p99_ms"],
    )

    replay = asyncio.run(post_all(base_url, single_bodies, 32))
    results.update(replay_per_s=replay["per_s"], replay_p50_ms=replay["p50_ms"])

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
    signed = asyncio.run(post_all(base_url, signed_bodies, 32, signed=True))
    results.update(signed_per_s=signed["per_s"], signed_p50_ms=signed["p50_ms"], signed_p99_ms=signed["p99_ms"])

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
    batch = asyncio.run(post_all(base_url, bodies, 4))
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
    asyncio.run(post_all(base_url, pending_bodies, 4))
    record_trajectories(base_url, names)
    recorded_at = time.perf_counter()
    late = f"SELECT count(*) FROM trajectories WHERE client_trajectory_id LIKE '{tag}-late-%'"
    wait_until(lambda: count(url, late) >= len(names), 60)
    stored = time.perf_counter() - recorded_at
    linked = wait_until(lambda: count(url, "SELECT count(*) FROM rewards WHERE status = 'pending'") == 0, 120)
    results.update(link_s=stored + linked, link_per_s=pending_n / max(stored + linked, 1e-9))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, one round, writes nothing")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print the figures, leave docs/benchmarks.md alone")
    args = parser.parse_args()
    sizes = (
        {"single": 300, "batches": 20, "pending": 1000, "late_trajectories": 20, "trajectories": 50}
        if args.quick
        else {"single": 2000, "batches": 100, "pending": 5000, "late_trajectories": 100, "trajectories": 200}
    )
    rounds = 1 if args.quick else args.rounds

    load_before = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    workdir = Path(tempfile.mkdtemp(prefix="reward-bench-"))
    with scratch_database("apprentice_bench_rewards", ADMIN_URL) as url:
        upstream, upstream_url = start_upstream(workdir)
        gateway = None
        try:
            config = gateway_config(
                url,
                workdir / "data",
                upstream_url,
                rewards={"webhook_secrets": [{"secret": SECRET, "tenant": "local"}], "max_batch": 1000},
                journal={"ship_interval_s": 0.05},
                log_level="warning",
            )
            gateway, root = start_gateway(write_config(workdir / "gateway.yaml", config), workdir)
            trajectories = record_trajectories(f"{root}/v1", [f"bench-{i}" for i in range(sizes["trajectories"])])
            wait_until(lambda: count(url, "SELECT count(*) FROM trajectories") >= len(trajectories), 60)
            all_rounds = []
            for index in range(rounds):
                result = run_round(root, url, trajectories, sizes, index)
                print(
                    f"round {index + 1}/{rounds}: " + ", ".join(f"{k}={v:.1f}" for k, v in result.items()), flush=True
                )
                all_rounds.append(result)
        finally:
            if gateway is not None:
                gateway.stop()
            upstream.stop()

    median = {key: statistics.median(r[key] for r in all_rounds) for key in all_rounds[0]}
    rows = [
        [
            "chat calls (fake upstream), c=32",
            f"{median['chat_per_s']:.0f} calls/s",
            f"p50 {median['chat_p50_ms']:.1f} ms, p99 {median['chat_p99_ms']:.1f} ms",
        ],
        [
            "single rewards, c=32",
            f"{median['single_per_s']:.0f} rewards/s",
            f"p50 {median['single_p50_ms']:.1f} ms, p99 {median['single_p99_ms']:.1f} ms; "
            f"about {median['rewards_per_transaction']:.0f} rewards a transaction",
        ],
        [
            "chat calls and single rewards at once, c=16 each",
            f"{median['mixed_chat_per_s']:.0f} calls/s + {median['mixed_reward_per_s']:.0f} rewards/s",
            f"calls p50 {median['mixed_chat_p50_ms']:.1f} ms, p99 {median['mixed_chat_p99_ms']:.1f} ms; "
            f"rewards p50 {median['mixed_reward_p50_ms']:.1f} ms, p99 {median['mixed_reward_p99_ms']:.1f} ms; "
            f"answer to row p50 {median['mixed_lag_p50_ms']:.0f} ms, p99 {median['mixed_lag_p99_ms']:.0f} ms",
        ],
        [
            "replays of stored idempotency keys, c=32",
            f"{median['replay_per_s']:.0f} requests/s",
            f"p50 {median['replay_p50_ms']:.1f} ms",
        ],
        [
            "signed webhooks (HMAC + replay row), c=32",
            f"{median['signed_per_s']:.0f} rewards/s",
            f"p50 {median['signed_p50_ms']:.1f} ms, p99 {median['signed_p99_ms']:.1f} ms",
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
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    body = "\n\n".join(
        [
            "`python -m bench.reward_ingest` (one gateway process, auth open, local PostgreSQL; "
            f"median of {rounds} rounds, {sizes['single']} requests a phase, one aiohttp client process "
            "on the same machine).",
            markdown_table(["phase", "throughput", "latency"], rows),
            "Single rewards are written by group commit (gateway/rewards/group_commit.py): concurrent "
            "requests share one transaction of a fixed number of statements, each answered with its own "
            "result after the COMMIT; 'rewards a transaction' is the database's commit count over the phase "
            "(background workers included). A batch is one transaction whatever its size. Linking includes "
            "the time the shipper takes to store the late calls.",
            machine_line() + f" Load average before the run: {load_before}; after: {load} (1, 5, 15 min; "
            "2 cores shared with other work: compare rows of one run).",
        ]
    )
    print(body)
    if not (args.quick or args.no_write):
        write_section(SECTION_TITLE, body)


if __name__ == "__main__":
    main()
