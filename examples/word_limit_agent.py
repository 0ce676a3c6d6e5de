"""An agent that knows nothing of Apprentice except its base URL, learning a word limit.

Each run asks the model to describe something in at most N words, scores the answer itself
(1 if it keeps to the limit, else 0) and posts that reward to the gateway's webhook some
seconds later, out of order, as a real system would. Run it against `apprentice up`:

    export OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=apprentice-local
    python examples/word_limit_agent.py --runs 600

As the learner trains adapters and the promotion job puts them into service, the success rate
rises. The answer's `model` field names the adapter version that served it (the base model's
name before the first promotion); the script prints the success rate per version and writes a
plot next to its JSON results.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from collections import defaultdict
from pathlib import Path

import httpx
from openai import AsyncOpenAI

TOPICS = [
    "the ocean",
    "a bicycle",
    "autumn",
    "a library",
    "coffee",
    "the moon",
    "a thunderstorm",
    "bread",
    "a city at night",
    "a violin",
    "the desert",
    "snow",
    "a train station",
    "honey",
    "a lighthouse",
    "the forest",
    "a market",
    "rain",
    "a mountain",
    "chess",
    "a garden",
    "the wind",
    "a museum",
    "tea",
    "a river",
    "fireworks",
    "a clock",
    "the sun",
    "a kitten",
    "the sea breeze",
    "a castle",
    "a volcano",
    "spring",
    "a bridge",
    "a candle",
    "the stars",
]
# Prompts no run of the agent uses: the benchmarks and tests evaluate on these.
HELD_OUT_TOPICS = [
    "a harbor at dawn",
    "a clock tower",
    "the first snow",
    "a street market",
    "an old map",
    "a mountain lake",
    "a paper boat",
    "a jazz club",
    "a wheat field",
    "a subway car",
    "a lemon tree",
    "a foggy pier",
    "a desert road",
    "a school bell",
    "a pine cone",
    "a tide pool",
    "a sailing ship",
    "a night train",
    "a bamboo forest",
    "a thunderclap",
    "a sand dune",
    "a quiet chapel",
    "a red balloon",
    "a frozen pond",
    "a copper kettle",
    "a windmill",
    "a rope bridge",
    "a snow owl",
    "a glass jar",
    "a hot spring",
    "a cactus",
    "a kite festival",
]
MAX_WORDS = 8
MIN_POINTS = 12


def task_prompt(topic: str, max_words: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Describe {topic} in at most {max_words} words."}]


def score(answer: str, finish_reason: str | None, max_words: int) -> float:
    """The verifiable outcome: an answer that ended by itself (not cut off at max_tokens),
    with 1 to max_words words."""
    return 1.0 if finish_reason == "stop" and 0 < len(answer.split()) <= max_words else 0.0


async def post_reward_later(
    http: httpx.AsyncClient, trajectory_id: str, reward: float, group: str, delay_s: float
) -> None:
    await asyncio.sleep(delay_s)
    response = await http.post("/rewards", json={"trajectory_id": trajectory_id, "reward": reward, "group_id": group})
    response.raise_for_status()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="apprentice", help="The policy (model name) to call.")
    parser.add_argument("--runs", type=int, default=600)
    parser.add_argument("--group-size", type=int, default=8, help="Runs of the same task in a row (a GRPO group).")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-words", type=int, default=MAX_WORDS)
    parser.add_argument("--max-tokens", type=int, default=24, help="Longer answers are cut off, and fail.")
    parser.add_argument("--max-delay", type=float, default=8.0, help="Rewards arrive up to this many seconds late.")
    parser.add_argument("--out", default="docs/example/word_limit", help="Prefix of the .json and .png written.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replot", action="store_true", help="Only redraw the plot from the .json of a past run.")
    args = parser.parse_args()
    if args.replot:
        saved = json.loads(Path(args.out).with_suffix(".json").read_text())
        report(saved["results"], Path(args.out), saved["max_words"])
        return

    base_url = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
    api_key = os.environ.get("OPENAI_API_KEY", "apprentice-local")
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=2)
    http = httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30)
    rng = random.Random(args.seed)
    results: list[dict[str, object]] = []
    rewards: list[asyncio.Task[None]] = []
    started = time.time()
    semaphore = asyncio.Semaphore(args.concurrency)

    async def one_run(index: int, topic: str, group: str) -> None:
        async with semaphore:
            raw = await client.chat.completions.with_raw_response.create(
                model=args.model, messages=task_prompt(topic, args.max_words), max_tokens=args.max_tokens
            )
            completion = raw.parse()
        answer = completion.choices[0].message.content or ""
        reward = score(answer, completion.choices[0].finish_reason, args.max_words)
        results.append(
            {
                "run": index,
                "t": round(time.time() - started, 2),
                "version": completion.model,
                "reward": reward,
                "words": len(answer.split()),
                "topic": topic,
            }
        )
        rewards.append(
            asyncio.create_task(
                post_reward_later(http, raw.headers["x-trajectory-id"], reward, group, rng.uniform(0.5, args.max_delay))
            )
        )

    index = 0
    while index < args.runs:
        topic = rng.choice(TOPICS)
        group = f"{topic}-{index}"
        batch = [one_run(index + k, topic, group) for k in range(min(args.group_size, args.runs - index))]
        await asyncio.gather(*batch)
        index += len(batch)
        done = results[-len(batch) :]
        print(
            f"{index:5d} runs  {sum(r['reward'] for r in done)}/{len(done)} within {args.max_words} words  "
            f"served by {sorted({str(r['version']) for r in done})}",
            flush=True,
        )
    await asyncio.gather(*rewards)
    await http.aclose()
    await client.close()
    report(results, Path(args.out), args.max_words)


def report(results: list[dict[str, object]], out: Path, max_words: int) -> None:
    per_version: dict[str, list[float]] = defaultdict(list)
    for result in sorted(results, key=lambda r: r["run"]):
        per_version[str(result["version"])].append(float(result["reward"]))
    print("\nsuccess rate per adapter version (in order of first use):")
    for version, values in per_version.items():
        print(f"  {version:40s} {sum(values) / len(values):6.1%}  over {len(values)} runs")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"max_words": max_words, "results": results}, indent=1))
    plot(results, out.with_suffix(".png"), max_words)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


def plot(results: list[dict[str, object]], path: Path, max_words: int, window: int = 48) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ordered = sorted(results, key=lambda r: r["run"])
    fig, ax = plt.subplots(figsize=(9, 4.5))
    versions = list(dict.fromkeys(str(r["version"]) for r in ordered))
    for version in versions:
        points = [(r["run"], r["reward"]) for r in ordered if str(r["version"]) == version]
        xs = [p[0] for p in points]
        ys = [
            sum(p[1] for p in points[max(0, i - window + 1) : i + 1]) / len(points[max(0, i - window + 1) : i + 1])
            for i in range(len(points))
        ]
        start = min(len(points) - 1, MIN_POINTS - 1)  # a mean of a handful of runs says little
        rate = sum(p[1] for p in points) / len(points)
        ax.plot(xs[start:], ys[start:], label=f"{version}: {rate:.0%} of {len(points)} runs", linewidth=2)
    ax.set_xlabel("run")
    ax.set_ylabel(f"success rate (moving average of {window} runs)")
    ax.set_title(f"Answers within {max_words} words, by the adapter version that served them")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    asyncio.run(main())
