"""The harness of the side-by-side overhead benchmarks: one fake upstream, gateways that differ in
one setting, interleaved rounds of calls against each, and the overhead read off in the same round.

Why a module of its own: `bench.limits_overhead`, `bench.redaction_overhead`,
`bench.tracing_overhead` and `bench.protocol_overhead` each held a near-copy of the same start-up
(a fresh database upgraded once, the fake upstream, `apprentice gateway` per variant config, wait
until each answers), the same measurement loop and the same report arithmetic. Kept here once, a
fix to how the processes start, how the rounds interleave or how "added over direct" is computed
reaches all four, and their figures keep meaning the same thing. Each benchmark keeps what is its
own: its configs, its request kinds, its in-process cost and its prose.

    async with side_by_side("limits") as stack:      # database apprentice_bench_limits, upstream up
        await stack.add_gateway("limits off", {...})   # -> its /v1 URL, also in stack.urls
        results = await interleaved_rounds(clients, rounds, requests)
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import AsyncIterator, Hashable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from apprentice.processes import ManagedProcess
from bench.gateway_overhead import wait_ready
from bench.harness import (
    bench_env,
    db_upgrade,
    drop_database,
    log,
    recreate_database,
    start_gateway,
    start_upstream,
)
from bench.loadgen import LoadClient
from bench.report import write_section
from bench.stats import median, percentile

ADMIN_URL = os.environ.get("APPRENTICE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")

K = TypeVar("K", bound=Hashable)


class SideBySide:
    """The processes of one run. `urls` maps each target to its /v1 URL: "direct" (the fake
    upstream) first, then every gateway in the order `add_gateway` started it."""

    def __init__(self, workdir: Path, database_url: str, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.database_url = database_url
        self.env = env
        self.upstream_url = ""  # set once the fake upstream runs
        self.urls: dict[str, str] = {}
        self.processes: list[ManagedProcess] = []
        self._upgraded = False

    def start(self, process: ManagedProcess, timeout: float = 30) -> ManagedProcess:
        """Start a process (stopped when the run ends) and wait for its ready_url, if it has one."""
        process.start()
        self.processes.append(process)
        if process.ready_url:
            process.wait_ready(timeout)
        return process

    async def add_gateway(self, name: str, config: dict[str, Any]) -> str:
        """Start `apprentice gateway` (one worker) on `config` plus what every gateway here shares:
        this run's database, a data directory of its own, open auth. The first one runs
        `db upgrade` before it starts. Returns its /v1 URL once it answers a chat completion."""
        slug = name.replace(" ", "-")
        path = self.workdir / f"{slug}.yaml"
        shared = {"database_url": self.database_url, "data_dir": str(self.workdir / slug), "auth": {"mode": "open"}}
        path.write_text(json.dumps({**shared, **config}))
        if not self._upgraded:
            db_upgrade(path, self.env)
            self._upgraded = True
        gateway, root = start_gateway(path, self.workdir, name=name, env=self.env, ready_timeout=None)
        self.processes.append(gateway)
        self.urls[name] = f"{root}/v1"
        await wait_ready(self.urls[name], None, 120)
        return self.urls[name]


@asynccontextmanager
async def side_by_side(name: str, hidden_env: tuple[str, ...] = ("APPRENTICE_",)) -> AsyncIterator[SideBySide]:
    """A fresh database `apprentice_bench_<name>` and the fake upstream, started; the gateways run
    without DATABASE_URL and the variables starting with `hidden_env`. On the way out every process
    is stopped, the last started first, and the database dropped."""
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    database = f"apprentice_bench_{name}"
    database_url = recreate_database(ADMIN_URL, database)
    stack = SideBySide(workdir, database_url, bench_env(hidden_env))
    try:
        upstream, stack.upstream_url = start_upstream(workdir)
        stack.processes.append(upstream)
        stack.urls["direct"] = stack.upstream_url
        yield stack
    finally:
        for process in reversed(stack.processes):
            process.stop()
        drop_database(ADMIN_URL, database)


async def interleaved_rounds(
    clients: Mapping[K, LoadClient], rounds: int, requests: int, *, check_warm_up: bool = False
) -> dict[K, list[tuple[float, float]]]:
    """Per client, its (p50, p99) in ms in each round. After a warm-up (connections, caches, the
    journal's first segment), each round sends `requests` calls through every client in turn, so
    that the noise of a shared machine falls on each alike. A failed call in a round fails the run
    (in the warm-up too with `check_warm_up`). The clients are closed at the end."""
    results: dict[K, list[tuple[float, float]]] = {key: [] for key in clients}
    try:
        for client in clients.values():
            samples, _ = await client.run(max(20, requests // 5))
            failed = [s for s in samples if not s.ok]
            if check_warm_up and failed:
                raise RuntimeError(f"{client.endpoint.url}: {len(failed)} failed, e.g. {failed[0].body_tail[:300]!r}")
        for number in range(rounds):
            for key, client in clients.items():
                samples, _ = await client.run(requests)
                bad = sum(1 for s in samples if not s.ok)
                if bad:
                    raise RuntimeError(f"{key}: {bad} of {len(samples)} requests failed")
                totals = [s.total * 1000.0 for s in samples]
                results[key].append((median(totals), percentile(totals, 0.99)))
            log(f"round {number + 1}/{rounds} done")
    finally:
        for client in clients.values():
            client.close()
    return results


def added(results: Mapping[K, Sequence[tuple[float, float]]], key: K, base: K, index: int) -> float:
    """Median over rounds of (key's figure - base's in the same round), ms; index 0: p50, 1: p99."""
    return median(a[index] - b[index] for a, b in zip(results[key], results[base], strict=True))


def latency_cells(results: Mapping[K, Sequence[tuple[float, float]]], key: K, base: K | None) -> list[object]:
    """A table's cells for key: p50, p99 (medians over rounds) and "added over base, p50 / p99",
    or "(baseline)" when base is None."""
    p50 = median(r[0] for r in results[key])
    p99 = median(r[1] for r in results[key])
    over = (
        "(baseline)" if base is None else f"{added(results, key, base, 0):+.3f} / {added(results, key, base, 1):+.3f}"
    )
    return [f"{p50:.3f}", f"{p99:.3f}", over]


def load_note(load: tuple[float, float]) -> str:
    """The load average at start and end, flagged when the machine was busy (no final period)."""
    busy = load[0] >= 1.5 or load[1] >= 1.5
    return (
        f"Load average at start / end: {load[0]:.2f} / {load[1]:.2f}"
        f"{' (a busy shared machine: read the figures as rough)' if busy else ''}"
    )


def arguments(doc: str | None, rounds: int, requests: int) -> argparse.ArgumentParser:
    """The options every side-by-side benchmark takes, with its own default sizes."""
    parser = argparse.ArgumentParser(description=(doc or "").partition("\n")[0])
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--requests", type=int, default=requests)
    parser.add_argument("--quick", action="store_true", help="a smoke run; writes nothing")
    return parser


def sizes(args: argparse.Namespace) -> tuple[int, int]:
    """(rounds, requests per round and target): a smoke run's with --quick."""
    return (1, 20) if args.quick else (args.rounds, args.requests)


def publish(args: argparse.Namespace, title: str, report: str) -> None:
    """Print the report; write it as the section `title` of docs/benchmarks.md unless --quick."""
    print(report)
    if not args.quick:
        write_section(title, report)
