"""What redaction of the stored calls adds to a call (docs/privacy.md).

One fake upstream (`tests.support.fake_upstream`) and two gateways (one worker each, recording
into the same PostgreSQL): one with redaction off, one with every built-in kind on and one
operator rule. Requests are an agent's: a system prompt and a ten-turn history (about 3 KB),
either clean or holding an e-mail address, a phone number, a key and a card number (the last
user message starts with the address, so the answer holds it too); non-streamed and streamed
chat completions at concurrency 1, in interleaved rounds (direct, redaction off, redaction on),
so that the noise of a shared machine falls on each alike:

- the latency each gateway adds: its p50 (p99) minus the direct call's in the same round,
  median over rounds; redaction's own cost: on minus off in the same round;
- in process, `RecordRedactor` on the same records: the request (redacted while the upstream
  works) and the answer (redacted before the last byte, on the critical path). The fake upstream
  answers in a fraction of a millisecond, faster than the request's redaction, so one kind goes
  to a model it answers after 20 ms: there the request's redaction is off the critical path.

    python -m bench.redaction_overhead             # about 2 minutes; writes docs/benchmarks.md
    python -m bench.redaction_overhead --quick     # smoke run, writes nothing
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from apprentice.processes import ManagedProcess, free_port
from bench.gateway_overhead import REPO, apprentice_argv, drop_database, log, pg_connect, recreate_database, wait_ready
from bench.loadgen import Endpoint, LoadClient
from bench.report import machine_line, markdown_table, write_section
from bench.stats import median, percentile

SECTION_TITLE = "Redaction overhead"
HOST = "127.0.0.1"
ADMIN_URL = os.environ.get("APPRENTICE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
TARGETS = ("direct", "redaction off", "redaction on")
RULES = [{"name": "ticket", "pattern": r"TICKET-(\d{4,})"}]
EMAIL = "jane.doe@example.com"


def messages(personal: bool) -> list[dict[str, str]]:
    """An agent's request: a system prompt and ten turns of history (about 3 KB)."""
    system = (
        "You are the support agent of an online shop. Answer briefly and politely, use the tools when an "
        "order must be looked up, and never promise a refund without checking the order first. " * 3
    )
    turns: list[dict[str, str]] = [{"role": "system", "content": system}]
    for index in range(10):
        user = f"Question {index}: where is my parcel? It was ordered last week and has not arrived yet."
        answer = "Let me check the order status for you; it left the warehouse two days ago and is on its way."
        if personal and index == 3:
            user += " Call me on +44 20 7946 0958, card 4111 1111 1111 1111, API key sk-proj-Zx81kdlw92mdkAlqp02m."
        turns += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    last = f"{EMAIL} is my address; please confirm." if personal else "Thanks, please confirm the delivery date."
    return [*turns, {"role": "user", "content": last}]


SLOW_MODEL = "slow-20"  # the fake upstream answers it after 20 ms, as a (very fast) real model would
KINDS = {  # name: (messages, stream, model)
    "clean": (messages(False), False, "fake-model"),
    "personal data": (messages(True), False, "fake-model"),
    "personal data, streamed": (messages(True), True, "fake-model"),
    "personal data, upstream 20 ms": (messages(True), False, SLOW_MODEL),
}


def body(kind: str) -> bytes:
    content, stream, model = KINDS[kind]
    return json.dumps({"model": model, "messages": content, "max_tokens": 64, "stream": stream}).encode()


def gateway_config(upstream: str, data_dir: Path, database_url: str, redact: bool) -> dict[str, Any]:
    return {
        "database_url": database_url,
        "data_dir": str(data_dir),
        "auth": {"mode": "open"},
        "model_list": [
            {"model_name": name, "litellm_params": {"model": f"openai/{name}", "api_base": upstream}}
            for name in ("fake-model", SLOW_MODEL)
        ],
        "redaction": {"enabled": True, "rules": RULES} if redact else {"enabled": False},
    }


def cpu_cost_us(samples: int) -> dict[str, tuple[float, float]]:
    """Per kind, µs per record in process: (the request, redacted early; the answer, at the end)."""
    from apprentice.settings import Settings
    from gateway.redaction.record import RecordRedactor

    redactor = RecordRedactor(Settings(redaction={"rules": RULES}), b"k" * 32)
    out = {}
    for kind, (content, _, _) in KINDS.items():
        request = {"model": "fake-model", "messages": content, "max_tokens": 64}
        answer_text = " ".join(content[-1]["content"][:40].split() + [f"w{i}" for i in range(15)])
        response = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": answer_text}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 700, "completion_tokens": 20},
        }
        trajectory = str(uuid.uuid4())
        timings = []
        for fields in ({"request": request}, {"response": response}):
            record = {"id": "c", "trajectory_id": trajectory, "policy": None, **fields}
            for _ in range(200):
                redactor.apply(record)
            runs = []
            for _ in range(5):
                started = time.perf_counter()
                for _ in range(samples):
                    redactor.apply(record)
                runs.append((time.perf_counter() - started) / samples * 1e6)
            timings.append(median(runs))
        out[kind] = (timings[0], timings[1])
    return out


async def measure(urls: dict[str, str], rounds: int, requests: int) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """Per (kind, target), its (p50, p99) in ms in each round, all interleaved within a round."""
    clients = {
        (kind, name): LoadClient(Endpoint(url + "/chat/completions", body(kind), {}, KINDS[kind][1]), 1)
        for kind in KINDS
        for name, url in urls.items()
    }
    results: dict[tuple[str, str], list[tuple[float, float]]] = {key: [] for key in clients}
    try:
        for client in clients.values():  # warm-up: connections, caches, the journal's first segment
            await client.run(max(20, requests // 5))
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


def stored_proof(database_url: str) -> tuple[int, int]:
    """(calls stored with a placeholder for the address, calls stored with it in clear): the
    second gateway redacted, the first did not."""
    with pg_connect(database_url) as connection:
        row = connection.execute(
            "SELECT count(*) FILTER (WHERE request::text LIKE %(redacted)s AND response::text LIKE %(redacted)s), "
            "count(*) FILTER (WHERE request::text LIKE %(clear)s) FROM calls",
            {"redacted": "%<EMAIL\\_%", "clear": f"%{EMAIL}%"},
        ).fetchone()
    return int(row[0]), int(row[1])


def render(
    results: dict[tuple[str, str], list[tuple[float, float]]],
    rounds: int,
    requests: int,
    cost: dict[str, tuple[float, float]],
    proof: tuple[int, int],
    load: tuple[float, float],
) -> str:
    def added(kind: str, name: str, base: str, index: int) -> float:
        pairs = zip(results[(kind, name)], results[(kind, base)], strict=True)
        return median(a[index] - b[index] for a, b in pairs)

    rows: list[list[object]] = []
    notes = []
    for kind in KINDS:
        for name in TARGETS:
            p50 = median(r[0] for r in results[(kind, name)])
            p99 = median(r[1] for r in results[(kind, name)])
            over = (
                "(baseline)"
                if name == "direct"
                else f"{added(kind, name, 'direct', 0):+.3f} / {added(kind, name, 'direct', 1):+.3f}"
            )
            rows.append([kind, name, f"{p50:.3f}", f"{p99:.3f}", over])
        own50, own99 = added(kind, "redaction on", "redaction off", 0), added(kind, "redaction on", "redaction off", 1)
        off = median(r[0] for r in results[(kind, "redaction off")])
        early, late = cost[kind]
        notes.append(
            f"- {kind}: redaction adds {own50:+.3f} ms at the median and {own99:+.3f} ms at p99 (on minus off in "
            f"the same round; ratio of the medians {(off + own50) / off:.3f}); in process the request takes "
            f"{early:.1f} µs (redacted while the upstream works) and the answer {late:.1f} µs (before the last byte)."
        )
    table = markdown_table(["request", "target", "p50 (ms)", "p99 (ms)", "added over direct, p50 / p99 (ms)"], rows)
    busy = load[0] >= 1.5 or load[1] >= 1.5
    return (
        f"{machine_line()}\n\n"
        f"`python -m bench.redaction_overhead`: the fake upstream and two gateways (one worker each, recording into "
        f"PostgreSQL), one with redaction off and one with every built-in kind and one operator rule on; an agent's "
        f"request (system prompt and ten turns, about 3 KB), clean or holding an e-mail address, a phone number, a "
        f"key and a card number; concurrency 1, {rounds} interleaved rounds of {requests} requests per request kind "
        f"and target; medians over rounds. Stored afterwards: {proof[0]} calls with the address as a placeholder in "
        f"request and answer (redaction on), {proof[1]} with it in clear (redaction off). Load average at start / "
        f"end: {load[0]:.2f} / {load[1]:.2f}{' (a busy shared machine: read the figures as rough)' if busy else ''}."
        f"\n\n{table}\n\n" + "\n".join(notes) + "\n"
    )


async def run(args: argparse.Namespace) -> str:
    load_start = os.getloadavg()[0]
    workdir = Path(tempfile.mkdtemp(prefix="bench-redaction-"))
    processes: list[ManagedProcess] = []

    def started(process: ManagedProcess, timeout: float = 30) -> ManagedProcess:
        process.start()
        processes.append(process)
        if process.ready_url:
            process.wait_ready(timeout)
        return process

    upstream_port = free_port()
    upstream_url = f"http://{HOST}:{upstream_port}/v1"
    database = "apprentice_bench_redaction"
    database_url = recreate_database(ADMIN_URL, database)
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL" and not k.startswith("APPRENTICE_")}
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    try:
        started(
            ManagedProcess(
                "fake upstream",
                [sys.executable, "-m", "tests.support.fake_upstream", "--port", str(upstream_port)],
                workdir / "upstream.log",
                cwd=REPO,
                ready_url=f"{upstream_url}/models",
            )
        )
        urls = {"direct": upstream_url}
        for name, redact in (("redaction off", False), ("redaction on", True)):
            slug = name.replace(" ", "-")
            config = workdir / f"{slug}.yaml"
            config.write_text(json.dumps(gateway_config(upstream_url, workdir / slug, database_url, redact)))
            if len(urls) == 1:
                subprocess.run(
                    apprentice_argv() + ["db", "upgrade", "--config", str(config)],
                    check=True,
                    cwd=REPO,
                    env=env,
                    timeout=300,
                )
            port = free_port()
            gateway = ManagedProcess(
                name,
                apprentice_argv() + ["gateway", "--config", str(config), "--host", HOST, "--port", str(port)],
                workdir / f"{slug}.log",
                cwd=REPO,
            )
            gateway.env = env
            started(gateway)
            urls[name] = f"http://{HOST}:{port}/v1"
            await wait_ready(urls[name], None, 120)
        rounds, requests = (2, 30) if args.quick else (args.rounds, args.requests)
        results = await measure(urls, rounds, requests)
        await asyncio.sleep(2.0)  # the journals ship
        proof = stored_proof(database_url)
        if not proof[0] or not proof[1]:
            raise RuntimeError(f"expected redacted and clear calls in the store, found {proof}")
        cost = cpu_cost_us(200 if args.quick else 2000)
        return render(results, rounds, requests, cost, proof, (load_start, os.getloadavg()[0]))
    finally:
        for process in reversed(processes):
            process.stop()
        drop_database(ADMIN_URL, database)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--quick", action="store_true", help="a smoke run; writes nothing")
    args = parser.parse_args()
    report = asyncio.run(run(args))
    print(report)
    if not args.quick:
        write_section(SECTION_TITLE, report)


if __name__ == "__main__":
    main()
