"""Does exploration add client latency? Client p50 / p99 with exploration off and on, side by side,
with the policy's endpoint at least 70% busy with client calls alone.

The endpoint is the local inference server (learner/serving, priority scheduling) on a tiny
random model with SmolLM2's architecture and tokenizer (tests/learner/tiny_model.py: hundreds
of tokens a second on a CPU, so a run of seconds holds hundreds of calls), run in this process
so that its engine can be sampled: "busy" is the share of 2 ms samples in which the engine
had a batch running. Two gateways in front of it, alike but for `learning.exploration`
(off; on: 2 extra answers per call, a budget that never binds). The load is open-loop:
Poisson arrivals at a rate set from the measured service time so that client calls alone keep
the engine about `--busy` (85%) of the time busy; every call asks for `--max-tokens` tokens
(ignore_eos: a fixed length, so latencies compare). Runs alternate off / on, three of each;
after an "on" run the next one waits until the gateway's exploration queue and the engine are idle.

    python -m bench.exploration_latency            # ~6 minutes; writes its section of docs/benchmarks.md
    python -m bench.exploration_latency --quick    # a smoke run; writes nothing
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.report import machine_line, markdown_table, write_section
from bench.side_by_side import side_by_side
from bench.stats import percentile

TITLE = "Exploration samples: client latency with exploration off and on"
POLICY = "explored"
MESSAGES = [{"role": "user", "content": "Write one sentence about the sea."}]


class BusySampler:
    """Samples whether the engine has a batch running, every `interval_s`, in a thread."""

    def __init__(self, engine: Any, interval_s: float = 0.002) -> None:
        self.engine = engine
        self.interval_s = interval_s
        self.samples = 0
        self.busy = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples += 1
            self.busy += 1 if self.engine.num_running else 0
            time.sleep(self.interval_s)

    def __enter__(self) -> BusySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def share(self) -> float:
        return self.busy / self.samples if self.samples else 0.0


def start_server(model_dir: Path) -> tuple[Any, str, Any]:
    """The local inference server in a thread of this process (as `apprentice serve-model` runs it)."""
    import uvicorn

    from apprentice.processes import free_port
    from learner.serving.app import build_app, create_server_state

    state = create_server_state(str(model_dir), served_model_name="tiny-base", threads=1)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(state), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 120
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the local inference server did not start")
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}/v1", state


def body(max_tokens: int) -> dict[str, Any]:
    return {"model": POLICY, "messages": MESSAGES, "max_tokens": max_tokens, "ignore_eos": True}


async def service_time(client: httpx.AsyncClient, url: str, max_tokens: int, count: int) -> float:
    """Median seconds of one call through the gateway on an idle endpoint."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        answer = await client.post(url + "/chat/completions", json=body(max_tokens))
        answer.raise_for_status()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def open_loop(
    client: httpx.AsyncClient, url: str, rate: float, duration_s: float, max_tokens: int
) -> list[float]:
    """Poisson arrivals at `rate` a second for `duration_s`; each call's latency in ms."""
    latencies: list[float] = []
    failures: list[str] = []

    async def one() -> None:
        started = time.perf_counter()
        answer = await client.post(url + "/chat/completions", json=body(max_tokens))
        if answer.status_code != 200:
            failures.append(answer.text[:200])
            return
        latencies.append((time.perf_counter() - started) * 1000.0)

    tasks = []
    rng = random.Random(0)
    end = time.perf_counter() + duration_s
    while time.perf_counter() < end:
        tasks.append(asyncio.create_task(one()))
        await asyncio.sleep(rng.expovariate(rate))
    await asyncio.gather(*tasks)
    if failures:
        raise RuntimeError(f"{len(failures)} calls failed, e.g. {failures[0]}")
    return latencies


def counter(metrics: str, name: str) -> float:
    match = re.search(rf'^{name}{{policy="{POLICY}"}} ([0-9.e+]+)$', metrics, re.M)
    return float(match.group(1)) if match else 0.0


class SimulatedMeter:
    """The simulated endpoint's busy share over a run (its own count of busy time)."""

    def __init__(self, endpoint: Any) -> None:
        self.endpoint = endpoint
        self.share = 0.0

    def __enter__(self) -> SimulatedMeter:
        self._busy, self._start = self.endpoint.busy_s, time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.share = (self.endpoint.busy_s - self._busy) / max(time.monotonic() - self._start, 1e-9)


class Target:
    """The endpoint under the gateways: its URL, a busy meter, its abandoned count, idleness."""

    def __init__(self, url: str, meter: Any, abandoned: Any, busy_now: Any, describe: str) -> None:
        self.url, self.meter, self.abandoned, self.busy_now, self.describe = url, meter, abandoned, busy_now, describe


async def simulated_target(step_ms: float) -> tuple[Target, Any]:
    from aiohttp import web

    from apprentice.processes import free_port
    from bench.priority_endpoint import PriorityEndpoint

    endpoint = PriorityEndpoint(step_s=step_ms / 1000.0)
    runner = web.AppRunner(endpoint.app())
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    target = Target(
        f"http://127.0.0.1:{port}/v1",
        lambda: SimulatedMeter(endpoint),
        lambda: endpoint.abandoned,
        lambda: bool(endpoint.running or endpoint.waiting),
        f"a simulated endpoint (bench/priority_endpoint.py: continuous batching, {step_ms:.0f} ms a decode "
        "step as a GPU would take whatever the CPU does, the local server's priority rules)",
    )
    return target, runner.cleanup


def local_target() -> tuple[Target, Any]:
    from tests.learner.tiny_model import build_tiny_model

    model_dir = build_tiny_model(Path(tempfile.mkdtemp(prefix="bench-exploration-model-")) / "tiny")
    server, endpoint, state = start_server(model_dir)
    engine = state.engine
    target = Target(
        endpoint,
        lambda: BusySampler(engine),
        lambda: engine.stats.abandoned,
        lambda: bool(engine.num_running),
        "the local inference server (priority scheduling) on a tiny random model with SmolLM2's "
        "architecture, in the bench's process (its decode steps take CPU time on the shared cores)",
    )

    async def stop() -> None:
        server.should_exit = True

    return target, stop


async def settle(client: httpx.AsyncClient, gateway: str, target: Target) -> None:
    """Wait until the gateway's exploration queue is empty and the endpoint idle."""
    admin = gateway.removesuffix("/v1") + f"/v1/admin/policies/{POLICY}/exploration"
    for _ in range(600):
        report = (await client.get(admin)).json()
        queued = (report.get("this_process") or {}).get("queued", 0)
        if not queued and not target.busy_now():
            await asyncio.sleep(0.3)
            if not target.busy_now():
                return
        await asyncio.sleep(0.1)


async def run(args: argparse.Namespace) -> str:
    if args.endpoint == "simulated":
        target, stop = await simulated_target(args.step_ms)
    else:
        target, stop = local_target()
    endpoint = target.url
    policy: dict[str, Any] = {"name": POLICY, "base_model": "tiny-base", "endpoints": [endpoint], "temperature": 1.0}
    exploring = {
        **policy,
        "learning": {"exploration": {"extra_answers": args.extra_answers, "budget_tokens_per_hour": 100_000_000}},
    }
    load = os.getloadavg()[0]
    rows: list[list[object]] = []
    try:
        async with side_by_side("exploration") as stack:
            # the fake upstream's model answers the harness's readiness probe
            probe = [
                {
                    "model_name": "fake-model",
                    "litellm_params": {"model": "openai/fake-model", "api_base": stack.upstream_url},
                }
            ]
            gateways = {
                "off": await stack.add_gateway("exploration off", {"model_list": probe, "policies": [policy]}),
                "on": await stack.add_gateway("exploration on", {"model_list": probe, "policies": [exploring]}),
            }
            async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=200)) as client:
                await service_time(client, gateways["off"], args.max_tokens, 5)  # warm-up
                seconds = await service_time(client, gateways["off"], args.max_tokens, 15)
                # The service time through the gateway overstates the engine's share of it (HTTP, two
                # hops, a busy machine): one calibration run at that rate, then the rate scaled so
                # that client calls alone keep the engine `busy` of the time busy.
                first = args.busy / seconds
                with target.meter() as sampler:
                    await open_loop(client, gateways["off"], first, args.duration / 2, args.max_tokens)
                rate = min(first * args.busy / max(sampler.share, 0.05), 4 * first)
                await settle(client, gateways["off"], target)
                for number in range(1, args.runs + 1):
                    for mode, url in gateways.items():
                        before = (await client.get(url.removesuffix("/v1") + "/metrics")).text
                        abandoned = target.abandoned()
                        with target.meter() as sampler:
                            latencies = await open_loop(client, url, rate, args.duration, args.max_tokens)
                        after = (await client.get(url.removesuffix("/v1") + "/metrics")).text
                        answers = counter(after, "apprentice_exploration_answers_total") - counter(
                            before, "apprentice_exploration_answers_total"
                        )
                        rows.append(
                            [
                                number,
                                mode,
                                len(latencies),
                                f"{statistics.median(latencies):.1f}",
                                f"{percentile(latencies, 0.99):.1f}",
                                f"{sampler.share:.0%}",
                                int(answers),
                                target.abandoned() - abandoned,
                            ]
                        )
                        print(rows[-1], flush=True)
                        await settle(client, url, target)
    finally:
        await stop()
    load_end = os.getloadavg()[0]
    table = markdown_table(
        [
            "run",
            "exploration",
            "client calls",
            "client p50 ms",
            "client p99 ms",
            "endpoint busy",
            "unserved answers recorded",
            "exploration requests abandoned",
        ],
        rows,
    )
    return f"""Command: `python -m bench.exploration_latency --endpoint {args.endpoint}` ({machine_line()})

The policy's endpoint is {target.describe}; two gateways in front of it differ only in
`learning.exploration` (on: {args.extra_answers} extra answers per call, a budget that never binds).
Open-loop Poisson arrivals at {rate:.2f} calls/s, every call {args.max_tokens} tokens (a median
service time of {seconds * 1000:.0f} ms alone through the gateway), the rate set by a calibration
run for about {args.busy:.0%} busy from client calls alone (the "off" rows show what it reached);
{args.duration:.0f} s a run, runs alternating off / on. "Endpoint busy" is the share of the run's
time with a batch running, exploration's included. Load average at start / end:
{load:.2f} / {load_end:.2f} on a shared 2-core machine (other engineers' work included).

{table}

Exploration fills the endpoint's idle time (busy rises towards 100%) and gives way: a client
call that arrives while exploration runs abandons it (the last column), so client calls never
share a decode step with it; but it may have to wait for the end of the step in progress (the
engine is rarely idle when exploring), and the gateway spends CPU building and recording the
extra answers (and, on the local endpoint, the CPU decodes them): what differences remain.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--endpoint", choices=["simulated", "local"], default="simulated")
    parser.add_argument("--step-ms", type=float, default=20.0, help="the simulated endpoint's decode step")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=25.0)
    parser.add_argument("--busy", type=float, default=0.85)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--extra-answers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a smoke run; writes nothing")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.duration = 1, 2.0
    report = asyncio.run(run(args))
    print(report)
    if not args.quick:
        write_section(f"{TITLE} ({args.endpoint} endpoint)", report)


if __name__ == "__main__":
    main()
