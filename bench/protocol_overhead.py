"""What the gateway adds on the Responses and Messages endpoints, beside chat completions.

One fake upstream (`tests.support.fake_upstream`, which speaks chat completions, the
Responses API and Anthropic's Messages) and one gateway (one worker, recording into a fresh
PostgreSQL database) in front of it. Each request kind is timed against its own baseline, the
same request sent straight to the upstream, in interleaved rounds (so the noise of a shared
machine falls on every kind alike):

- chat completions to a model_list deployment (forwarded byte for byte) and to a policy
  (token ids and logprobs asked for and stripped): baseline, a direct chat completion;
- Responses and Messages to a deployment that speaks them (forwarded byte for byte):
  baselines, the direct Responses / Messages call;
- Responses and Messages to a policy (translated to chat completions and back): baseline, a
  direct chat completion (what the gateway sends the policy's endpoint);
- the translated kinds streamed too, against a direct streamed chat completion.

The figure per kind is the median over rounds of (its p50 - its baseline's p50 in that round):
the latency the gateway adds. The issue's target: the new endpoints within 0.2 ms of chat
completions at the median.

    python -m bench.protocol_overhead            # about 2 minutes; writes docs/benchmarks.md
    python -m bench.protocol_overhead --quick    # smoke run, writes nothing
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apprentice.processes import ManagedProcess, free_port
from bench.gateway_overhead import (
    REPO,
    apprentice_argv,
    drop_database,
    log,
    recreate_database,
    wait_ready,
)
from bench.loadgen import Endpoint, LoadClient
from bench.report import machine_line, markdown_table, write_section
from bench.stats import median

SECTION_TITLE = "Protocol endpoints: Responses and Messages beside chat completions"
HOST = "127.0.0.1"
PROMPT = "Answer in a few words: what is the capital of France?"
ADMIN_URL = os.environ.get("APPRENTICE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
AUTH = {"Authorization": "Bearer sk-bench", "x-api-key": "sk-bench", "anthropic-version": "2023-06-01"}


@dataclass(frozen=True)
class Kind:
    """One kind of request: where it goes, its body, and the kind it is compared with."""

    name: str
    path: str
    body: dict[str, Any]
    baseline: str | None  # None: this is a baseline (sent straight to the upstream)
    stream: bool = False
    end_marker: bytes = b"[DONE]"
    tail_bytes: int = 64

    def endpoint(self, gateway: str, upstream: str) -> Endpoint:
        base = upstream if self.baseline is None else gateway
        body = dict(self.body, stream=True) if self.stream else self.body
        return Endpoint(
            base + self.path, json.dumps(body).encode(), AUTH, self.stream, self.end_marker, self.tail_bytes
        )


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 64}


def responses(model: str) -> dict[str, Any]:
    return {"model": model, "input": PROMPT, "max_output_tokens": 64}


def messages(model: str) -> dict[str, Any]:
    return {"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": PROMPT}]}


RESPONSES_END = {"end_marker": b"response.completed", "tail_bytes": 16384}
MESSAGES_END = {"end_marker": b"message_stop", "tail_bytes": 256}

KINDS = [
    Kind("direct chat", "/chat/completions", chat("fake-model"), None),
    Kind("direct chat, streamed", "/chat/completions", chat("fake-model"), None, stream=True),
    Kind("direct responses", "/responses", responses("fake-model"), None),
    Kind("direct messages", "/messages", messages("fake-model"), None),
    Kind("chat -> deployment", "/chat/completions", chat("fake-model"), "direct chat"),
    Kind("chat -> policy", "/chat/completions", chat("agent"), "direct chat"),
    Kind("responses -> deployment (native)", "/responses", responses("fake-model"), "direct responses"),
    Kind("responses -> policy (translated)", "/responses", responses("agent"), "direct chat"),
    Kind("messages -> deployment (native)", "/messages", messages("claude-fake"), "direct messages"),
    Kind("messages -> policy (translated)", "/messages", messages("agent"), "direct chat"),
    Kind("chat -> policy, streamed", "/chat/completions", chat("agent"), "direct chat, streamed", stream=True),
    Kind(
        "responses -> policy, streamed",
        "/responses",
        responses("agent"),
        "direct chat, streamed",
        stream=True,
        **RESPONSES_END,
    ),
    Kind(
        "messages -> policy, streamed",
        "/messages",
        messages("agent"),
        "direct chat, streamed",
        stream=True,
        **MESSAGES_END,
    ),
]


def gateway_config(upstream: str, data_dir: Path, database_url: str) -> dict[str, Any]:
    return {
        "database_url": database_url,
        "data_dir": str(data_dir),
        "auth": {"mode": "open"},
        "model_list": [
            {"model_name": "fake-model", "litellm_params": {"model": "openai/fake-model", "api_base": upstream}},
            {
                "model_name": "claude-fake",
                "litellm_params": {"model": "anthropic/fake-model", "api_base": upstream, "api_key": "sk-ant"},
            },
        ],
        "policies": [{"name": "agent", "base_model": "fake-model", "endpoints": [upstream]}],
    }


async def measure(gateway: str, upstream: str, rounds: int, requests: int) -> dict[str, list[float]]:
    """Per kind, its p50 (ms) in each round, kinds interleaved within a round."""
    clients = {kind.name: LoadClient(kind.endpoint(gateway, upstream), 1) for kind in KINDS}
    p50s: dict[str, list[float]] = {kind.name: [] for kind in KINDS}
    try:
        for client in clients.values():  # warm-up: connections, caches, the journal's first segment
            samples, _ = await client.run(max(20, requests // 5))
            failed = [s for s in samples if not s.ok]
            if failed:
                raise RuntimeError(f"{client.endpoint.url}: {len(failed)} failed, e.g. {failed[0].body_tail[:300]!r}")
        for number in range(rounds):
            for kind in KINDS:
                samples, _ = await clients[kind.name].run(requests)
                bad = sum(1 for s in samples if not s.ok)
                if bad:
                    raise RuntimeError(f"{kind.name}: {bad} of {len(samples)} requests failed")
                p50s[kind.name].append(median(s.total * 1000.0 for s in samples))
            log(f"round {number + 1}/{rounds} done")
    finally:
        for client in clients.values():
            client.close()
    return p50s


def added(p50s: dict[str, list[float]]) -> dict[str, float]:
    """Median over rounds of (the kind's p50 - its baseline's p50 in the same round), ms."""
    out = {}
    for kind in KINDS:
        if kind.baseline is not None:
            diffs = [a - b for a, b in zip(p50s[kind.name], p50s[kind.baseline], strict=True)]
            out[kind.name] = median(diffs)
    return out


def render(p50s: dict[str, list[float]], rounds: int, requests: int) -> str:
    overhead = added(p50s)
    rows = []
    for kind in KINDS:
        row = [kind.name, f"{median(p50s[kind.name]):.3f}"]
        row.append(f"{overhead[kind.name]:+.3f}" if kind.name in overhead else "(baseline)")
        rows.append(row)
    chat_policy = overhead["chat -> policy"]
    chat_stream = overhead["chat -> policy, streamed"]
    compared = [
        ("responses -> policy (translated)", chat_policy),
        ("messages -> policy (translated)", chat_policy),
        ("responses -> policy, streamed", chat_stream),
        ("messages -> policy, streamed", chat_stream),
        ("responses -> deployment (native)", overhead["chat -> deployment"]),
        ("messages -> deployment (native)", overhead["chat -> deployment"]),
    ]
    verdict = "\n".join(
        f"- {name}: adds {overhead[name]:.3f} ms against chat completions' {reference:.3f} ms "
        f"({overhead[name] - reference:+.3f} ms; target within 0.2 ms: "
        f"{'met' if overhead[name] - reference <= 0.2 else 'NOT met'})"
        for name, reference in compared
    )
    table = markdown_table(["request kind", "p50 (ms)", "added over its baseline (ms)"], rows)
    return (
        f"{machine_line()}\n\n"
        f"`python -m bench.protocol_overhead`: one gateway worker recording into PostgreSQL, the fake upstream, "
        f"concurrency 1, {rounds} interleaved rounds of {requests} requests per kind; medians over rounds.\n\n"
        f"{table}\n\n{verdict}\n"
    )


async def run(args: argparse.Namespace) -> str:
    workdir = Path(tempfile.mkdtemp(prefix="bench-protocols-"))
    upstream_port = free_port()
    upstream = ManagedProcess(
        "fake upstream",
        [sys.executable, "-m", "tests.support.fake_upstream", "--port", str(upstream_port)],
        workdir / "upstream.log",
        cwd=REPO,
        ready_url=f"http://{HOST}:{upstream_port}/v1/models",
    )
    upstream.start()
    upstream.wait_ready(30)
    upstream_url = f"http://{HOST}:{upstream_port}/v1"
    database = "apprentice_bench_protocols"
    database_url = recreate_database(ADMIN_URL, database)
    config = workdir / "gateway.yaml"
    config.write_text(json.dumps(gateway_config(upstream_url, workdir / "data", database_url)))
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL" and not k.startswith("APPRENTICE_")}
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    subprocess.run(
        apprentice_argv() + ["db", "upgrade", "--config", str(config)], check=True, cwd=REPO, env=env, timeout=300
    )
    port = free_port()
    gateway = ManagedProcess(
        "gateway",
        apprentice_argv() + ["gateway", "--config", str(config), "--host", HOST, "--port", str(port)],
        workdir / "gateway.log",
        cwd=REPO,
    )
    gateway.env = env
    gateway.start()
    try:
        gateway_url = f"http://{HOST}:{port}/v1"
        await wait_ready(gateway_url, None, 120)
        rounds, requests = (2, 30) if args.quick else (args.rounds, args.requests)
        p50s = await measure(gateway_url, upstream_url, rounds, requests)
        return render(p50s, rounds, requests)
    finally:
        gateway.stop()
        upstream.stop()
        drop_database(ADMIN_URL, database)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="a smoke run; writes nothing")
    args = parser.parse_args()
    report = asyncio.run(run(args))
    print(report)
    if not args.quick:
        write_section(SECTION_TITLE, report)


if __name__ == "__main__":
    main()
