"""Tokens/s of the local inference server for 1 and for 8 concurrent requests.

Starts `apprentice serve-model` (the real SmolLM2-135M-Instruct unless --model says otherwise)
in its own process, sends chat completions with the official `openai` client, and writes the
medians to docs/benchmarks.md. Every request generates exactly --max-tokens tokens
(`ignore_eos`), so rounds are comparable.

With `--adapters N` the server starts with N LoRA adapters shaped like the learner's and the
requests of a round go to them in turn (request i to adapter i mod N): `--adapters 2` is a
canary at 50%, the promoted version and the candidate sharing the traffic. Those figures get a
section of their own.

    python -m bench.inference_throughput [--model DIR] [--rounds 3] [--max-tokens 64] [--adapters 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from openai import AsyncOpenAI

from bench.harness import start_model_server
from bench.report import machine_line, markdown_table, write_section

TITLE = "Local inference server throughput"
PROMPT = [{"role": "user", "content": "Write a short story about a robot who learns to paint."}]


def adapter_name(index: int) -> str:
    return f"bench-lora-{index}"


async def one_request(client: AsyncOpenAI, model: str, max_tokens: int, seed: int) -> tuple[int, float]:
    started = time.perf_counter()
    response = await client.chat.completions.create(
        model=model, messages=PROMPT, max_tokens=max_tokens, temperature=1.0, seed=seed, extra_body={"ignore_eos": True}
    )
    assert response.usage is not None
    return response.usage.completion_tokens, time.perf_counter() - started


async def run_round(
    client: AsyncOpenAI, models: list[str], concurrency: int, max_tokens: int, seed: int
) -> dict[str, float]:
    """`concurrency` requests at once, request i for models[i mod len(models)]."""
    started = time.perf_counter()
    results = await asyncio.gather(
        *[one_request(client, models[i % len(models)], max_tokens, seed + i) for i in range(concurrency)]
    )
    wall = time.perf_counter() - started
    tokens = sum(t for t, _ in results)
    return {
        "aggregate": tokens / wall,
        "per_request": statistics.median(t / s for t, s in results),
        "latency": statistics.median(s for _, s in results),
    }


async def measure(
    server_url: str, models: list[str], concurrencies: list[int], rounds: int, max_tokens: int
) -> dict[int, dict[str, float]]:
    client = AsyncOpenAI(base_url=server_url, api_key="unused", timeout=600, max_retries=0)
    await run_round(client, models, len(models), 8, seed=0)  # warm-up, every model once
    figures: dict[int, dict[str, float]] = {}
    for concurrency in concurrencies:
        samples = [await run_round(client, models, concurrency, max_tokens, seed=100 * r) for r in range(rounds)]
        figures[concurrency] = {key: statistics.median(s[key] for s in samples) for key in samples[0]}
        print(f"concurrency {concurrency}: " + ", ".join(f"{k} {v:.2f}" for k, v in figures[concurrency].items()))
    await client.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--adapters",
        type=int,
        default=0,
        help="serve N LoRA adapters and send the requests to them in turn (2: a canary at 50%%)",
    )
    parser.add_argument("--concurrency", default="1,8", help="comma-separated numbers of concurrent requests")
    parser.add_argument("--no-write", action="store_true", help="print only, leave docs/benchmarks.md alone")
    parser.add_argument("--quick", action="store_true", help="a smoke run: one round of 8 tokens; writes nothing")
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]

    if args.quick:
        args.rounds, args.max_tokens, args.no_write = 1, 8, True
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-adapters-") as scratch:
        adapters: list[Path] = []
        if args.adapters:
            from bench.promotion_latency import make_adapters
            from learner.models import resolve_model_path

            adapters = make_adapters(str(resolve_model_path(args.model)), Path(scratch), args.adapters)
        models = [adapter_name(i) for i in range(args.adapters)] or ["bench"]
        loras = [arg for i, path in enumerate(adapters) for arg in ("--lora-modules", f"{adapter_name(i)}={path}")]
        server, server_url = start_model_server(args.model, Path(scratch), "bench", *loras)
        try:
            figures = asyncio.run(measure(server_url, models, concurrencies, args.rounds, args.max_tokens))
        finally:
            server.stop()

    rows = [[c, f"{f['aggregate']:.1f}", f"{f['per_request']:.1f}", f"{f['latency']:.2f}"] for c, f in figures.items()]
    command = f"`python -m bench.inference_throughput --rounds {args.rounds} --max-tokens {args.max_tokens}"
    command += f" --adapters {args.adapters}`" if args.adapters else "`"
    served = (
        f"requests sent in turn to {args.adapters} LoRA adapters (r=8 on all seven projections, as the "
        "learner makes them) loaded with `--lora-modules`, "
        if args.adapters
        else ""
    )
    parts = [
        f"{command}: `apprentice serve-model --model {args.model}` (transformers + peft, fp32 on CPU), {served}"
        f"chat completions of exactly {args.max_tokens} tokens each (`ignore_eos`, temperature 1), through the "
        f"official `openai` client; medians of {args.rounds} rounds after a warm-up.",
        markdown_table(
            ["concurrent requests", "tokens/s (all requests)", "tokens/s (one request)", "latency per request (s)"],
            rows,
        ),
    ]
    if 1 in figures and 8 in figures:
        speedup = figures[8]["aggregate"] / figures[1]["aggregate"]
        together = f" for {args.adapters} adapters" if args.adapters else ""
        parts.append(
            f"8 concurrent requests{together} are decoded as one batch: {speedup:.1f}x the throughput of one at a time."
        )
    body = "\n\n".join(
        [
            *parts,
            machine_line() + f" Load average {load_before:.1f} before and {os.getloadavg()[0]:.1f} after the run: "
            "the cores were shared with other work, and on this machine figures have varied up to 3x between "
            "runs (torch's threads stall when the cores are busy); compare the rows of one run, not runs.",
        ]
    )
    print(body)
    if not args.no_write:
        write_section(f"{TITLE}, {args.adapters} adapters" if args.adapters else TITLE, body)


if __name__ == "__main__":
    main()
