"""Time from a training run's end to its adapter serving canary traffic.

Real processes: PostgreSQL (a scratch database), `apprentice serve-model` (SmolLM2-135M-Instruct
unless --model says otherwise) and one gateway with the default `adapter_poll_interval_s`
(1 s). Each trial does what the learner does when a run ends (a succeeded `training_runs`
row and a `candidate` adapter version, LoRA r=8 on all seven projections as the learner
makes them), then runs `promotion_tick` at once, while probe clients call the policy
through the gateway without pause (see `Probes`). Measured per trial:

- commit: from the run's end to the canary transition committed (`promotion_tick`: gates,
  POST /v1/load_lora_adapter, verification via GET /v1/models, the locked transaction);
- of which load: the LoRA load and verification at the endpoint;
- switch: from the commit to the first call the gateway routed to the canary (it re-reads the
  serving versions on the transition's NOTIFY; its 1 s poll is the fallback);
- routed: from the run's end to that first canary-routed call (the headline figure);
- answered: from the run's end to the first answer from the canary a client received.

The canary share is 1.0 here so that the first new trajectory after the switch shows it;
with share s and r new trajectories a second, add about 1/(s*r). When the tick runs on a
schedule instead of right after the run, add up to its period.

    python -m bench.promotion_latency [--model DIR] [--trials 5] [--pg URL]
    python -m bench.promotion_latency --quick     # smoke run (one trial), writes nothing
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
from typing import Any

import httpx
import psycopg

from apprentice.processes import ManagedProcess
from bench.harness import scratch_database, start_gateway, start_model_server, write_config
from bench.report import machine_line, markdown_table, write_section

TITLE = "Promotion: training run end to canary traffic"
ADMIN_KEY = "sk-bench-admin"


def make_adapters(model_dir: str, out: Path, count: int) -> list[Path]:
    """LoRA adapters shaped like the learner's (r=8, alpha=16, all seven projections)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from apprentice.settings import ALL_LINEAR_PROJECTIONS

    paths = []
    for i in range(count):
        torch.manual_seed(i)
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        peft_model = get_peft_model(
            model, LoraConfig(r=8, lora_alpha=16, target_modules=ALL_LINEAR_PROJECTIONS, init_lora_weights=False)
        )
        with torch.no_grad():  # small random B: a working adapter that changes little
            for name, param in peft_model.named_parameters():
                if "lora_B" in name:
                    param.mul_(0.01)
        path = out / f"adapter-{i}"
        peft_model.save_pretrained(path)
        paths.append(path)
    return paths


class Probes:
    """Traffic through the gateway while the trials run.

    - answer probes (`answer_workers`): real one-token chat calls; each answer names the
      adapter that served it (its `model`), so the first canary answer is seen by the client;
    - routing probes (one worker, every `routing_every_s`): chat calls with `max_tokens: 0`,
      which the endpoint refuses at once (400) without queuing behind generation; the gateway
      still routes and records each one (`calls.adapter_version_id`, `created_at` = arrival),
      which timestamps the gateways' switch to within a few tens of milliseconds.
    """

    def __init__(self, base_url: str, policy: str, answer_workers: int = 2, routing_every_s: float = 0.02) -> None:
        self.base_url, self.policy = base_url, policy
        self.answer_workers, self.routing_every_s = answer_workers, routing_every_s
        self.answers: list[tuple[float, float, str]] = []  # (sent, received, model)
        self.durations: list[float] = []
        self.failures = 0
        self._stop = asyncio.Event()

    async def _answers(self) -> None:
        async with httpx.AsyncClient(timeout=120, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
            while not self._stop.is_set():
                sent = time.time()
                body = {
                    "model": self.policy,
                    "max_tokens": 1,
                    "messages": [{"role": "user", "content": f"probe {uuid.uuid4().hex}"}],
                }
                response = await client.post(f"{self.base_url}/chat/completions", json=body)
                if response.status_code == 200:
                    received = time.time()
                    self.answers.append((sent, received, response.json()["model"]))
                    self.durations.append(received - sent)
                else:
                    self.failures += 1
                await asyncio.sleep(random.uniform(0.0, 0.05))

    async def _routing(self) -> None:
        async with httpx.AsyncClient(timeout=120, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
            while not self._stop.is_set():
                body = {
                    "model": self.policy,
                    "max_tokens": 0,
                    "messages": [{"role": "user", "content": f"route {uuid.uuid4().hex}"}],
                }
                await client.post(f"{self.base_url}/chat/completions", json=body)
                await asyncio.sleep(self.routing_every_s)

    def start(self) -> list[asyncio.Task[None]]:
        tasks = [asyncio.create_task(self._answers()) for _ in range(self.answer_workers)]
        return tasks + [asyncio.create_task(self._routing())]

    def stop(self) -> None:
        self._stop.set()

    async def first_answer(self, model: str, after: float, timeout: float = 60.0) -> float:
        deadline = time.time() + timeout
        while time.time() < deadline:
            hits = [received for sent, received, served in self.answers if served == model and sent >= after]
            if hits:
                return min(hits)
            await asyncio.sleep(0.01)
        raise TimeoutError(f"no call answered by {model}")


def first_routed(db: psycopg.Connection, version_id: uuid.UUID, timeout: float = 30.0) -> float:
    """Arrival time (gateway clock) of the first call the gateway routed to the version."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        row = db.execute(
            "SELECT extract(epoch FROM min(created_at)) FROM calls WHERE adapter_version_id = %s", (version_id,)
        ).fetchone()
        if row[0] is not None:
            return float(row[0])
        time.sleep(0.05)
    raise TimeoutError("no call routed to the canary was recorded")


async def trials(
    database_url: str, settings: Any, gateway_url: str, adapters: list[Path], db: psycopg.Connection
) -> tuple[list[dict[str, float]], dict[str, float]]:
    from apprentice.promotion import lifecycle, loading, tick
    from apprentice.store.engine import make_async_engine

    engine = make_async_engine(database_url)
    load_times: list[float] = []
    commits: list[float] = []
    original_load, original_canary = loading.ensure_loaded, lifecycle.start_canary

    async def timed_load(*args: Any, **kwargs: Any) -> Any:
        started = time.time()
        try:
            return await original_load(*args, **kwargs)
        finally:
            load_times.append(time.time() - started)

    async def timed_canary(*args: Any, **kwargs: Any) -> Any:
        result = await original_canary(*args, **kwargs)
        commits.append(time.time())  # the transaction committed as start_canary returned
        return result

    loading.ensure_loaded = timed_load  # type: ignore[assignment]
    lifecycle.start_canary = timed_canary  # type: ignore[assignment]
    probes = Probes(gateway_url, "bench-policy")
    tasks = probes.start()
    results = []
    try:
        await asyncio.sleep(2.0)  # warm: the probes run, the gateway has polled
        for number, path in enumerate(adapters, start=1):
            run_id, version_id = uuid.uuid4(), uuid.uuid4()
            name = f"bench-policy-v{number}"
            load_times.clear()
            commits.clear()
            # The learner's last writes of a run: the run succeeded, its adapter is a candidate.
            ended = time.time()
            db.execute(
                "INSERT INTO training_runs (id, policy, status, loss, kl, finished_at, produced_version_id) "
                "VALUES (%s, 'bench-policy', 'succeeded', 0.1, 0.01, now(), %s)",
                (run_id, version_id),
            )
            db.execute(
                "INSERT INTO adapter_versions (id, policy, version, name, status, base_model, path, "
                "training_run_id) VALUES (%s, 'bench-policy', %s, %s, 'candidate', 'bench', %s, %s)",
                (version_id, number, name, str(path), run_id),
            )
            report = await tick.promotion_tick(engine, settings)
            assert not report.errors, report.errors
            assert any(a["version"] == name and a["action"] == "canary" for a in report.actions), report.actions
            committed = commits[0]
            answered = await probes.first_answer(name, after=ended)
            routed = await asyncio.to_thread(first_routed, db, version_id)
            results.append(
                {
                    "commit": committed - ended,
                    "load": sum(load_times),
                    "switch": routed - committed,
                    "routed": routed - ended,
                    "answered": answered - ended,
                }
            )
            print(f"trial {number}: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in results[-1].items()))
            await lifecycle.reject(engine, version_id, actor="bench", reason="next trial")
            await asyncio.sleep(1.5)  # the gateway stops routing to it
    finally:
        probes.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        loading.ensure_loaded = original_load  # type: ignore[assignment]
        lifecycle.start_canary = original_canary  # type: ignore[assignment]
        await engine.dispose()
    if probes.failures:
        raise RuntimeError(f"{probes.failures} answer probes failed")
    return results, {"probe": statistics.median(probes.durations)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="Model directory (default: SmolLM2-135M-Instruct, fetched).")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument(
        "--pg", default=os.environ.get("APPRENTICE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--no-write", action="store_true", help="Print only; leave docs/benchmarks.md alone.")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 trial; writes nothing")
    args = parser.parse_args()
    if args.quick:
        args.trials, args.no_write = 1, True

    from apprentice.settings import Settings
    from learner.models import fetch_default_model

    load0 = ", ".join(f"{x:.1f}" for x in os.getloadavg())

    model_dir = args.model or str(fetch_default_model())
    with (
        tempfile.TemporaryDirectory() as tmp,
        scratch_database("apprentice_bench_promotion", args.pg) as database_url,
    ):
        processes: list[ManagedProcess] = []
        try:
            adapters = make_adapters(model_dir, Path(tmp), args.trials)
            server, server_url = start_model_server(model_dir, Path(tmp), "bench")
            processes.append(server)
            policy = {
                "name": "bench-policy",
                "base_model": "bench",
                "endpoints": [server_url],
                "promotion": {"canary_share": 1.0},
            }
            config = {
                "database_url": database_url,
                "data_dir": str(Path(tmp) / "gateway"),
                "auth": {"mode": "keys", "admin_key": ADMIN_KEY},
                "policies": [policy],
            }
            gateway, gateway_root = start_gateway(write_config(Path(tmp) / "gateway.yaml", config), Path(tmp))
            processes.append(gateway)
            settings = Settings(**config)
            with psycopg.connect(database_url, autocommit=True) as db:
                results, extra = asyncio.run(trials(database_url, settings, f"{gateway_root}/v1", adapters, db))
        finally:
            for process in reversed(processes):
                process.stop()

    def ms(values: list[float]) -> list[str]:
        return [f"{statistics.median(values) * 1000:.0f}", f"{min(values) * 1000:.0f}", f"{max(values) * 1000:.0f}"]

    rows = [
        [label, *ms([r[key] for r in results])]
        for key, label in (
            ("commit", "run end to canary committed (`promotion_tick`: gates, load + verify, locked transition)"),
            ("load", "  of which LoRA load + GET /v1/models verification at the endpoint"),
            ("switch", "commit to the gateway routing new trajectories to the canary (NOTIFY; 1 s poll as fallback)"),
            ("routed", "**run end to the first call routed to the canary**"),
            ("answered", "run end to the first answer from the canary received by a client"),
        )
    ]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    body = "\n\n".join(
        [
            "`python -m bench.promotion_latency` — " + machine_line() + f" Load average before the run: {load0}; "
            f"after: {load} (the machine was shared with other work).",
            f"{len(results)} trials; model `{Path(model_dir).name}` on CPU via `apprentice serve-model`, one gateway "
            "process with the default `adapter_poll_interval_s: 1`, PostgreSQL on localhost. Each trial records a "
            "finished run and its candidate (LoRA r=8 on all seven projections, as the learner makes them) and runs "
            "`promotion_tick` at once. Meanwhile two clients send one-token chat calls through the gateway and a third "
            "sends a call every 20 ms that the endpoint refuses at once (`max_tokens: 0`): the gateway routes and "
            "records those too, which timestamps its switch (`calls.created_at` of the first call on the canary). The "
            "canary share is 1.0 so that the first new trajectory after the switch shows it.",
            markdown_table(["phase", "median ms", "min ms", "max ms"], rows),
            f"A one-token call took {extra['probe'] * 1000:.0f} ms (median) on this shared machine: the last row is "
            "bounded by it. The switch is the gateway's LISTEN on the lifecycle's NOTIFY (the poll every "
            "`adapter_poll_interval_s` only catches what a dropped listener missed; see `bench.adapter_switch`). In "
            "production add: the time to the next `promotion_tick` when it is not run right after the training run "
            "(`apprentice learner` runs it at once after a run and every 30 s), and about 1/(s*r) for a canary share "
            "s and r new trajectories a second.",
        ]
    )
    print(body)
    if not args.no_write:
        write_section(TITLE, body)


if __name__ == "__main__":
    main()
