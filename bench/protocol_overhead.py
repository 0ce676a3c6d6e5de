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
from dataclasses import dataclass
from typing import Any

from bench.loadgen import Endpoint, LoadClient
from bench.report import machine_line, markdown_table
from bench.side_by_side import added, arguments, interleaved_rounds, publish, side_by_side, sizes
from bench.stats import median

SECTION_TITLE = "Protocol endpoints: Responses and Messages beside chat completions"
PROMPT = "Answer in a few words: what is the capital of France?"
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


def gateway_config(upstream: str) -> dict[str, Any]:
    return {
        "model_list": [
            {"model_name": "fake-model", "litellm_params": {"model": "openai/fake-model", "api_base": upstream}},
            {
                "model_name": "claude-fake",
                "litellm_params": {"model": "anthropic/fake-model", "api_base": upstream, "api_key": "sk-ant"},
            },
        ],
        "policies": [{"name": "agent", "base_model": "fake-model", "endpoints": [upstream]}],
    }


async def measure(gateway: str, upstream: str, rounds: int, requests: int) -> dict[str, list[tuple[float, float]]]:
    """Per kind, its (p50, p99) in ms in each round, kinds interleaved within a round."""
    clients = {kind.name: LoadClient(kind.endpoint(gateway, upstream), 1) for kind in KINDS}
    return await interleaved_rounds(clients, rounds, requests, check_warm_up=True)


def overheads(results: dict[str, list[tuple[float, float]]]) -> dict[str, float]:
    """Median over rounds of (the kind's p50 - its baseline's p50 in the same round), ms."""
    return {kind.name: added(results, kind.name, kind.baseline, 0) for kind in KINDS if kind.baseline is not None}


def render(results: dict[str, list[tuple[float, float]]], rounds: int, requests: int) -> str:
    overhead = overheads(results)
    rows = []
    for kind in KINDS:
        row = [kind.name, f"{median(r[0] for r in results[kind.name]):.3f}"]
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
    async with side_by_side("protocols") as stack:
        gateway_url = await stack.add_gateway("gateway", gateway_config(stack.upstream_url))
        rounds, requests = sizes(args)
        results = await measure(gateway_url, stack.upstream_url, rounds, requests)
        return render(results, rounds, requests)


def main() -> None:
    args = arguments(__doc__, 9, 200).parse_args()
    publish(args, SECTION_TITLE, asyncio.run(run(args)))


if __name__ == "__main__":
    main()
