"""A soak: N minutes of steady traffic through the whole loop, sampled every minute.

`apprentice up --config` runs the product as users run it (the local inference server with
SmolLM2-135M-Instruct, the gateway, the learner with automatic promotion), on a fresh database
in the PostgreSQL at --pg-admin-url, with one extra model, `fake-model`, routed to the tests' fake
upstream. Three kinds of traffic run at once for --minutes:

- policy agents: two-call runs of the word-limit task (describe a topic in at most 8 words,
  then "now in at most 5"; the second call continues the first by content), in groups of
  --group-size, at --policy-rate runs a second with at most --policy-concurrency in flight; each
  run's reward (the second answer within 5 words, ended by itself) is posted 0.5-8 s later with
  its group id, so the learner trains and promotion acts during the soak;
- `fake-model` calls through the gateway at --rate a second (open loop, keep-alive connections),
- the same calls straight to the fake upstream at the same rate, half a period apart.

Added latency, as bench/gateway_overhead.py measures it: per minute, the gateway's p50 (p99)
minus the direct calls' p50 (p99), each call timed from its scheduled send to its last byte.

Every minute: gateway, learner and inference server RSS and open descriptors (their process
trees, from /proc), the journal and adapter directories' sizes, every table's total and heap
size and row count and every index's size (pg_total_relation_size / pg_relation_size).
At the end, each series' growth per minute in the first and second half, with a verdict
(bench/soak_trend.py states the rule), and a check that every `fake-model` call the gateway
answered is stored.

    python -m bench.soak                   # 30 minutes; writes its section of docs/benchmarks.md
    python -m bench.soak --minutes 3       # a check of the harness (still writes, unless --no-write)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from apprentice.commands.up import DEFAULT_POLICY, default_config
from apprentice.processes import ManagedProcess, free_port
from bench.gateway_overhead import MODEL, chat_body
from bench.harness import HOST, drop_database, pg_connect, recreate_database, start_up, start_upstream
from bench.loadgen import Connection, Endpoint
from bench.report import machine_line, markdown_table, write_section
from bench.soak_probe import database_sizes, directory_bytes, tree_open_fds, tree_rss_bytes
from bench.soak_trend import RULE, Trend, judge, scaled
from bench.stats import percentile
from examples.word_limit_agent import TOPICS, post_reward_later, score, task_prompt

SECTION_TITLE = "Soak: the whole loop under steady traffic"
REPO = Path(__file__).resolve().parent.parent
FIRST_WORDS = 8
SECOND_WORDS = 5
MAX_TOKENS = 24
SERVICES = ("gateway", "learner", "inference server")
WARM_UP_CALLS = 100  # per target, before the soak; the gateway's are stored too


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# --------------------------------------------------------------------------- the product


@dataclass
class Product:
    """`apprentice up` and the fake upstream behind `fake-model`, with what the probes read."""

    work: Path
    up: ManagedProcess
    upstream: ManagedProcess
    gateway_url: str  # ends in /v1
    upstream_url: str  # ends in /v1
    db_url: str
    data_dir: Path
    pids: dict[str, int] = field(default_factory=dict)

    def stop(self) -> None:
        self.up.signal(2)  # Ctrl-C, as a person stops it
        self.up.wait_stopped(time.monotonic() + 90)
        self.upstream.stop(15)


def service_pids(up_pid: int) -> dict[str, int]:
    """The gateway, learner and inference server that `apprentice up` started (its children)."""
    import psutil

    names = {"gateway": "gateway", "learner": "learner", "serve-model": "inference server"}
    found: dict[str, int] = {}
    for child in psutil.Process(up_pid).children():
        command = child.cmdline()
        for word, service in names.items():
            if word in command[3:4]:  # python -m apprentice.cli <command> ...
                found[service] = child.pid
    return found


def start_product(args: argparse.Namespace) -> Product:
    work = Path(tempfile.mkdtemp(prefix="apprentice-soak-"))
    upstream, upstream_url = start_upstream(work)
    db_url = recreate_database(args.pg_admin_url, args.db_name)
    port, model_port = free_port(), free_port()
    data_dir = work / "data"
    config = default_config(data_dir, port, model_port)
    config["database_url"] = db_url
    config["model_list"] = [
        {
            "model_name": MODEL,
            "litellm_params": {"model": f"openai/{MODEL}", "api_base": upstream_url, "api_key": "sk-fake"},
        }
    ]
    config_path = work / "apprentice.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    try:
        up = start_up(config_path, work, timeout_s=args.start_timeout)
    except RuntimeError:
        upstream.stop()
        raise
    product = Product(work, up, upstream, f"http://{HOST}:{port}/v1", upstream_url, db_url, data_dir)
    product.pids = service_pids(up.pid)
    missing = set(SERVICES) - set(product.pids)
    if missing:
        product.stop()
        raise RuntimeError(f"apprentice up runs no {', '.join(sorted(missing))}")
    return product


# --------------------------------------------------------------------------- paced calls


@dataclass
class Timed:
    """One paced call: when it was due (seconds since the soak began), how long until its last
    byte counted from then (seconds), and whether it succeeded."""

    due: float
    latency: float
    ok: bool


class PacedCalls:
    """Open-loop calls to one endpoint at a fixed rate, on a pool of keep-alive connections.

    Each call is timed from when it was due, not from when a connection was free, so a stall
    shows in the latency instead of silently lowering the rate (coordinated omission)."""

    def __init__(self, endpoint: Endpoint, rate: float, max_connections: int = 64, timeout_s: float = 30.0) -> None:
        self.endpoint = endpoint
        self.period = 1.0 / rate
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        self.idle: list[Connection] = []
        self.opened = 0
        self.freed = asyncio.Condition()
        self.calls: list[Timed] = []
        self.failures: Counter[str] = Counter()

    async def _connection(self) -> Connection:
        async with self.freed:
            while not self.idle and self.opened >= self.max_connections:
                await self.freed.wait()
            if self.idle:
                return self.idle.pop()
            self.opened += 1
            return Connection(self.endpoint, self.timeout_s)

    async def _release(self, connection: Connection) -> None:
        async with self.freed:
            self.idle.append(connection)
            self.freed.notify()

    async def _one(self, origin: float, due: float) -> None:
        connection = await self._connection()
        try:
            sample = await connection.request()
        finally:
            await self._release(connection)
        end = sample.start + sample.total if sample.ok else time.perf_counter()
        self.calls.append(Timed(due, end - (origin + due), sample.ok))
        if not sample.ok:
            self.failures[f"status {sample.status}: {sample.body_tail[:120]!r}"] += 1

    async def run(self, origin: float, seconds: float, offset: float = 0.0) -> None:
        """Send calls due at origin + offset + k * period until `seconds` have passed."""
        running: set[asyncio.Task[None]] = set()
        index = 0
        while True:
            due = offset + index * self.period
            if due >= seconds:
                break
            await asyncio.sleep(max(0.0, origin + due - time.perf_counter()))
            task = asyncio.create_task(self._one(origin, due))
            running.add(task)
            task.add_done_callback(running.discard)
            index += 1
        await asyncio.gather(*running)

    def close(self) -> None:
        for connection in self.idle:
            connection.close()

    def ok_count(self) -> int:
        return sum(1 for call in self.calls if call.ok)


# --------------------------------------------------------------------------- policy agents


@dataclass
class PolicyRun:
    due: float
    ended: float
    version: str
    reward: float


@dataclass
class PolicyAgents:
    """Agents that know only the gateway's URL: two-call runs, rewards posted late with the group."""

    base_url: str
    rate: float
    concurrency: int
    group_size: int
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    runs: list[PolicyRun] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)
    reward_failures: Counter[str] = field(default_factory=Counter)
    rewards_posted: int = 0
    skipped: int = 0  # runs not started because --policy-concurrency were still in flight
    deliveries: set[asyncio.Task[None]] = field(default_factory=set)

    async def run(self, origin: float, seconds: float) -> None:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=self.base_url, api_key="soak", max_retries=0, timeout=180)
        http = httpx.AsyncClient(base_url=self.base_url, timeout=30)
        in_flight: set[asyncio.Task[None]] = set()
        index = 0
        topic = TOPICS[0]
        try:
            while True:
                due = index / self.rate
                if due >= seconds:
                    break
                await asyncio.sleep(max(0.0, origin + due - time.perf_counter()))
                group, member = divmod(index, self.group_size)
                if member == 0:
                    topic = self.rng.choice(TOPICS)
                index += 1
                if len(in_flight) >= self.concurrency:
                    # The model is behind: a skipped run keeps the soak steady instead of piling up.
                    self.skipped += 1
                    continue
                task = asyncio.create_task(self._one(client, http, origin, due, topic, f"soak-{group}"))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            await asyncio.gather(*in_flight)
            await asyncio.gather(*self.deliveries)
        finally:
            await http.aclose()
            await client.close()

    async def _one(
        self, client: Any, http: httpx.AsyncClient, origin: float, due: float, topic: str, group: str
    ) -> None:
        messages: list[dict[str, Any]] = list(task_prompt(topic, FIRST_WORDS))
        try:
            first = await client.chat.completions.create(model=DEFAULT_POLICY, messages=messages, max_tokens=MAX_TOKENS)
            messages = [
                *messages,
                {"role": "assistant", "content": first.choices[0].message.content or ""},
                {"role": "user", "content": f"Now say it in at most {SECOND_WORDS} words."},
            ]
            raw = await client.chat.completions.with_raw_response.create(
                model=DEFAULT_POLICY, messages=messages, max_tokens=MAX_TOKENS
            )
        except Exception as exc:  # noqa: BLE001 - counted and reported; the soak goes on
            self.failures[f"{type(exc).__name__}: {str(exc)[:120]}"] += 1
            return
        second = raw.parse()
        choice = second.choices[0]
        reward = score(choice.message.content or "", choice.finish_reason, SECOND_WORDS)
        self.runs.append(PolicyRun(due, time.perf_counter() - origin, second.model, reward))
        delivery = asyncio.create_task(
            self._deliver(http, raw.headers["x-trajectory-id"], reward, group, self.rng.uniform(0.5, 8.0))
        )
        self.deliveries.add(delivery)
        delivery.add_done_callback(self.deliveries.discard)

    async def _deliver(
        self, http: httpx.AsyncClient, trajectory_id: str, reward: float, group: str, delay: float
    ) -> None:
        try:
            await post_reward_later(http, trajectory_id, reward, group, delay)
            self.rewards_posted += 1
        except httpx.HTTPError as exc:
            self.reward_failures[f"{type(exc).__name__}: {str(exc)[:120]}"] += 1


# --------------------------------------------------------------------------- sampling


def sample_resources(product: Product, conn: Any) -> dict[str, float]:
    """One minute's reading of every resource series (bytes, counts)."""
    values: dict[str, float] = {}
    for service in SERVICES:
        pid = product.pids[service]
        values[f"{service} rss bytes"] = float(tree_rss_bytes(pid))
        values[f"{service} open fds"] = float(tree_open_fds(pid))
    values["journal directory bytes"] = float(directory_bytes(product.data_dir / "journal"))
    values["adapters directory bytes"] = float(directory_bytes(product.data_dir / "adapters"))
    values.update(database_sizes(conn))
    return values


async def sample_every_minute(
    product: Product, conn: Any, origin: float, minutes: int, samples: list[tuple[float, dict[str, float]]]
) -> None:
    """A sample at minute 0 (traffic starting) and at the end of each minute."""
    for minute in range(minutes + 1):
        await asyncio.sleep(max(0.0, origin + minute * 60 - time.perf_counter()))
        values = await asyncio.to_thread(sample_resources, product, conn)
        values["load average (1 min)"] = os.getloadavg()[0]
        samples.append((float(minute), values))
        dead = [s for s, pid in product.pids.items() if not tree_rss_bytes(pid)]
        log(
            f"minute {minute}: gateway {values['gateway rss bytes'] / 2**20:.0f} MiB, "
            f"learner {values['learner rss bytes'] / 2**20:.0f} MiB, "
            f"inference {values['inference server rss bytes'] / 2**20:.0f} MiB, "
            f"calls {values.get('table calls rows', 0):.0f}, load {values['load average (1 min)']:.1f}"
            + (f"; NOT RUNNING: {', '.join(dead)}" if dead else "")
        )


def latency_by_minute(gateway: PacedCalls, direct: PacedCalls, minutes: int) -> list[dict[str, float]]:
    """Per minute: p50 and p99 of each target (ms) and the gateway's added p50/p99."""
    rows = []
    for minute in range(minutes):
        low, high = minute * 60.0, (minute + 1) * 60.0
        gw = [c.latency * 1e3 for c in gateway.calls if low <= c.due < high and c.ok]
        dr = [c.latency * 1e3 for c in direct.calls if low <= c.due < high and c.ok]
        row = {
            "gateway p50 ms": percentile(gw, 0.5),
            "gateway p99 ms": percentile(gw, 0.99),
            "direct p50 ms": percentile(dr, 0.5),
            "direct p99 ms": percentile(dr, 0.99),
            "calls": float(len(gw)),
        }
        row["added p50 ms"] = row["gateway p50 ms"] - row["direct p50 ms"]
        row["added p99 ms"] = row["gateway p99 ms"] - row["direct p99 ms"]
        rows.append(row)
    return rows


def stored_fake_calls(conn: Any, expected: int, timeout_s: float = 60.0) -> int:
    """`fake-model` calls in PostgreSQL once the journal has shipped (waits up to `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    count = 0
    while time.monotonic() < deadline:
        (count,) = conn.execute("SELECT count(*) FROM calls WHERE model = %s", (MODEL,)).fetchone()
        if count >= expected:
            break
        time.sleep(1)
    return int(count)


def learning_summary(conn: Any, gateway_url: str) -> dict[str, Any]:
    """What the learner and promotion did: runs by status, versions by state, transitions."""
    runs = dict(conn.execute("SELECT status, count(*) FROM training_runs GROUP BY status").fetchall())
    versions = dict(conn.execute("SELECT status, count(*) FROM adapter_versions GROUP BY status").fetchall())
    (transitions,) = conn.execute("SELECT count(*) FROM adapter_transitions").fetchone()
    (two_call,) = conn.execute(
        "SELECT count(*) FROM trajectories WHERE policy = %s AND call_count = 2 AND merged_into IS NULL",
        (DEFAULT_POLICY,),
    ).fetchone()
    policy: dict[str, Any] = {}
    try:
        listing = httpx.get(f"{gateway_url}/admin/policies", timeout=30).json()["data"]
        policy = next(p for p in listing if p["name"] == DEFAULT_POLICY)
    except (httpx.HTTPError, KeyError, StopIteration, ValueError) as exc:
        policy = {"error": repr(exc)}
    return {
        "training_runs": runs,
        "versions": versions,
        "transitions": int(transitions),
        "two_call_trajectories": int(two_call),
        "promoted": (policy.get("promoted") or {}).get("name"),
        "canary": (policy.get("canary") or {}).get("name"),
        "lineage_head": (policy.get("lineage_head") or {}).get("name"),
    }


# --------------------------------------------------------------------------- report


def fmt(value: float, digits: int = 2) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:,.{digits}f}"


def trend_rows(trends: list[Trend]) -> list[list[object]]:
    rows: list[list[object]] = []
    for trend in trends:
        digits = 0 if trend.kind.unit in ("fds", "rows") else 2
        rows.append(
            [
                trend.name,
                trend.kind.unit,
                fmt(scaled(trend.kind, trend.first), digits),
                fmt(scaled(trend.kind, trend.last), digits),
                fmt(scaled(trend.kind, trend.first_half), 3),
                fmt(scaled(trend.kind, trend.second_half), 3),
                trend.verdict,
            ]
        )
    return rows


def render(
    args: argparse.Namespace,
    samples: list[tuple[float, dict[str, float]]],
    latency: list[dict[str, float]],
    trends: list[Trend],
    facts: dict[str, Any],
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> str:
    command = "python -m bench.soak " + " ".join(sys.argv[1:])
    resources = [t for t in trends if not t.kind.data]
    data = [t for t in trends if t.kind.data]
    changed = [t for t in data if t.first != t.last]
    headers = ["series", "unit", "first", "last", "growth/min, 1st half", "growth/min, 2nd half", "verdict"]
    per_minute = []
    by_minute = dict(samples)
    for minute, row in enumerate(latency, start=1):
        values = by_minute.get(float(minute), {})
        per_minute.append(
            [
                minute,
                int(row["calls"]),
                fmt(row["gateway p50 ms"]),
                fmt(row["direct p50 ms"]),
                fmt(row["added p50 ms"]),
                fmt(row["added p99 ms"]),
                fmt(values.get("gateway rss bytes", math.nan) / 2**20, 0),
                fmt(values.get("learner rss bytes", math.nan) / 2**20, 0),
                fmt(values.get("inference server rss bytes", math.nan) / 2**20, 0),
                fmt(values.get("table calls rows", math.nan), 0),
                facts["policy_runs_by_minute"][minute - 1],
                fmt(values.get("load average (1 min)", math.nan), 1),
            ]
        )
    grows = [t.name for t in resources if t.verdict == "grows"]
    accelerates = [t.name for t in data if t.verdict == "accelerates"]
    learning = facts["learning"]
    lines = [
        f"`{command}` — {machine_line()} Load average before: "
        f"{', '.join(f'{x:.1f}' for x in load_before)}; after: {', '.join(f'{x:.1f}' for x in load_after)}.",
        "",
        f"{args.minutes} minutes of `apprentice up` (one gateway process, the learner with automatic promotion, "
        f"the local inference server with SmolLM2-135M-Instruct on CPU) on a fresh database in the local "
        f"PostgreSQL. Traffic, all at once: `{MODEL}` calls (non-streamed chat completions, routed to the tests' "
        f"fake upstream) at {args.rate:g}/s through the gateway and at {args.rate:g}/s straight to the upstream, "
        f"open loop; policy agents at {args.policy_rate:g} two-call runs/s (groups of {args.group_size}, at most "
        f"{args.policy_concurrency} in flight), each rewarded 0.5-8 s later. Added latency per minute: the gateway's "
        "p50 (p99) minus the direct calls' p50 (p99) in that minute, each call timed from its scheduled send.",
        "",
        f"- `{MODEL}`: {facts['gateway_ok']:,} of {facts['gateway_sent']:,} gateway calls answered 200, "
        f"{facts['direct_ok']:,} of {facts['direct_sent']:,} direct; **{facts['stored']:,} of "
        f"{facts['gateway_ok']:,} answered calls stored** in PostgreSQL.",
        f"- Policy: {facts['policy_runs']} runs completed ({facts['policy_failed']} failed, {facts['policy_skipped']} "
        f"not started because {args.policy_concurrency} were in flight), {learning['two_call_trajectories']} stored "
        f"as one two-call trajectory, {facts['rewards_posted']} rewards posted ({facts['reward_failed']} failed), "
        f"success rate {fmt(facts['success_first'], 2)} in the first half, {fmt(facts['success_second'], 2)} in the "
        f"second; served by {', '.join(f'{v} ({n})' for v, n in facts['versions_served'].items()) or 'none'}.",
        f"- Learner and promotion: training runs {learning['training_runs'] or 'none'}; versions "
        f"{learning['versions'] or 'none'}; {learning['transitions']} transitions; at the end promoted "
        f"{learning['promoted'] or 'none (base model)'}, canary {learning['canary'] or 'none'}, lineage head "
        f"{learning['lineage_head'] or 'base'}.",
        "- Added latency (median over minutes): p50 "
        f"{fmt(facts['added_p50_median'])} ms, p99 {fmt(facts['added_p99_median'])} ms; first half / second half "
        f"median p99 {fmt(facts['added_p99_first'])} / {fmt(facts['added_p99_second'])} ms.",
        f"- Verdicts: {'no resource grows' if not grows else 'GROWS: ' + ', '.join(grows)}; "
        f"{'no data series accelerates' if not accelerates else 'ACCELERATES: ' + ', '.join(accelerates)}.",
    ]
    if args.uncommitted:
        lines.append(
            f"- The code under test had {len(args.uncommitted)} uncommitted changes under apprentice/, gateway/, "
            f"learner/ and migrations/ beside the commit above: {', '.join(args.uncommitted[:8])}"
            + (" ..." if len(args.uncommitted) > 8 else "")
            + "."
        )
    if facts["notes"]:
        lines += [f"- {note}" for note in facts["notes"]]
    lines += [
        "",
        "Per minute (RSS in MiB, latency in ms):",
        "",
        markdown_table(
            [
                "minute",
                f"{MODEL} calls",
                "gateway p50",
                "direct p50",
                "added p50",
                "added p99",
                "gateway RSS",
                "learner RSS",
                "inference RSS",
                "calls rows",
                "policy runs",
                "load",
            ],
            per_minute,
        ),
        "",
        "Resources:",
        "",
        markdown_table(headers, trend_rows(resources)),
        "",
        f"Tables and indexes that changed ({len(changed)} of {len(data)} series; the others stayed constant):",
        "",
        markdown_table(headers, trend_rows(changed)),
        "",
        f"Rule: {RULE}",
    ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main


def half_median(values: list[float], minutes: int, second: bool) -> float:
    """The median of the per-minute values of one half (a middle minute counts in neither)."""
    middle = minutes / 2
    chosen = [v for i, v in enumerate(values) if (i + 0.5 > middle if second else i + 0.5 < middle)]
    return percentile([v for v in chosen if not math.isnan(v)], 0.5)


async def warm_up(endpoints: list[Endpoint], calls: int) -> None:
    """A few calls to each target before measuring (connections, first-call paths, caches)."""
    for endpoint in endpoints:
        connection = Connection(endpoint, 30)
        for _ in range(calls):
            sample = await connection.request()
            if not sample.ok:
                raise RuntimeError(f"warm-up call to {endpoint.url} failed: {sample.status} {sample.body_tail!r}")
        connection.close()


async def soak(args: argparse.Namespace, product: Product, conn: Any) -> dict[str, Any]:
    headers = {"Authorization": "Bearer sk-soak"}
    gw_endpoint = Endpoint(f"{product.gateway_url}/chat/completions", chat_body(False), headers)
    direct_endpoint = Endpoint(f"{product.upstream_url}/chat/completions", chat_body(False), headers)
    await warm_up([direct_endpoint, gw_endpoint], WARM_UP_CALLS)
    gateway = PacedCalls(gw_endpoint, args.rate)
    direct = PacedCalls(direct_endpoint, args.rate)
    agents = PolicyAgents(product.gateway_url, args.policy_rate, args.policy_concurrency, args.group_size)
    samples: list[tuple[float, dict[str, float]]] = []
    seconds = args.minutes * 60.0
    origin = time.perf_counter() + 0.5
    clear_upstream = asyncio.create_task(clear_upstream_log(product.upstream_url, origin, seconds))
    log(f"traffic for {args.minutes} min: {args.rate:g}/s gateway and direct, {args.policy_rate:g} policy runs/s")
    await asyncio.gather(
        gateway.run(origin, seconds),
        direct.run(origin, seconds, offset=0.5 / args.rate),
        agents.run(origin, seconds),
        sample_every_minute(product, conn, origin, args.minutes, samples),
    )
    clear_upstream.cancel()
    gateway.close()
    direct.close()
    return {"gateway": gateway, "direct": direct, "agents": agents, "samples": samples}


async def clear_upstream_log(upstream_url: str, origin: float, seconds: float) -> None:
    """The fake upstream keeps every request it received (for tests); empty it every minute so
    that its own memory does not grow under the soak and skew the direct baseline."""
    root = upstream_url.removesuffix("/v1")
    async with httpx.AsyncClient(timeout=30) as http:
        minute = 0
        while minute * 60 < seconds:
            minute += 1
            await asyncio.sleep(max(0.0, origin + minute * 60 - 30 - time.perf_counter()))
            await http.delete(f"{root}/_requests")


def analyse(args: argparse.Namespace, result: dict[str, Any], conn: Any, product: Product) -> tuple[str, dict]:
    gateway: PacedCalls = result["gateway"]
    direct: PacedCalls = result["direct"]
    agents: PolicyAgents = result["agents"]
    samples: list[tuple[float, dict[str, float]]] = result["samples"]
    minutes = args.minutes
    latency = latency_by_minute(gateway, direct, minutes)
    series: dict[str, list[tuple[float, float]]] = {}
    for minute, values in samples:
        for name, value in values.items():
            if name != "load average (1 min)":
                series.setdefault(name, []).append((minute, value))
    for name in ("added p50 ms", "added p99 ms"):
        # A minute's latency belongs to the middle of that minute.
        series[name] = [(i + 0.5, row[name]) for i, row in enumerate(latency)]
    order: Callable[[str], tuple[int, str]] = lambda name: (  # noqa: E731 - a sort key, used once
        0 if not name.startswith(("table ", "index ")) else 1 if name.startswith("table ") else 2,
        name,
    )
    trends = [judge(name, series[name], minutes) for name in sorted(series, key=order)]
    stored = stored_fake_calls(conn, WARM_UP_CALLS + gateway.ok_count()) - WARM_UP_CALLS
    rewards = [run.reward for run in agents.runs]
    success = [[r.reward for r in agents.runs if (r.due >= minutes * 30) == second] for second in (False, True)]
    notes = []
    for label, failures in (
        (f"{MODEL} via the gateway", gateway.failures),
        (f"{MODEL} direct", direct.failures),
        ("policy runs", agents.failures),
        ("rewards", agents.reward_failures),
    ):
        if failures:
            notes.append(f"{label} failures: " + "; ".join(f"{n} x {k}" for k, n in failures.most_common(3)))
    if stored != gateway.ok_count():
        notes.append(f"STORED {stored} of {gateway.ok_count()} answered {MODEL} calls after 60 s")
    facts = {
        "gateway_sent": len(gateway.calls),
        "gateway_ok": gateway.ok_count(),
        "direct_sent": len(direct.calls),
        "direct_ok": direct.ok_count(),
        "stored": stored,
        "policy_runs": len(agents.runs),
        "policy_failed": sum(agents.failures.values()),
        "policy_skipped": agents.skipped,
        "policy_runs_by_minute": [sum(1 for r in agents.runs if int(r.due // 60) == m) for m in range(minutes)],
        "rewards_posted": agents.rewards_posted,
        "reward_failed": sum(agents.reward_failures.values()),
        "success_first": sum(success[0]) / len(success[0]) if success[0] else math.nan,
        "success_second": sum(success[1]) / len(success[1]) if success[1] else math.nan,
        "success_all": sum(rewards) / len(rewards) if rewards else math.nan,
        "versions_served": dict(Counter(run.version for run in agents.runs).most_common()),
        "learning": learning_summary(conn, product.gateway_url),
        "added_p50_median": percentile([r["added p50 ms"] for r in latency], 0.5),
        "added_p99_median": percentile([r["added p99 ms"] for r in latency], 0.5),
        "added_p99_first": half_median([r["added p99 ms"] for r in latency], minutes, False),
        "added_p99_second": half_median([r["added p99 ms"] for r in latency], minutes, True),
        "notes": notes,
    }
    raw = {"args": vars(args), "samples": samples, "latency": latency, "facts": facts}
    return_value = render(args, samples, latency, trends, facts, args.load_before, os.getloadavg())
    return return_value, raw


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=int, default=30, help="minutes of traffic (default 30)")
    parser.add_argument("--rate", type=float, default=50.0, help=f"{MODEL} calls/s through the gateway, and direct")
    parser.add_argument("--policy-rate", type=float, default=0.4, help="policy runs/s (two calls each) started")
    parser.add_argument("--policy-concurrency", type=int, default=8, help="policy runs in flight at most")
    parser.add_argument("--group-size", type=int, default=8, help="runs of the same topic in a group")
    parser.add_argument("--pg-admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--db-name", default="apprentice_soak", help="database created (replaced) for the soak")
    parser.add_argument("--keep-db", action="store_true", help="leave the database after the run")
    parser.add_argument("--start-timeout", type=float, default=900.0, help="seconds `apprentice up` may take")
    parser.add_argument("--json", type=Path, help="also write the raw samples here")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args(argv)
    if args.minutes < 2:
        parser.error("--minutes must be at least 2 (two halves to compare)")
    return args


def uncommitted_code() -> list[str]:
    """Paths of the product's code that differ from the commit the report names: a soak runs
    what is on disk, and in a shared working tree that may be more than the commit."""
    import subprocess

    status = subprocess.run(
        ["git", "status", "--porcelain", "--", "apprentice", "gateway", "learner", "migrations"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    ).stdout
    return [line[3:] for line in status.splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.load_before = os.getloadavg()
    args.uncommitted = uncommitted_code()
    log(f"starting apprentice up and the fake upstream (load average {args.load_before[0]:.1f})")
    product = start_product(args)
    log(f"up: gateway {product.gateway_url}, pids {product.pids}, work directory {product.work}")
    ok = False
    try:
        with pg_connect(product.db_url, autocommit=True) as conn:
            result = asyncio.run(soak(args, product, conn))
            log("traffic done; waiting for the journal to ship")
            markdown, raw = analyse(args, result, conn, product)
        print("\n" + markdown, flush=True)
        if args.json:
            args.json.write_text(json.dumps(raw, indent=1, default=str))
        if not args.no_write:
            write_section(SECTION_TITLE, markdown)
            log(f"wrote section '{SECTION_TITLE}' of docs/benchmarks.md")
        ok = True
    finally:
        product.stop()
        if not args.keep_db:
            drop_database(args.pg_admin_url, args.db_name)
        if ok:
            shutil.rmtree(product.work, ignore_errors=True)
        else:
            log(f"logs kept in {product.work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
