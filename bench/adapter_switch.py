"""Adapter switch time: from a lifecycle transition's commit to the gateway routing new calls
to the new version, with the NOTIFY the lifecycle sends and with the 1 s poll alone.

Real processes: PostgreSQL (a scratch database), the fake upstream of the tests (it answers at
once and echoes the model it was asked for, so each answer names the version that served it)
and one gateway with the default `adapter_poll_interval_s` (1 s). Probe clients call the
policy back to back. Each trial records a candidate, waits a random 0..1 s (so the commit
falls anywhere in the poll's period), promotes it with `lifecycle.promote` and measures the
time from the commit to the sending of the first call answered by the new version.

"poll only" is the same gateway and the same transition with the NOTIFY sent on a channel
nobody listens to, which is what a gateway without the listener sees.

    python -m bench.adapter_switch [--trials 20] [--pg URL] [--no-write]
    python -m bench.adapter_switch --quick        # smoke run, writes nothing
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import psycopg

from bench.harness import scratch_database, start_gateway, start_upstream, write_config
from bench.report import machine_line, markdown_table, write_section

TITLE = "Adapter switch: transition commit to the gateway routing to the new version"
POLICY = "switch-policy"
PROBES = 2


class Probes:
    """Back-to-back calls through the gateway; each answer names the version that served it."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.answers: list[tuple[float, str]] = []  # (sent, model), monotonic clock
        self._stop = asyncio.Event()

    async def _probe(self) -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            while not self._stop.is_set():
                sent = time.monotonic()
                body = {"model": POLICY, "messages": [{"role": "user", "content": uuid.uuid4().hex}]}
                response = await client.post(f"{self.base_url}/chat/completions", json=body)
                response.raise_for_status()
                self.answers.append((sent, response.json()["model"]))

    def start(self) -> list[asyncio.Task[None]]:
        return [asyncio.create_task(self._probe()) for _ in range(PROBES)]

    def stop(self) -> None:
        self._stop.set()

    async def first_sent(self, model: str, timeout: float = 10.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hits = [sent for sent, served in self.answers if served == model]
            if hits:
                return min(hits)
            await asyncio.sleep(0.005)
        raise TimeoutError(f"no call answered by {model}")


async def trials(database_url: str, gateway_url: str, count: int, notify: bool, first_number: int) -> list[float]:
    from apprentice.promotion import lifecycle
    from apprentice.store.engine import make_async_engine

    engine = make_async_engine(database_url)
    channel = lifecycle.NOTIFY_CHANNEL
    if not notify:
        lifecycle.NOTIFY_CHANNEL = f"bench_nobody_listens_{uuid.uuid4().hex[:8]}"
    probes = Probes(gateway_url)
    tasks = probes.start()
    switches = []
    try:
        with psycopg.connect(database_url, autocommit=True) as db:
            for number in range(first_number, first_number + count):
                version_id, name = uuid.uuid4(), f"{POLICY}-v{number}"
                db.execute(
                    "INSERT INTO adapter_versions (id, policy, version, name, status, base_model, path) "
                    "VALUES (%s, %s, %s, %s, 'candidate', 'fake-base', '/nowhere')",
                    (version_id, POLICY, number, name),
                )
                await asyncio.sleep(random.uniform(0.0, 1.0))
                await lifecycle.promote(engine, version_id, actor="bench")
                committed = time.monotonic()  # the transaction committed as promote returned
                switches.append(await probes.first_sent(name) - committed)
                print(f"{'notify' if notify else 'poll'} trial {number}: switch {switches[-1] * 1000:.1f} ms")
    finally:
        lifecycle.NOTIFY_CHANNEL = channel
        probes.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        await engine.dispose()
    return switches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20, help="Trials per mode.")
    parser.add_argument(
        "--pg", default=os.environ.get("APPRENTICE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--no-write", action="store_true", help="Print only; leave docs/benchmarks.md alone.")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 trials per mode; writes nothing")
    args = parser.parse_args()
    if args.quick:
        args.trials, args.no_write = 3, True
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

    load0 = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp, scratch_database("apprentice_bench_switch", args.pg) as database_url:
        upstream = gateway = None
        try:
            upstream, upstream_url = start_upstream(Path(tmp))
            policy = {"name": POLICY, "base_model": "fake-base", "endpoints": [upstream_url]}
            config = {
                "database_url": database_url,
                "data_dir": str(Path(tmp) / "gateway"),
                "auth": {"mode": "open"},
                "policies": [policy],
            }
            gateway, root = start_gateway(write_config(Path(tmp) / "gateway.yaml", config), Path(tmp))
            for notify in (True, False):
                label = "NOTIFY" if notify else "poll only"
                results[label] = asyncio.run(
                    trials(database_url, f"{root}/v1", args.trials, notify, first_number=1 + len(results) * args.trials)
                )
        finally:
            for process in (gateway, upstream):
                if process is not None:
                    process.stop()

    def ms(values: list[float]) -> list[str]:
        quantiles = statistics.quantiles(values, n=10)
        return [
            f"{statistics.median(values) * 1000:.0f}",
            f"{quantiles[-1] * 1000:.0f}",
            f"{min(values) * 1000:.0f}",
            f"{max(values) * 1000:.0f}",
        ]

    rows = [[label, len(values), *ms(values)] for label, values in results.items()]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    body = "\n\n".join(
        [
            "`python -m bench.adapter_switch` — " + machine_line() + f" Load average before the run: {load0}; "
            f"after: {load} (the machine was shared with other work).",
            "One gateway process with the default `adapter_poll_interval_s: 1` in front of the fake upstream, "
            "PostgreSQL on localhost, two clients calling the policy back to back. Each trial promotes a new "
            "version with `lifecycle.promote` at a random moment and measures from its commit to the sending of "
            'the first call the new version answered. "poll only": the same, with the NOTIFY sent on a channel '
            "no gateway listens to.",
            markdown_table(["switch", "trials", "median ms", "p90 ms", "min ms", "max ms"], rows),
        ]
    )
    print(body)
    if not args.no_write:
        write_section(TITLE, body)


if __name__ == "__main__":
    main()
