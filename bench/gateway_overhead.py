"""What the gateway adds over calling the same local upstream directly, next to the LiteLLM proxy.

Starts the fake upstream (`tests.support.fake_upstream`), the Apprentice gateway and the LiteLLM
proxy (one and two workers, no database) on it, then measures in interleaved rounds, so that the
noise of a shared machine falls on every target alike:

- latency at concurrency 1 and 32, non-streamed and streamed (20 content chunks): p50/p99 of the
  time to the last byte, and the time to the first body byte for streams;
- the latency each target adds: its p50 (p99) minus the direct call's p50 (p99) in the same
  round, then the median over rounds;
- requests/s at concurrency 32 and the CPU each target's processes (children included) spend a
  request;
- calls recorded into PostgreSQL (table `calls`): how fast rows land while the gateway is under
  load, and how fast the journal shipper drains a backlog (rows held back by a table lock).

    python -m bench.gateway_overhead                # about 4-5 minutes; writes docs/benchmarks.md
    python -m bench.gateway_overhead --quick        # smoke run, writes nothing
    python -m bench.gateway_overhead --targets direct,litellm
    python -m bench.gateway_overhead --features off,limits,redaction,tracing,cap,all   # each feature on/off

`--features` adds one gateway target per variant beside the gateway at its defaults: `off` (every
switchable feature off), one per feature (`off` with only that feature on) and `all` (every
feature on). Tracing exports to a collector process (`bench.tracing_overhead --collector`);
limits are set far above the load (every call is counted and checked, none refused).

Run from the repository root: the fake upstream is the tests' (`tests.support.fake_upstream`).

The LiteLLM proxy runs from its own virtual environment (default `.bench-venv`, created on first
use with `pip install 'litellm[proxy]'`), never from the project's. Only loopback addresses are
used; every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from apprentice.processes import free_port
from bench import harness
from bench.harness import (
    HOST,
    REPO,
    MeasuredProcess,
    cpu_delta,
    database_url,
    db_upgrade,
    drop_database,
    gateway_unavailable,
    log,
    pg_connect,
    recreate_database,
    tail,
    write_config,
)
from bench.loadgen import Endpoint, LoadClient
from bench.report import machine_line, markdown_table, write_section
from bench.stats import median, percentile

SECTION_TITLE = "Gateway overhead"
MODEL = "fake-model"
PROMPT = "Answer in a few words: what is the capital of France?"
BASELINE = "direct"
LOAD_AT_START = 0.0
PHASE_MAX_S = 30.0  # no phase of one target runs longer, whatever its request count

# (name, concurrency, stream)
PHASES: list[tuple[str, int, bool]] = [
    ("c1", 1, False),
    ("c1-stream", 1, True),
    ("c32", 32, False),
    ("c32-stream", 32, True),
]

GOALS = {
    "added_p50_c1_ms": 0.5,
    "added_p99_c1_ms": 2.0,
    "added_p50_c1_stream_ms": 1.0,
    "cpu_ms_per_request": 1.0,
    "throughput_vs_litellm_2w": 5.0,
    "recorded_calls_per_s": 3000.0,
}


# The gateway's switchable features since the overhead figures of commit 78c5149, as config
# sections: FEATURES_OFF switches all of them off, FEATURES_ON[name] switches one on.
# Tenant-tagged trajectory ids and the partitioned `calls` table have no switch: they are in
# every gateway target.
_NO_LIMIT = {"requests_per_minute": 1_000_000_000, "tokens_per_minute": 1_000_000_000_000}
FEATURES_OFF: dict[str, Any] = {
    "redaction": {"enabled": False},
    "stitching": {"max_calls_per_trajectory": None, "max_tokens_per_trajectory": None},
}
FEATURES_ON: dict[str, dict[str, Any]] = {
    "limits": {"limits": {"key": _NO_LIMIT, "tenant_default": _NO_LIMIT}},
    "redaction": {"redaction": {"enabled": True}},
    "tracing": {"tracing": {"otlp_endpoint": "{collector}"}},
    "cap": {"stitching": {"max_calls_per_trajectory": 1000, "max_tokens_per_trajectory": 2_000_000}},
}
VARIANTS = ("off", *FEATURES_ON, "all")


def feature_config(variant: str, collector_url: str) -> dict[str, Any]:
    """The config sections of a feature variant (see VARIANTS)."""
    if variant not in VARIANTS:
        raise SystemExit(f"unknown feature variant {variant!r} (choose from {', '.join(VARIANTS)})")
    config: dict[str, Any] = {} if variant == "all" else json.loads(json.dumps(FEATURES_OFF))
    for name, sections in FEATURES_ON.items():
        if variant in (name, "all"):
            for section, values in sections.items():
                config.setdefault(section, {}).update(values)
    if "tracing" in config:
        config["tracing"] = {"otlp_endpoint": collector_url}
    return config


@dataclass
class Sizes:
    rounds: int
    c1_requests: int
    c1_stream_requests: int
    c32_seconds: float
    c32_max_requests: int
    c32_min_requests: int  # per phase, even when that takes longer than c32_seconds (slow targets)
    pg_calls: int

    @classmethod
    def for_args(cls, args: argparse.Namespace) -> Sizes:
        sizes = (
            cls(
                rounds=1,
                c1_requests=30,
                c1_stream_requests=15,
                c32_seconds=0.5,
                c32_max_requests=2000,
                c32_min_requests=64,
                pg_calls=500,
            )
            if args.quick
            else cls(
                rounds=7,
                c1_requests=200,
                c1_stream_requests=100,
                c32_seconds=1.5,
                c32_max_requests=30000,
                c32_min_requests=128,
                pg_calls=10000,
            )
        )
        if args.rounds:
            sizes.rounds = args.rounds
        if args.pg_calls:
            sizes.pg_calls = args.pg_calls
        return sizes


# --------------------------------------------------------------------------- processes


def chat_body(stream: bool) -> bytes:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 64}
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


def endpoint(base_url: str, stream: bool) -> Endpoint:
    # The key is ignored by the fake upstream, by the gateway in open mode and by a LiteLLM proxy
    # without master key; sending one keeps the requests identical for every target.
    return Endpoint(f"{base_url}/chat/completions", chat_body(stream), {"Authorization": "Bearer sk-bench"}, stream)


async def wait_ready(base_url: str, proc: MeasuredProcess | None, timeout_s: float) -> float:
    """Poll with a real chat completion until it answers 200; returns the seconds it took."""
    started = time.perf_counter()
    client = LoadClient(endpoint(base_url, False), 1, timeout_s=10)
    last = ""
    try:
        while time.perf_counter() - started < timeout_s:
            if proc is not None and not proc.alive():
                raise RuntimeError(
                    f"{proc.name} exited with status {proc.returncode} while starting; "
                    f"log {proc.log_path}:\n{tail(proc.log_path)}"
                )
            sample = await client.one()
            if sample.ok:
                return time.perf_counter() - started
            last = f"status {sample.status}: {sample.body_tail[:300]!r}"
            await asyncio.sleep(0.25)
    finally:
        client.close()
    log_text = f"; log {proc.log_path}:\n{tail(proc.log_path)}" if proc else ""
    raise RuntimeError(f"{base_url} not ready after {timeout_s:.0f} s (last answer {last or 'none'}){log_text}")


@dataclass
class Target:
    name: str
    base_url: str  # ends in /v1
    proc: MeasuredProcess | None  # None: the upstream itself (its CPU is read from the upstream process)
    cpu_proc: MeasuredProcess
    workers: int = 1
    startup_s: float | None = None
    rss_bytes: int = 0
    idle_cpu_ms_per_s: float | None = None
    failed: str | None = None
    database: str | None = None
    clients: dict[str, LoadClient] = field(default_factory=dict)

    def client(self, phase: str, concurrency: int, stream: bool) -> LoadClient:
        if phase not in self.clients:
            self.clients[phase] = LoadClient(endpoint(self.base_url, stream), concurrency)
        return self.clients[phase]

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        self.clients.clear()


# --------------------------------------------------------------------------- LiteLLM proxy


def ensure_litellm_venv(venv: Path, spec: str) -> tuple[Path, str]:
    """The LiteLLM proxy's own environment: created on first use, never the project's."""
    binary = venv / "bin" / "litellm"
    python = venv / "bin" / "python"
    if not binary.exists():
        log(f"creating {venv} and installing {spec!r} for the LiteLLM proxy (a few minutes, once)")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", spec], check=True, timeout=1800)
        if not binary.exists():
            raise RuntimeError(f"{binary} missing after installing {spec!r}")
    version = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    return binary, version or "unknown"


async def start_litellm(binary: Path, upstream_url: str, workers: int, workdir: Path, timeout_s: float) -> Target:
    name = f"litellm-{workers}w"
    config = workdir / f"{name}.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        f"    litellm_params: {{model: openai/{MODEL}, api_base: '{upstream_url}', api_key: sk-fake}}\n"
    )
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "LITELLM_MASTER_KEY", "VIRTUAL_ENV")}
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # else it fetches a price map from the internet at import
    # No authentication, like the gateway in open mode (LiteLLM >= 1.108 refuses to start without a
    # master key unless told this).
    env["LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY"] = "true"
    env["PATH"] = f"{binary.parent}:{env.get('PATH', '')}"
    proc = MeasuredProcess(
        name,
        [str(binary), "--config", str(config), "--host", HOST, "--port", str(port), "--num_workers", str(workers)],
        workdir / f"{name}.log",
        env=env,
    )
    target = Target(name, f"http://{HOST}:{port}/v1", proc, proc, workers)
    target.startup_s = await wait_ready(target.base_url, proc, timeout_s)
    return target


# --------------------------------------------------------------------------- gateway


async def start_gateway(
    upstream_url: str,
    workers: int,
    workdir: Path,
    admin_url: str | None,
    db_prefix: str,
    timeout_s: float,
    variant: str | None = None,
    sections: dict[str, Any] | None = None,
) -> Target:
    """A gateway at its defaults, or (variant) with the feature `sections` of feature_config."""
    name = f"gateway-{workers}w" + (f"-{variant}" if variant else "")
    data_dir = workdir / name
    data_dir.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {}
    db_name = None
    if admin_url:
        db_name = f"{db_prefix}_gw{workers}" + (f"_{variant}" if variant else "")
        config["database_url"] = recreate_database(admin_url, db_name)
    config |= {
        "data_dir": str(data_dir),
        "auth": {"mode": "open"},
        "model_list": [
            {
                "model_name": MODEL,
                "litellm_params": {"model": f"openai/{MODEL}", "api_base": upstream_url, "api_key": "sk-fake"},
            }
        ],
    }
    config |= dict(sections or {})
    path = write_config(workdir / f"{name}.yaml", config)
    db_upgrade(path)
    proc, root = harness.start_gateway(path, workdir, name=name, workers=workers, measured=True, ready_timeout=None)
    assert isinstance(proc, MeasuredProcess)
    target = Target(name, f"{root}/v1", proc, proc, workers, database=db_name)
    target.startup_s = await wait_ready(target.base_url, proc, timeout_s)
    return target


def start_collector(workdir: Path, procs: list[MeasuredProcess]) -> str:
    """The OTLP/HTTP collector of bench.tracing_overhead in its own process; its base URL."""
    port = free_port()
    collector = MeasuredProcess(
        "collector",
        [sys.executable, "-m", "bench.tracing_overhead", "--collector", str(port)],
        workdir / "collector.log",
    )
    procs.append(collector)
    return f"http://{HOST}:{port}"


async def wait_collector(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/count", timeout=2):
                return
        except OSError:
            await asyncio.sleep(0.2)
    raise RuntimeError(f"the OTLP collector at {url} did not start in {timeout_s:.0f} s")


# --------------------------------------------------------------------------- measuring


async def validate(target: Target, expected_events: int | None) -> int:
    """One non-streamed and one streamed call with the answer read in full; returns the stream's
    number of SSE events, which must match the direct upstream's (the same 20 chunks)."""
    single = LoadClient(endpoint(target.base_url, False), 1)
    sample = await single.one(keep_body=True)
    single.close()
    if not sample.ok:
        raise RuntimeError(f"{target.name}: non-streamed call answered {sample.status}: {sample.body_tail[:300]!r}")
    answer = json.loads(sample.body_tail)
    if not answer.get("choices", [{}])[0].get("message", {}).get("content"):
        raise RuntimeError(f"{target.name}: non-streamed answer has no content: {sample.body_tail[:300]!r}")
    streaming = LoadClient(endpoint(target.base_url, True), 1)
    sample = await streaming.one(keep_body=True)
    streaming.close()
    if not sample.ok:
        raise RuntimeError(f"{target.name}: streamed call answered {sample.status}: {sample.body_tail[-300:]!r}")
    events = sample.body_tail.count(b"data:")
    if expected_events is not None and events != expected_events:
        log(f"note: {target.name} streams {events} SSE events, the upstream {expected_events}")
    return events


async def run_phase(
    target: Target, upstream: MeasuredProcess, phase: str, concurrency: int, stream: bool, sizes: Sizes
) -> dict[str, Any]:
    client = target.client(phase, concurrency, stream)
    if concurrency == 1:
        count, duration, min_count = (sizes.c1_stream_requests if stream else sizes.c1_requests), None, 0
    else:
        count, duration, min_count = sizes.c32_max_requests, sizes.c32_seconds, sizes.c32_min_requests
    await client.prepare()
    cpu_before = target.cpu_proc.cpu_seconds()
    upstream_before = upstream.cpu_seconds()
    client_before = time.process_time()
    samples, elapsed = await client.run(count, duration, min_count=min_count, max_s=PHASE_MAX_S)
    client_cpu = time.process_time() - client_before
    cpu = cpu_delta(cpu_before, target.cpu_proc.cpu_seconds())
    upstream_cpu = cpu_delta(upstream_before, upstream.cpu_seconds())
    good = [s for s in samples if s.ok]
    totals = sorted(s.total for s in good)
    ttfbs = sorted(s.ttfb for s in good)
    n = len(samples)
    errors = n - len(good)
    example_error = next((f"{s.status} {s.body_tail[:120]!r}" for s in samples if not s.ok), None)
    return {
        "n": n,
        "errors": errors,
        "example_error": example_error,
        "elapsed_s": elapsed,
        "rps": len(good) / elapsed if elapsed > 0 else float("nan"),
        "p50_ms": percentile(totals, 0.5) * 1e3,
        "p99_ms": percentile(totals, 0.99) * 1e3,
        "ttfb_p50_ms": percentile(ttfbs, 0.5) * 1e3,
        "ttfb_p99_ms": percentile(ttfbs, 0.99) * 1e3,
        "cpu_ms_per_req": cpu / n * 1e3 if n else float("nan"),
        "upstream_cpu_ms_per_req": upstream_cpu / n * 1e3 if n else float("nan"),
        "client_cpu_ms_per_req": client_cpu / n * 1e3 if n else float("nan"),
        "_totals": [s.total for s in good],
        "_ttfbs": [s.ttfb for s in good],
    }


async def warm_up(target: Target, upstream: MeasuredProcess, sizes: Sizes) -> None:
    warm = Sizes(
        rounds=1,
        c1_requests=30,
        c1_stream_requests=10,
        c32_seconds=min(0.5, sizes.c32_seconds),
        c32_max_requests=2000,
        c32_min_requests=64,
        pg_calls=0,
    )
    for phase, concurrency, stream in PHASES:
        await run_phase(target, upstream, phase, concurrency, stream, warm)


async def measure_rounds(
    targets: list[Target], upstream: MeasuredProcess, sizes: Sizes
) -> dict[str, dict[str, list[dict]]]:
    results: dict[str, dict[str, list[dict]]] = {p: {t.name: [] for t in targets} for p, _, _ in PHASES}
    for round_index in range(sizes.rounds):
        shift = round_index % len(targets)
        order = targets[shift:] + targets[:shift]  # rotate, so that no target always goes first
        log(f"round {round_index + 1}/{sizes.rounds}: {', '.join(t.name for t in order)}")
        for phase, concurrency, stream in PHASES:
            for target in order:
                if target.failed:
                    continue
                if target.proc is not None and not target.proc.alive():
                    target.failed = (
                        f"exited with status {target.proc.returncode} during the run; "
                        f"log {target.proc.log_path}:\n{tail(target.proc.log_path)}"
                    )
                    log(f"{target.name} {target.failed}")
                    continue
                result = await run_phase(target, upstream, phase, concurrency, stream, sizes)
                result["round"] = round_index
                results[phase][target.name].append(result)
                if result["errors"]:
                    log(
                        f"  {target.name} {phase}: {result['errors']}/{result['n']} errors, "
                        f"e.g. {result['example_error']}"
                    )
                if result["n"] and result["errors"] == result["n"]:
                    target.failed = f"every request of phase {phase} failed, e.g. {result['example_error']}"
        brief = "; ".join(
            f"{t.name} {results['c1'][t.name][-1]['p50_ms']:.2f} ms/{results['c32'][t.name][-1]['rps']:.0f} rps"
            for t in targets
            if results["c1"][t.name] and results["c32"][t.name]
        )
        log(f"  c1 p50 / c32 req/s: {brief}")
    return results


def summarize(results: dict[str, dict[str, list[dict]]], targets: list[Target]) -> dict[str, dict[str, dict]]:
    """Per phase and target: medians over rounds, and the latency added over the direct call
    of the same round."""
    summary: dict[str, dict[str, dict]] = {}
    for phase, _, _ in PHASES:
        summary[phase] = {}
        base_by_round = {r["round"]: r for r in results[phase].get(BASELINE, [])}
        for target in targets:
            rounds = results[phase].get(target.name, [])
            if not rounds:
                continue
            entry: dict[str, Any] = {}
            for key in (
                "p50_ms",
                "p99_ms",
                "ttfb_p50_ms",
                "ttfb_p99_ms",
                "rps",
                "cpu_ms_per_req",
                "upstream_cpu_ms_per_req",
                "client_cpu_ms_per_req",
            ):
                entry[key] = median([r[key] for r in rounds])
            totals = sorted(t for r in rounds for t in r["_totals"])
            entry["pooled_p50_ms"] = percentile(totals, 0.5) * 1e3
            entry["pooled_p99_ms"] = percentile(totals, 0.99) * 1e3
            entry["requests"] = sum(r["n"] for r in rounds)
            entry["errors"] = sum(r["errors"] for r in rounds)
            if base_by_round and target.name != BASELINE:
                for key in ("p50_ms", "p99_ms", "ttfb_p50_ms"):
                    diffs = [r[key] - base_by_round[r["round"]][key] for r in rounds if r["round"] in base_by_round]
                    entry[f"added_{key}"] = median(diffs)
            summary[phase][target.name] = entry
    return summary


# --------------------------------------------------------------------------- PostgreSQL


async def count_rows(conn: Any) -> int:
    cursor = await conn.execute("SELECT count(*) FROM calls")
    row = await cursor.fetchone()
    return int(row[0])


async def postgres_cpu(conn: Any) -> dict[int, float]:
    """CPU seconds of each PostgreSQL backend serving this database (the gateway's connections),
    by pid; the local server runs on this machine."""
    cursor = await conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    out = {}
    for (pid,) in await cursor.fetchall():
        try:
            times = psutil.Process(pid).cpu_times()
            out[pid] = times.user + times.system
        except psutil.Error:
            continue
    return out


async def settled_count(conn: Any, timeout_s: float = 30.0) -> int:
    """The row count once it stopped moving (earlier calls shipped) for a second."""
    deadline = time.perf_counter() + timeout_s
    last = await count_rows(conn)
    stable_since = time.perf_counter()
    while time.perf_counter() < deadline:
        await asyncio.sleep(0.1)
        now = await count_rows(conn)
        if now != last:
            last, stable_since = now, time.perf_counter()
        elif time.perf_counter() - stable_since >= 1.0:
            break
    return last


async def wait_for_rows(
    conn: Any, goal: int, timeout_s: float, interval_s: float = 0.01
) -> tuple[list[tuple[float, int]], bool]:
    samples: list[tuple[float, int]] = []
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        count = await count_rows(conn)
        samples.append((time.perf_counter(), count))
        if count >= goal:
            return samples, True
        await asyncio.sleep(interval_s)
    return samples, False


def steady_rate(samples: list[tuple[float, int]], start_count: int, goal: int) -> float:
    """Rows/s between 10% and 90% of the way from start_count to goal."""
    span = goal - start_count
    lo = next((s for s in samples if s[1] >= start_count + 0.1 * span), None)
    hi = next((s for s in samples if s[1] >= start_count + 0.9 * span), None)
    if lo is None or hi is None or hi[0] <= lo[0]:
        return float("nan")
    return (hi[1] - lo[1]) / (hi[0] - lo[0])


async def measure_recording(target: Target, db_url: str, calls: int, lock_test: bool) -> dict[str, Any]:
    import psycopg

    out: dict[str, Any] = {"target": target.name, "calls": calls}
    conn = await psycopg.AsyncConnection.connect(db_url, autocommit=True, connect_timeout=5)
    try:
        # 1. Sustained: fire `calls` at concurrency 32 and watch the rows land.
        baseline = await settled_count(conn)
        client = LoadClient(endpoint(target.base_url, False), 32)
        poll: list[tuple[float, int]] = []
        firing = True

        async def poller() -> None:
            while firing:
                poll.append((time.perf_counter(), await count_rows(conn)))
                await asyncio.sleep(0.05)

        pg_before = await postgres_cpu(conn)
        poll_task = asyncio.create_task(poller())
        await client.prepare()
        samples, _ = await client.run(calls, duration_s=300)
        t_start = min(s.start for s in samples if s.ok) if any(s.ok for s in samples) else time.perf_counter()
        t_fired = time.perf_counter()
        firing = False
        await poll_task
        ok = sum(1 for s in samples if s.ok)
        at_fired = await count_rows(conn)
        rows, complete = await wait_for_rows(conn, baseline + ok, timeout_s=120)
        t_done = rows[-1][0]
        pg_after = await postgres_cpu(conn)
        pg_cpu = sum(pg_after[pid] - pg_before[pid] for pid in pg_after if pid in pg_before)
        out["sustained"] = {
            "ok": ok,
            "errors": len(samples) - ok,
            "complete": complete,
            "recorded": rows[-1][1] - baseline,
            "fire_rps": ok / (t_fired - t_start),
            "recorded_during_load_per_s": (at_fired - baseline) / (t_fired - t_start),
            "lag_after_last_answer_s": t_done - t_fired,
            "end_to_end_per_s": (rows[-1][1] - baseline) / (t_done - t_start),
            "postgres_cpu_ms_per_call": pg_cpu / ok * 1e3 if ok else float("nan"),
        }
        log(f"  sustained: {out['sustained']}")

        # 2. Backlog: hold inserts into `calls` with a table lock while the calls are answered and
        # journaled, release it, and time how fast the shipper drains what piled up.
        if lock_test:
            baseline = await settled_count(conn)
            locker = await psycopg.AsyncConnection.connect(db_url, autocommit=False, connect_timeout=5)
            try:
                await locker.execute("SET idle_in_transaction_session_timeout = '300s'")
                await locker.execute("SET lock_timeout = '10s'")
                await locker.execute("LOCK TABLE calls IN EXCLUSIVE MODE")  # blocks writes, not reads
                await client.prepare()
                samples, _ = await client.run(calls, duration_s=300)
                ok = sum(1 for s in samples if s.ok)
                await asyncio.sleep(1.0)  # let the shipper reach the lock with what it has
                held = await count_rows(conn) - baseline
            finally:
                t_release = time.perf_counter()
                await locker.rollback()
                await locker.close()
            rows, complete = await wait_for_rows(conn, baseline + ok, timeout_s=120)
            first = next((t for t, c in rows if c > baseline + held), rows[-1][0])
            drained = rows[-1][1] - baseline - held
            out["backlog"] = {
                "ok": ok,
                "errors": len(samples) - ok,
                "rows_shipped_while_locked": held,
                "complete": complete,
                "drain_s": rows[-1][0] - t_release,
                "first_rows_after_s": first - t_release,
                "drain_per_s": drained / (rows[-1][0] - t_release) if rows[-1][0] > t_release else float("nan"),
                "steady_drain_per_s": steady_rate(rows, baseline + held, baseline + ok),
            }
            log(f"  backlog: {out['backlog']}")
        client.close()
    finally:
        await conn.close()
    return out


# --------------------------------------------------------------------------- profiling


def ensure_py_spy(venv: Path) -> Path:
    """py-spy (a sampling profiler, one static binary) in the benchmark's own environment."""
    binary = venv / "bin" / "py-spy"
    if not binary.exists():
        if not (venv / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        log(f"installing py-spy into {venv}")
        subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "py-spy"], check=True, timeout=600
        )
    return binary


BOILERPLATE_FRAMES = (
    "multiprocessing/",
    "uvicorn/_subprocess.py",
    "uvicorn/server.py",
    "uvicorn/supervisors/",
    "uvicorn/_compat.py",
    "asyncio/runners.py",
    "asyncio/base_events.py",
    "(<string>:1)",
)


def summarize_collapsed(path: Path, top: int = 20) -> str:
    """Self and inclusive sample shares per function from py-spy's collapsed-stack output."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    pending = ""
    for line in path.read_text(errors="replace").splitlines():
        # A process name (`--subprocesses`) may hold a newline: a record ends with its count.
        pending += line
        stack, _, count_text = pending.rpartition(" ")
        if not count_text.isdigit():
            pending += " "
            continue
        pending = ""
        # Process names (`process PID:"command line"`) are not frames; a command line may hold ";".
        frames = [f for f in stack.split(";") if not f.startswith("process ") and "--multiprocessing-fork" not in f]
        if not frames:
            continue
        count = int(count_text)
        total += count
        leaf = frames[-1]
        if leaf.startswith("Runner.run (asyncio/runners.py"):
            leaf = "(event loop: waiting in uvloop, or its C code)"
        own[leaf] = own.get(leaf, 0) + count
        for frame in set(frames):
            if not any(marker in frame for marker in BOILERPLATE_FRAMES):
                inclusive[frame] = inclusive.get(frame, 0) + count
    if not total:
        return "(no samples)"
    lines = [f"{total} samples (all processes of the target)", "", "self %   function"]
    lines += [f"{100 * n / total:6.1f}   {f}" for f, n in sorted(own.items(), key=lambda kv: -kv[1])[:top]]
    lines += ["", "total %  function (process start-up frames left out)"]
    lines += [f"{100 * n / total:6.1f}   {f}" for f, n in sorted(inclusive.items(), key=lambda kv: -kv[1])[:top]]
    return "\n".join(lines)


async def profile_target(target: Target, py_spy: Path, seconds: float, out_dir: Path) -> list[Path]:
    """Sample the target's processes with py-spy while it serves one load for `seconds`: c32
    non-streamed (throughput, CPU a call) and c1 streamed (the latency path)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for phase, concurrency, stream in (("c32", 32, False), ("c1-stream", 1, True)):
        stem = out_dir / f"{target.name}-{phase}"
        collapsed = stem.with_suffix(".collapsed.txt")
        assert target.proc is not None
        spy = subprocess.Popen(
            [
                str(py_spy),
                "record",
                "--pid",
                str(target.proc.pid),
                "--subprocesses",
                "--duration",
                str(int(seconds)),
                "--rate",
                "200",
                "--format",
                "raw",
                "--output",
                str(collapsed),
                "--nonblocking",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        await asyncio.sleep(1.0)  # py-spy attaches
        client = LoadClient(endpoint(target.base_url, stream), concurrency)
        await client.run(10**7, duration_s=seconds, max_s=seconds + 5)
        client.close()
        try:
            output = spy.communicate(timeout=seconds + 30)[0].decode(errors="replace")
        except subprocess.TimeoutExpired:
            spy.kill()
            output = spy.communicate()[0].decode(errors="replace")
        if not collapsed.exists():
            log(f"py-spy wrote nothing for {target.name} {phase}: {output[-500:]}")
            continue
        summary = summarize_collapsed(collapsed)
        summary_path = stem.with_suffix(".top.txt")
        summary_path.write_text(summary + "\n")
        written += [collapsed, summary_path]
        log(f"profile of {target.name} under {phase} load ({collapsed}):\n{summary}")
    return written


# --------------------------------------------------------------------------- report


def fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def render(
    args: argparse.Namespace,
    sizes: Sizes,
    targets: list[Target],
    summary: dict,
    recording: dict | None,
    notes: list[str],
    litellm_version: str | None,
) -> str:
    names = [t.name for t in targets]
    parts = [
        f"Command: `python -m bench.gateway_overhead {' '.join(sys.argv[1:])}`".rstrip()
        + ". "
        + machine_line()
        + f" Load average (1 min) {LOAD_AT_START:.1f} at the start, {os.getloadavg()[0]:.1f} at the end: "
        "the machine is shared, so compare targets within this run rather than across runs.",
        "",
        f"Fake upstream `tests/support/fake_upstream.py` (aiohttp, uvloop, one process); LiteLLM proxy "
        f"{litellm_version or '(not run)'} with no database and no master key, default logging; the load client is "
        "`bench/loadgen.py` (keep-alive, raw HTTP/1.1), in its own process. "
        f"{sizes.rounds} interleaved rounds; each round runs every phase on every target in turn "
        f"({sizes.c1_requests} non-streamed and {sizes.c1_stream_requests} streamed calls one at a time, "
        f"then {sizes.c32_seconds} s, and at least {sizes.c32_min_requests} calls, at concurrency 32 of each). "
        "Latency is the time to the last byte "
        "(streams: 20 content chunks); *added* is the target's p50 (p99) minus the direct call's in the "
        "same round, median over rounds; other figures are medians over rounds. CPU is user+system time "
        "of the target's processes, children included, per request.",
    ]

    def row_latency(phase: str, name: str) -> list[Any]:
        e = summary[phase].get(name, {})
        return [fmt(e.get("p50_ms")), fmt(e.get("p99_ms")), fmt(e.get("added_p50_ms")), fmt(e.get("added_p99_ms"))]

    rows = []
    for name in names:
        s = summary["c1-stream"].get(name, {})
        rows.append(
            [
                name,
                *row_latency("c1", name),
                *row_latency("c1-stream", name),
                fmt(s.get("ttfb_p50_ms")),
                fmt(s.get("added_ttfb_p50_ms")),
            ]
        )
    parts += [
        "",
        "**Concurrency 1, latency (ms)**",
        "",
        markdown_table(
            [
                "target",
                "p50",
                "p99",
                "added p50",
                "added p99",
                "stream p50",
                "stream p99",
                "stream added p50",
                "stream added p99",
                "stream first byte p50",
                "first byte added p50",
            ],
            rows,
        ),
    ]

    reference = "litellm-2w" if "litellm-2w" in names else None
    rows = []
    for name in names:
        a, b = summary["c32"].get(name, {}), summary["c32-stream"].get(name, {})
        ratio = [
            fmt(a.get("rps") / summary["c32"][reference]["rps"], 1)
            if reference and a and summary["c32"].get(reference)
            else "–",
            fmt(b.get("rps") / summary["c32-stream"][reference]["rps"], 1)
            if reference and b and summary["c32-stream"].get(reference)
            else "–",
        ]
        rows.append(
            [
                name,
                fmt(a.get("rps"), 0),
                fmt(a.get("p50_ms")),
                fmt(a.get("p99_ms")),
                fmt(a.get("added_p50_ms")),
                fmt(b.get("rps"), 0),
                fmt(b.get("p50_ms")),
                fmt(b.get("p99_ms")),
                fmt(b.get("added_p50_ms")),
                *ratio,
            ]
        )
    parts += [
        "",
        "**Concurrency 32, throughput and latency (ms)**",
        "",
        markdown_table(
            [
                "target",
                "req/s",
                "p50",
                "p99",
                "added p50",
                "stream req/s",
                "stream p50",
                "stream p99",
                "stream added p50",
                f"x {reference or 'litellm-2w'}",
                "stream x",
            ],
            rows,
        ),
    ]

    rows = []
    for t in targets:
        cpu = [fmt(summary[p].get(t.name, {}).get("cpu_ms_per_req")) for p, _, _ in PHASES]
        rows.append(
            [
                t.name + (" (upstream)" if t.name == BASELINE else ""),
                *cpu,
                fmt(t.idle_cpu_ms_per_s, 1),
                fmt(t.rss_bytes / 2**20, 0) if t.rss_bytes else "–",
                fmt(t.startup_s, 1),
            ]
        )
    client_cpu = [fmt(median([summary[p][n]["client_cpu_ms_per_req"] for n in summary[p]]), 3) for p, _, _ in PHASES]
    rows.append(["load client", *client_cpu, "–", "–", "–"])
    parts += [
        "",
        "**CPU ms per request, idle CPU (ms per second), memory (RSS of all processes, MiB) and start-up (s)**",
        "",
        markdown_table(["target", "c1", "c1 stream", "c32", "c32 stream", "idle", "RSS", "start-up"], rows),
    ]

    if recording:
        rows = []
        sustained = recording.get("sustained")
        if sustained:
            rows.append(["sustained: calls answered at c32", f"{sustained['ok']:,} ({sustained['errors']} errors)"])
            rows.append(["answer rate (calls/s)", fmt(sustained["fire_rps"], 0)])
            rows.append(["rows landed during the load (calls/s)", fmt(sustained["recorded_during_load_per_s"], 0)])
            rows.append(
                [
                    "all rows in `calls` after the last answer (s)",
                    fmt(sustained["lag_after_last_answer_s"])
                    + ("" if sustained["complete"] else f" (INCOMPLETE: {sustained['recorded']:,} rows)"),
                ]
            )
            rows.append(["end to end, first call to last row (calls/s)", fmt(sustained["end_to_end_per_s"], 0)])
            rows.append(
                [
                    "CPU of the gateway's PostgreSQL backends a call (ms)",
                    fmt(sustained.get("postgres_cpu_ms_per_call"), 3),
                ]
            )
        backlog = recording.get("backlog")
        if backlog:
            rows.append(
                [
                    "backlog: calls answered while `calls` was locked",
                    f"{backlog['ok']:,} ({backlog['rows_shipped_while_locked']} rows got through the lock)",
                ]
            )
            rows.append(
                [
                    "drain after the lock was released (s)",
                    fmt(backlog["drain_s"]) + ("" if backlog["complete"] else " (INCOMPLETE)"),
                ]
            )
            rows.append(
                [
                    "drain rate (calls/s), whole / steady 10-90%",
                    f"{fmt(backlog['drain_per_s'], 0)} / {fmt(backlog['steady_drain_per_s'], 0)}",
                ]
            )
        parts += [
            "",
            f"**Calls recorded into PostgreSQL ({recording['target']}, local PostgreSQL, "
            f"{recording['calls']:,} calls a test)**",
            "",
            markdown_table(["measure", "value"], rows),
        ]

    gateways = [n for n in names if n.startswith("gateway")]
    if gateways:
        g = gateways[-1]
        rows = []
        c1, c1s = summary["c1"].get(g, {}), summary["c1-stream"].get(g, {})
        rows.append(
            [
                "added p50, c1 (ms)",
                fmt(c1.get("added_p50_ms")),
                f"≤ {GOALS['added_p50_c1_ms']}",
                check(c1.get("added_p50_ms"), GOALS["added_p50_c1_ms"]),
            ]
        )
        rows.append(
            [
                "added p99, c1 (ms)",
                fmt(c1.get("added_p99_ms")),
                f"≤ {GOALS['added_p99_c1_ms']}",
                check(c1.get("added_p99_ms"), GOALS["added_p99_c1_ms"]),
            ]
        )
        rows.append(
            [
                "added p50, c1 stream (ms)",
                fmt(c1s.get("added_p50_ms")),
                f"≤ {GOALS['added_p50_c1_stream_ms']}",
                check(c1s.get("added_p50_ms"), GOALS["added_p50_c1_stream_ms"]),
            ]
        )
        for phase in ("c1", "c32"):
            cpu = summary[phase].get(g, {}).get("cpu_ms_per_req")
            rows.append(
                [
                    f"gateway CPU a request, {phase} (ms)",
                    fmt(cpu),
                    f"≤ {GOALS['cpu_ms_per_request']}",
                    check(cpu, GOALS["cpu_ms_per_request"]),
                ]
            )
        if reference and summary["c32"].get(reference) and summary["c32"].get(g):
            ratio = summary["c32"][g]["rps"] / summary["c32"][reference]["rps"]
            rows.append(
                [
                    f"req/s at c32 vs {reference}",
                    fmt(ratio, 1) + "x",
                    f"≥ {GOALS['throughput_vs_litellm_2w']}x",
                    check(ratio, GOALS["throughput_vs_litellm_2w"], higher=True),
                ]
            )
        if recording and recording.get("backlog"):
            rate = recording["backlog"]["drain_per_s"]
            rows.append(
                [
                    "recorded calls/s shipped into PostgreSQL (backlog drain)",
                    fmt(rate, 0),
                    f"≥ {GOALS['recorded_calls_per_s']:,.0f}",
                    check(rate, GOALS["recorded_calls_per_s"], higher=True),
                ]
            )
        if recording and recording.get("sustained"):
            rate = recording["sustained"]["end_to_end_per_s"]
            sustained = recording["sustained"]
            verdict = check(rate, GOALS["recorded_calls_per_s"], higher=True)
            if verdict == "not met" and sustained["complete"] and sustained["lag_after_last_answer_s"] < 1.0:
                verdict = f"kept up with the answer rate ({fmt(sustained['fire_rps'], 0)}/s)"
            rows.append(
                [
                    "recorded calls/s under load (end to end)",
                    fmt(rate, 0),
                    f"≥ {GOALS['recorded_calls_per_s']:,.0f}",
                    verdict,
                ]
            )
        parts += ["", f"**Targets of issue 2 ({g})**", "", markdown_table(["goal", "reached", "target", ""], rows)]

    if notes:
        parts += ["", "Notes:", ""] + [f"- {note}" for note in notes]
    return "\n".join(parts) + "\n"


def check(value: float | None, goal: float, higher: bool = False) -> str:
    if value is None or value != value:
        return "–"
    return "met" if (value >= goal if higher else value <= goal) else "not met"


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 short round; writes nothing by default")
    parser.add_argument(
        "--targets",
        default="direct,gateway,litellm",
        help="comma-separated: direct, gateway, litellm (default all three)",
    )
    parser.add_argument("--rounds", type=int, default=0, help="interleaved rounds (default 7, --quick 1)")
    parser.add_argument("--gateway-workers", default="2", help="comma-separated worker counts (default 2)")
    parser.add_argument(
        "--features",
        default="",
        help=f"comma-separated feature variants, one gateway target each: {', '.join(VARIANTS)} (default none)",
    )
    parser.add_argument("--litellm-workers", default="1,2", help="comma-separated worker counts (default 1,2)")
    parser.add_argument(
        "--litellm-venv",
        type=Path,
        default=REPO / ".bench-venv",
        help="virtual environment for the LiteLLM proxy and py-spy, created on demand",
    )
    parser.add_argument("--litellm-spec", default="litellm[proxy]", help="what pip installs into that environment")
    parser.add_argument(
        "--pg-admin-url",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="PostgreSQL to create the benchmark databases in ('' for the gateway's embedded one)",
    )
    parser.add_argument("--db-prefix", default="apprentice_bench", help="benchmark databases are PREFIX_gwN")
    parser.add_argument("--keep-db", action="store_true", help="leave the benchmark databases after the run")
    parser.add_argument("--pg-calls", type=int, default=0, help="calls per PostgreSQL test (default 10000, quick 500)")
    parser.add_argument("--no-lock-test", action="store_true", help="skip the backlog-drain test (table lock)")
    parser.add_argument("--start-timeout", type=float, default=120.0, help="seconds a server may take to start")
    parser.add_argument(
        "--write",
        dest="write",
        action="store_true",
        default=None,
        help="write docs/benchmarks.md (default unless --quick)",
    )
    parser.add_argument("--no-write", dest="write", action="store_false")
    parser.add_argument("--json", type=Path, help="also dump the raw per-round figures here")
    parser.add_argument(
        "--profile",
        type=float,
        default=0,
        metavar="SECONDS",
        help="after the rounds, sample the gateway with py-spy for SECONDS under c32 and under "
        "c1-stream load (py-spy is installed into --litellm-venv)",
    )
    parser.add_argument(
        "--profile-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "apprentice-bench-profile",
        help="where the profiles go (collapsed stacks and a top-functions summary)",
    )
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> int:
    global LOAD_AT_START
    LOAD_AT_START = os.getloadavg()[0]
    sizes = Sizes.for_args(args)
    wanted = {t.strip() for t in args.targets.split(",") if t.strip()}
    unknown = wanted - {"direct", "gateway", "litellm"}
    if unknown:
        raise SystemExit(f"unknown targets: {', '.join(sorted(unknown))} (choose from direct, gateway, litellm)")
    if "direct" not in wanted:
        log("note: without the direct target no latency can be called 'added'")
    workdir = Path(tempfile.mkdtemp(prefix="apprentice-bench-"))
    log(f"work directory {workdir} (configs and server logs)")
    procs: list[MeasuredProcess] = []
    targets: list[Target] = []
    notes: list[str] = []
    skipped: list[str] = []
    databases: list[str] = []
    admin_url = args.pg_admin_url or None
    litellm_version = None
    recording = None
    try:
        upstream_port = free_port()
        upstream = MeasuredProcess(
            "upstream",
            [sys.executable, "-m", "tests.support.fake_upstream", "--host", HOST, "--port", str(upstream_port)],
            workdir / "upstream.log",
        )
        procs.append(upstream)
        upstream_url = f"http://{HOST}:{upstream_port}/v1"
        direct = Target(BASELINE, upstream_url, None, upstream)
        direct.startup_s = await wait_ready(upstream_url, upstream, 30)
        if "direct" in wanted:
            targets.append(direct)

        if "gateway" in wanted:
            reason = gateway_unavailable()
            if reason is None and admin_url:
                try:
                    pg_connect(admin_url).close()
                except Exception as exc:  # noqa: BLE001
                    notes.append(
                        f"PostgreSQL at {admin_url} unreachable ({exc}); the gateway used its embedded "
                        "database and the recording test was skipped"
                    )
                    admin_url = None
            if reason:
                skipped.append(f"gateway: not measured: {reason}")
                log(f"GATEWAY NOT RUNNABLE: {reason}")
            else:
                for workers in [int(w) for w in args.gateway_workers.split(",") if w.strip()]:
                    log(f"starting gateway with {workers} worker(s)")
                    try:
                        target = await start_gateway(
                            upstream_url, workers, workdir, admin_url, args.db_prefix, args.start_timeout
                        )
                    except Exception as exc:  # noqa: BLE001 - say why and go on with the others
                        skipped.append(f"gateway-{workers}w: did not start: {exc}")
                        log(f"GATEWAY DID NOT START: {exc}")
                        if admin_url:
                            databases.append(f"{args.db_prefix}_gw{workers}")
                        continue
                    procs.append(target.proc)  # type: ignore[arg-type]
                    if target.database:
                        databases.append(target.database)
                    targets.append(target)
                    log(f"  {target.name} ready in {target.startup_s:.1f} s at {target.base_url}")
                variants = [v.strip() for v in args.features.split(",") if v.strip()]
                collector_url = start_collector(workdir, procs) if variants else ""
                if variants:
                    await wait_collector(collector_url, 30)
                workers = int(args.gateway_workers.split(",")[-1])
                for variant in variants:
                    sections = feature_config(variant, collector_url)
                    log(f"starting gateway with {workers} worker(s), features {variant}: {json.dumps(sections)}")
                    try:
                        target = await start_gateway(
                            upstream_url,
                            workers,
                            workdir,
                            admin_url,
                            args.db_prefix,
                            args.start_timeout,
                            variant=variant,
                            sections=sections,
                        )
                    except Exception as exc:  # noqa: BLE001 - say why and go on with the others
                        skipped.append(f"gateway-{workers}w-{variant}: did not start: {exc}")
                        log(f"GATEWAY DID NOT START: {exc}")
                        if admin_url:
                            databases.append(f"{args.db_prefix}_gw{workers}_{variant}")
                        continue
                    procs.append(target.proc)  # type: ignore[arg-type]
                    if target.database:
                        databases.append(target.database)
                    targets.append(target)
                    log(f"  {target.name} ready in {target.startup_s:.1f} s at {target.base_url}")

        litellm_workers = [int(w) for w in args.litellm_workers.split(",") if w.strip()] if "litellm" in wanted else []
        if litellm_workers:
            try:
                binary, litellm_version = ensure_litellm_venv(args.litellm_venv, args.litellm_spec)
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                skipped.append(f"litellm: no proxy to run: {exc}")
                log(f"LITELLM NOT AVAILABLE: {exc}")
                litellm_workers = []
            for workers in litellm_workers:
                log(f"starting LiteLLM proxy {litellm_version} with {workers} worker(s)")
                try:
                    target = await start_litellm(binary, upstream_url, workers, workdir, args.start_timeout)
                except Exception as exc:  # noqa: BLE001
                    skipped.append(f"litellm-{workers}w: did not start: {exc}")
                    log(f"LITELLM DID NOT START: {exc}")
                    continue
                procs.append(target.proc)  # type: ignore[arg-type]
                targets.append(target)
                log(f"  {target.name} ready in {target.startup_s:.1f} s at {target.base_url}")

        if not targets:
            raise SystemExit("no target could be started:\n" + "\n".join(skipped))

        expected_events = await validate(direct, None)
        for target in targets:
            events = await validate(target, expected_events)
            log(f"{target.name}: answers checked (stream of {events} SSE events); warming up")
            await warm_up(target, upstream, sizes)
            target.rss_bytes = target.cpu_proc.rss_bytes()

        # What each target burns with no traffic (timers, shippers): it is part of the CPU per
        # request at concurrency 1, where requests are few per second.
        idle_window = 0.5 if args.quick else 2.0
        before = {t.name: t.cpu_proc.cpu_seconds() for t in targets}
        await asyncio.sleep(idle_window)
        for target in targets:
            target.idle_cpu_ms_per_s = cpu_delta(before[target.name], target.cpu_proc.cpu_seconds()) / idle_window * 1e3

        results = await measure_rounds(targets, upstream, sizes)
        summary = summarize(results, targets)
        for target in targets:
            target.close()
            if target.failed:
                skipped.append(f"{target.name}: failed during the run: {target.failed}")

        gateway_targets = [t for t in targets if t.name.startswith("gateway") and not t.failed]
        if args.profile > 0:
            py_spy = ensure_py_spy(args.litellm_venv)
            for target in gateway_targets or [t for t in targets if t.proc is not None and not t.failed]:
                await profile_target(target, py_spy, args.profile, args.profile_dir)
        if gateway_targets and admin_url:
            g = gateway_targets[-1]
            log(f"recording test on {g.name}: {sizes.pg_calls} calls at concurrency 32")
            try:
                recording = await measure_recording(
                    g, database_url(admin_url, g.database or ""), sizes.pg_calls, lock_test=not args.no_lock_test
                )
            except Exception as exc:  # noqa: BLE001
                skipped.append(f"recording test failed: {exc!r}")
                log(f"RECORDING TEST FAILED: {exc!r}")

        for phase in summary:
            for name, entry in summary[phase].items():
                if entry["errors"]:
                    notes.append(f"{name} {phase}: {entry['errors']} of {entry['requests']} requests failed")
        notes += skipped
        markdown = render(args, sizes, targets, summary, recording, notes, litellm_version)
        print("\n" + markdown)
        if args.json:
            raw = {
                "sizes": sizes.__dict__,
                "summary": summary,
                "recording": recording,
                "notes": notes,
                "rounds": {
                    p: {n: [{k: v for k, v in r.items() if not k.startswith("_")} for r in rs] for n, rs in by.items()}
                    for p, by in results.items()
                },
            }
            args.json.write_text(json.dumps(raw, indent=2, default=str))
        write = (not args.quick) if args.write is None else args.write
        if write and skipped and args.write is None:
            log("not writing docs/benchmarks.md: some targets were not measured (pass --write to write anyway)")
        elif write:
            # A run of feature variants gets a section of its own: it does not replace the
            # figures of the gateway at its defaults.
            title = f"{SECTION_TITLE}: each feature on and off" if args.features.strip() else SECTION_TITLE
            write_section(title, markdown)
            log(f"wrote section '{title}' of docs/benchmarks.md")
        return 2 if skipped else 0
    finally:
        for target in targets:
            target.close()
        for proc in reversed(procs):
            proc.stop()
        if admin_url and not args.keep_db:
            for name in databases:
                drop_database(admin_url, name)
        if skipped:
            log(f"configs and logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def terminate(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(run(args))
    return uvloop.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
