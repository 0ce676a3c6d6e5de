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
import time
import uuid
from typing import Any

from bench.harness import pg_connect
from bench.loadgen import Endpoint, LoadClient
from bench.report import machine_line, markdown_table
from bench.side_by_side import (
    added,
    arguments,
    interleaved_rounds,
    latency_cells,
    load_note,
    publish,
    side_by_side,
    sizes,
)
from bench.stats import median

SECTION_TITLE = "Redaction overhead"
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


def gateway_config(upstream: str, redact: bool) -> dict[str, Any]:
    return {
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
    return await interleaved_rounds(clients, rounds, requests)


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
    rows: list[list[object]] = []
    notes = []
    for kind in KINDS:
        for name in TARGETS:
            base = None if name == "direct" else (kind, "direct")
            rows.append([kind, name, *latency_cells(results, (kind, name), base)])
        on_key, off_key = (kind, "redaction on"), (kind, "redaction off")
        own50, own99 = added(results, on_key, off_key, 0), added(results, on_key, off_key, 1)
        off = median(r[0] for r in results[off_key])
        early, late = cost[kind]
        notes.append(
            f"- {kind}: redaction adds {own50:+.3f} ms at the median and {own99:+.3f} ms at p99 (on minus off in "
            f"the same round; ratio of the medians {(off + own50) / off:.3f}); in process the request takes "
            f"{early:.1f} µs (redacted while the upstream works) and the answer {late:.1f} µs (before the last byte)."
        )
    table = markdown_table(["request", "target", "p50 (ms)", "p99 (ms)", "added over direct, p50 / p99 (ms)"], rows)
    return (
        f"{machine_line()}\n\n"
        f"`python -m bench.redaction_overhead`: the fake upstream and two gateways (one worker each, recording into "
        f"PostgreSQL), one with redaction off and one with every built-in kind and one operator rule on; an agent's "
        f"request (system prompt and ten turns, about 3 KB), clean or holding an e-mail address, a phone number, a "
        f"key and a card number; concurrency 1, {rounds} interleaved rounds of {requests} requests per request kind "
        f"and target; medians over rounds. Stored afterwards: {proof[0]} calls with the address as a placeholder in "
        f"request and answer (redaction on), {proof[1]} with it in clear (redaction off). {load_note(load)}."
        f"\n\n{table}\n\n" + "\n".join(notes) + "\n"
    )


async def run(args: argparse.Namespace) -> str:
    load_start = os.getloadavg()[0]
    async with side_by_side("redaction") as stack:
        for name, redact in (("redaction off", False), ("redaction on", True)):
            await stack.add_gateway(name, gateway_config(stack.upstream_url, redact))
        rounds, requests = sizes(args)
        results = await measure(stack.urls, rounds, requests)
        await asyncio.sleep(2.0)  # the journals ship
        proof = stored_proof(stack.database_url)
        if not proof[0] or not proof[1]:
            raise RuntimeError(f"expected redacted and clear calls in the store, found {proof}")
        cost = cpu_cost_us(200 if args.quick else 2000)
        return render(results, rounds, requests, cost, proof, (load_start, os.getloadavg()[0]))


def main() -> None:
    args = arguments(__doc__, 7, 150).parse_args()
    publish(args, SECTION_TITLE, asyncio.run(run(args)))


if __name__ == "__main__":
    main()
