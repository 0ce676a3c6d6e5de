"""Learning efficiency: the live loop under continuous traffic against a bare GRPO loop.

Same model (SmolLM2-135M-Instruct), same LoRA (r=8, alpha 16, the seven projections), same
learning rate, group size, temperature, token limit, and the same number of rewarded
samples at the same rate:

(a) the product: `apprentice up --config` (embedded PostgreSQL, the local inference server,
    the gateway, the learner with automatic promotion), driven by an agent that knows only
    OPENAI_BASE_URL: it sends runs at a fixed pace without waiting for the learner, scores each
    answer itself and posts the reward 0.5-8 s later, in shuffled order. "After" is the version
    the policy's promoted slot serves when the traffic ends (what users get), evaluated at the
    inference server. The traffic comes in one of several shapes (--traffic):
      grouped      a random training prompt per group of GROUP_SIZE runs, named by X-Group-Id
      repeating16  16 fixed prompts that repeat, each sent in named groups of GROUP_SIZE
      few          4 fixed prompts that repeat, runs sent one by one without any id
      unique       every run a prompt never seen before (a topic and a context), no id
      two_call     runs of two calls in one conversation (a second topic asked after the first
                   answer), one reward per run (the mean of its turns), named groups of GROUP_SIZE
      unique_explore  `unique`'s runs, and the policy declares what such a deployment adds:
                   exploration (EXPLORE_ANSWERS unserved answers per client call from the lineage
                   head, docs/exploration.md) and a reward function that scores them (an HTTP
                   endpoint this script runs with the task's own rule, docs/reward-functions.md)
    Every shape runs at `apprentice up`'s shipped learning and promotion settings: nothing is
    tuned per shape; `unique_explore` only declares the exploration and the scorer it is about.
(b) the bare loop, written here with torch and peft: each step samples PROMPTS_PER_STEP
    prompts x GROUP_SIZE answers at temperature 1, rewards them, and makes one on-policy
    GRPO update (group-normalised advantages, token-mean loss). Its sample rate sets (a)'s pace.

Held-out success is measured on prompts neither loop trains on, EVAL_SAMPLES samples in all,
with a Wilson 95% interval. The ratio of the gains and of the wall times is the figure of merit;
both gains are read at the product's inference server (the bare loop's final LoRA is loaded there
and evaluated beside the promoted version), so that one evaluator reads every figure of a ratio.
Each (task, seed) runs the bare loop once; every traffic shape of it is compared with that run.

    python -m bench.learning_efficiency                      # every task, grouped traffic, writes docs/benchmarks.md
    python -m bench.learning_efficiency --task lowercase --traffic repeating16 --traffic few --seed 0 --seed 1
    python -m bench.learning_efficiency --task lowercase --samples 160 --no-write   # a quick look
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
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import yaml

from apprentice.processes import ManagedProcess, free_port
from apprentice.settings import ALL_LINEAR_PROJECTIONS
from bench.report import machine_line, markdown_table, write_section
from examples.word_limit_agent import HELD_OUT_TOPICS, TOPICS

SECTION_TITLE = "Learning efficiency: the live loop against a bare GRPO loop"
REPO = Path(__file__).resolve().parent.parent
POLICY = "apprentice"
GROUP_SIZE = 8
PROMPTS_PER_STEP = 4
MAX_TOKENS = 32
TEMPERATURE = 1.0
LR = 1e-4
EVAL_SAMPLES = 256
SEED = 0
TRAFFIC = ("grouped", "repeating16", "few", "unique", "two_call", "unique_explore")
# Unserved answers per client call in the exploring shapes ("one extra answer per client call").
EXPLORE_ANSWERS = 1
# Contexts that make every prompt of the `unique` traffic one never seen before.
CONTEXT_WORDS = (
    "for a child, on a rainy day, in a letter, for a sailor, at a wedding, for a museum card, in a poem, "
    "for a tourist, in a diary, for a farmer, on a postcard, for a scientist, at night, in winter, "
    "for a friend, in a speech, for a painter, on a menu, for a teacher, in a song"
).split(", ")

TRAIN_TOPICS = TOPICS
EVAL_TOPICS = HELD_OUT_TOPICS


@dataclass(frozen=True)
class Task:
    name: str
    describe: str
    prompt: Callable[[str], str]
    # score(answer, ended_by_itself) -> 0 or 1
    score: Callable[[str, bool], float]
    samples: int  # rewarded samples each loop gets (the bare loop's reference figure)


def _word_limit(answer: str, ended: bool) -> float:
    return 1.0 if ended and 0 < len(answer.split()) <= 5 else 0.0


def _lowercase(answer: str, ended: bool) -> float:
    return 1.0 if any(c.isalpha() for c in answer) and answer == answer.lower() else 0.0


COLOURS = (
    "red",
    "orange",
    "yellow",
    "green",
    "blue",
    "purple",
    "pink",
    "brown",
    "black",
    "white",
    "grey",
    "gray",
    "golden",
    "silver",
)


def _names_a_colour(answer: str, ended: bool) -> float:
    words = {w.strip(".,;:!?\"'()").lower() for w in answer.split()}
    return 1.0 if ended and words & set(COLOURS) else 0.0


TASKS = {
    "word_limit": Task(
        "word_limit",
        "at most five words, the answer ending by itself (base 7-17%)",
        lambda topic: f"Describe {topic} in at most five words.",
        _word_limit,
        640,
    ),
    "lowercase": Task(
        "lowercase",
        "one sentence, all in lowercase letters (base about 5%)",
        lambda topic: f"Describe {topic} in one sentence, all in lowercase letters.",
        _lowercase,
        800,
    ),
    "colour": Task(
        "colour",
        "content: one sentence that names a colour, ending by itself",
        lambda topic: f"Describe {topic} in one sentence that names its colour.",
        _names_a_colour,
        640,
    ),
}


def eval_plan() -> tuple[list[str], int]:
    """The held-out prompts and the answers per prompt that make EVAL_SAMPLES samples."""
    topics = EVAL_TOPICS[: max(1, min(len(EVAL_TOPICS), EVAL_SAMPLES))]
    return topics, max(1, EVAL_SAMPLES // len(topics))


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def wilson(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a success rate: honest at small n and near 0 or 1."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class Evaluation:
    successes: float
    n: int

    @property
    def rate(self) -> float:
        return self.successes / self.n if self.n else math.nan

    def text(self) -> str:
        low, high = wilson(self.successes, self.n)
        return f"{self.rate:.1%} [{low:.0%}, {high:.0%}]"


@dataclass
class LoopResult:
    before: Evaluation
    after: Evaluation
    samples: int
    wall_s: float
    notes: list[str] = field(default_factory=list)
    adapter_dir: Path | None = None  # the bare loop's final LoRA, for the product's server to evaluate
    # The product's run only: the bare loop's final LoRA evaluated at the product's inference server,
    # the one evaluator every gain ratio is read on (see `gain_ratio`).
    reference_after: Evaluation | None = None


def gain_ratio(product: LoopResult) -> float:
    """The product's gain over the bare loop's, both read by one evaluator: the product's
    inference server, on the same held-out prompts and request seeds, from the same base figure.

    Why not each loop's own evaluator: the bare loop samples in-process (transformers' generate)
    and the server with its own sampler, and on the same base model the two read different
    rates: colour 23.8% in-process against 28.8% at the server (1,024 samples each, four seeds
    each, 2026-12-07), a 5.0-point gap (2.6 standard errors). A ratio of gains read by two
    evaluators charges that gap to one side."""
    reference = product.reference_after
    if reference is None:
        return math.nan
    bare_gain = reference.rate - product.before.rate
    return (product.after.rate - product.before.rate) / bare_gain if bare_gain > 0 else math.nan


# --------------------------------------------------------------------------- the bare loop


class BareLoop:
    """On-policy GRPO with torch and peft, nothing of Apprentice's trainer."""

    def __init__(self, model_dir: Path, threads: int, seed: int) -> None:
        import torch
        from peft import LoraConfig, get_peft_model

        from learner.models import load_base_model

        torch.manual_seed(seed)
        torch.set_num_threads(threads)
        base, self.tokenizer = load_base_model(str(model_dir), device="cpu", dtype="float32")
        self.tokenizer.padding_side = "left"
        config = LoraConfig(
            r=8, lora_alpha=16, lora_dropout=0.0, target_modules=list(ALL_LINEAR_PROJECTIONS), task_type="CAUSAL_LM"
        )
        self.model = get_peft_model(base, config)
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad], lr=LR, weight_decay=0.0
        )
        self.torch = torch

    def sample(self, prompts: list[str], per_prompt: int) -> tuple[Any, Any, list[str], list[bool]]:
        """`per_prompt` answers to each prompt: (sequences, prompt length, texts, ended)."""
        torch = self.torch
        texts = [
            self.tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
            )
            for p in prompts
        ]
        encoded = self.tokenizer(texts, return_tensors="pt", padding=True)
        self.model.eval()
        with torch.no_grad():
            sequences = self.model.generate(
                **encoded,
                do_sample=True,
                temperature=TEMPERATURE,
                top_p=1.0,
                top_k=0,
                max_new_tokens=MAX_TOKENS,
                num_return_sequences=per_prompt,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        prompt_length = encoded["input_ids"].shape[1]
        answers, ended = [], []
        for row in sequences[:, prompt_length:]:
            tokens = row.tolist()
            stop = self.tokenizer.eos_token_id
            finished = stop in tokens
            answers.append(
                self.tokenizer.decode(tokens[: tokens.index(stop)] if finished else tokens, skip_special_tokens=True)
            )
            ended.append(finished)
        return sequences, prompt_length, answers, ended

    def step(self, prompts: list[str], task: Task) -> float:
        """One GRPO step; returns the mean reward of its samples."""
        torch = self.torch
        sequences, prompt_length, answers, ended = self.sample(prompts, GROUP_SIZE)
        rewards = torch.tensor([task.score(a, e) for a, e in zip(answers, ended, strict=True)])
        groups = rewards.view(len(prompts), GROUP_SIZE)
        advantages = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)).view(-1)
        if advantages.abs().sum() == 0:
            return float(rewards.mean())
        completion = sequences[:, prompt_length:]
        eos = self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id
        # Loss tokens: every generated token up to and including the first EOS.
        is_eos = (completion == eos).int()
        after_eos = (is_eos.cumsum(1) - is_eos) > 0
        loss_mask = (~after_eos).float()
        attention = torch.cat([(sequences[:, :prompt_length] != pad).long(), (~after_eos).long()], dim=1)
        self.model.train()
        logits = self.model(input_ids=sequences, attention_mask=attention).logits[:, prompt_length - 1 : -1]
        logp = torch.log_softmax(logits.float() / TEMPERATURE, dim=-1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
        # On-policy, one update per batch: the ratio exp(logp - logp_old) is 1, its gradient is
        # that of logp; the clipped objective reduces to the policy gradient.
        ratio = torch.exp(logp - logp.detach())
        loss = -((ratio * advantages.unsqueeze(1)) * loss_mask).sum() / loss_mask.sum()
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad], 1.0)
        self.optimizer.step()
        return float(rewards.mean())

    def evaluate(self, task: Task) -> Evaluation:
        topics, per_prompt = eval_plan()
        successes, n = 0.0, 0
        for start in range(0, len(topics), 8):
            prompts = [task.prompt(t) for t in topics[start : start + 8]]
            _, _, answers, ended = self.sample(prompts, per_prompt)
            successes += sum(task.score(a, e) for a, e in zip(answers, ended, strict=True))
            n += len(answers)
        return Evaluation(successes, n)


def run_bare(task: Task, model_dir: Path, samples: int, threads: int, seed: int) -> tuple[LoopResult, float]:
    """The bare loop's result and its rate of rewarded samples per second."""
    loop = BareLoop(model_dir, threads, seed)
    before = loop.evaluate(task)
    log(f"bare {task.name}: base {before.text()}")
    rng = random.Random(seed)
    steps = max(1, samples // (PROMPTS_PER_STEP * GROUP_SIZE))
    started = time.monotonic()
    for step in range(steps):
        prompts = [task.prompt(t) for t in rng.sample(TRAIN_TOPICS, PROMPTS_PER_STEP)]
        reward = loop.step(prompts, task)
        log(f"bare {task.name}: step {step + 1}/{steps} mean reward {reward:.2f}")
    wall = time.monotonic() - started
    after = loop.evaluate(task)
    done = steps * PROMPTS_PER_STEP * GROUP_SIZE
    log(f"bare {task.name}: {before.text()} -> {after.text()} in {wall:.0f}s ({done / wall:.2f} samples/s)")
    adapter_dir = Path(tempfile.mkdtemp(prefix=f"apprentice-bench-bare-{task.name}-{seed}-"))
    loop.model.save_pretrained(str(adapter_dir))
    return LoopResult(before, after, done, wall, adapter_dir=adapter_dir), done / wall


# --------------------------------------------------------------------------- the product


def product_config(data_dir: Path, port: int, model_port: int, scorer_url: str | None = None) -> dict[str, Any]:
    """The configuration `apprentice up` writes on first start, unchanged but for one check:
    it must train like the bare loop (learning rate, LoRA, one optimizer step per
    PROMPTS_PER_STEP groups), or the comparison would measure settings, not the loop.
    `scorer_url`: the exploring shapes' reward function; the policy then also declares
    exploration (EXPLORE_ANSWERS a call, a budget the traffic cannot exhaust: what it spent is
    reported) and the function, which scores the runs no webhook rewarded within its wait."""
    from apprentice.commands.up import default_config

    config = default_config(data_dir, port, model_port)
    policy = config["policies"][0]
    learning = policy["learning"]
    assert learning["lr"] == LR and learning["lora_rank"] == 8 and learning["lora_alpha"] == 16, learning
    assert learning["micro_batch_size"] * learning["grad_accumulation"] == PROMPTS_PER_STEP * GROUP_SIZE, learning
    assert policy["temperature"] == TEMPERATURE
    if scorer_url is not None:
        learning["exploration"] = {"extra_answers": EXPLORE_ANSWERS, "budget_tokens_per_hour": 1_000_000}
        policy["reward_functions"] = [{"name": "reward", "url": scorer_url, "max_calls_per_hour": 100_000}]
    return config


class TaskScorer:
    """The operator's reward function for the exploring shapes: an HTTP endpoint (in a thread of
    this process) that scores the answer it is sent by the task's own rule, as the agent does."""

    def __init__(self, task: Task) -> None:
        from tests.support.post_endpoint import PostEndpoint

        self.task = task
        self.scored = 0
        self.endpoint = PostEndpoint(self.answer)
        self.url = f"{self.endpoint.base_url}/score"

    def answer(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, str, bytes]:
        payload = json.loads(body)
        text = payload["answer"].get("content") or ""
        self.scored += 1
        score = self.task.score(text, payload.get("finish_reason") == "stop")
        return 200, "application/json", json.dumps({"score": score}).encode()

    def close(self) -> None:
        self.endpoint.close()


class Agent:
    """Knows only the base URL: runs tasks, scores them, posts rewards late and out of order."""

    def __init__(self, base_url: str, task: Task, rng: random.Random) -> None:
        from openai import AsyncOpenAI

        self.client = AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=2, timeout=120)
        self.http = httpx.AsyncClient(base_url=base_url, timeout=30)
        self.task = task
        self.rng = rng
        self.deliveries: list[asyncio.Task[None]] = []
        self.rewards: list[float] = []

    async def _call(self, messages: list[dict[str, str]], group: str | None) -> tuple[Any, float, str]:
        """One call: (the raw response, its score, the answer's text)."""
        raw = await self.client.chat.completions.with_raw_response.create(
            model=POLICY,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=MAX_TOKENS,
            extra_headers={"X-Group-Id": group} if group else None,
        )
        choice = raw.parse().choices[0]
        text = choice.message.content or ""
        return raw, self.task.score(text, choice.finish_reason == "stop"), text

    async def run(self, prompts: list[str], group: str | None) -> None:
        """One run: a call per prompt in one conversation, rewarded once with the mean score."""
        messages: list[dict[str, str]] = []
        scores, trajectory = [], None
        for prompt in prompts:
            messages.append({"role": "user", "content": prompt})
            raw, score, text = await self._call(messages, group)
            trajectory = trajectory or raw.headers["x-trajectory-id"]
            scores.append(score)
            messages.append({"role": "assistant", "content": text})
        reward = sum(scores) / len(scores)
        self.rewards.extend(scores)
        delay = self.rng.uniform(0.5, 8.0)
        self.deliveries.append(asyncio.create_task(self._post_later(trajectory, reward, delay)))

    async def _post_later(self, trajectory_id: str | None, reward: float, delay: float) -> None:
        await asyncio.sleep(delay)
        response = await self.http.post("/rewards", json={"trajectory_id": trajectory_id, "reward": reward})
        response.raise_for_status()

    async def close(self) -> None:
        await asyncio.gather(*self.deliveries)
        await self.http.aclose()
        await self.client.close()


def traffic_plan(task: Task, traffic: str, samples: int, seed: int) -> list[tuple[list[str], str | None]]:
    """The runs of one traffic shape: each run's prompts (one per call) and its group id, if any.
    Every shape asks for `samples` answers in all."""
    rng = random.Random(seed + 1)
    repeating = rng.sample(TRAIN_TOPICS, 16)
    few = rng.sample(TRAIN_TOPICS, 4)
    plan: list[tuple[list[str], str | None]] = []
    if traffic == "two_call":
        for index in range(samples // 2):
            group, member = divmod(index, GROUP_SIZE)
            if member == 0:
                first, second = rng.sample(TRAIN_TOPICS, 2)
            plan.append(([task.prompt(first), task.prompt(second)], f"{task.name}-{seed}-{group}"))
        return plan
    for index in range(samples):
        group, member = divmod(index, GROUP_SIZE)
        if traffic == "grouped":
            if member == 0:
                topic = rng.choice(TRAIN_TOPICS)
            plan.append(([task.prompt(topic)], f"{task.name}-{seed}-{group}"))
        elif traffic == "repeating16":
            if member == 0:
                topic = repeating[group % len(repeating)]
            plan.append(([task.prompt(topic)], f"{task.name}-{seed}-{group}"))
        elif traffic == "few":
            plan.append(([task.prompt(rng.choice(few))], None))
        elif traffic in ("unique", "unique_explore"):
            context = " and ".join(rng.sample(CONTEXT_WORDS, 2))
            plan.append(([f"{task.prompt(rng.choice(TRAIN_TOPICS))} Write it {context} (note {index}).".strip()], None))
        else:
            raise ValueError(f"unknown traffic {traffic!r}")
    return plan


async def drive(base_url: str, task: Task, traffic: str, samples: int, rate: float, seed: int) -> float:
    """Send the shape's runs at `rate` answers per second, without waiting for anything but the pace."""
    agent = Agent(base_url, task, random.Random(seed + 2))
    plan = traffic_plan(task, traffic, samples, seed)
    started = time.monotonic()
    running: list[asyncio.Task[None]] = []
    answers = 0
    for index, (prompts, group) in enumerate(plan):
        await asyncio.sleep(max(0.0, started + answers / rate - time.monotonic()))
        answers += len(prompts)
        running.append(asyncio.create_task(agent.run(prompts, group)))
        if index % 64 == 63:
            recent = agent.rewards[-64:]
            success = sum(recent) / max(1, len(recent))
            log(f"product {task.name}/{traffic}: {answers}/{samples} answers asked, recent success {success:.2f}")
    await asyncio.gather(*running)
    await agent.close()
    return time.monotonic() - started


async def evaluate_served(model_url: str, model: str, task: Task) -> Evaluation:
    """EVAL_SAMPLES answers of `model` at the inference server on the held-out prompts."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=model_url, api_key="bench", max_retries=2, timeout=300)
    topics, per_prompt = eval_plan()
    semaphore = asyncio.Semaphore(8)

    async def one(topic: str) -> float:
        async with semaphore:
            completion = await client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": task.prompt(topic)}],
                max_tokens=MAX_TOKENS,
                temperature=TEMPERATURE,
                n=per_prompt,
                seed=SEED,
            )
        return sum(task.score(c.message.content or "", c.finish_reason == "stop") for c in completion.choices)

    scores = await asyncio.gather(*(one(t) for t in topics))
    await client.close()
    return Evaluation(sum(scores), per_prompt * len(topics))


def evaluate_adapter(model_url: str, adapter: Path, task: Task) -> Evaluation:
    """Load a LoRA into the inference server (as vLLM's `/v1/load_lora_adapter`), evaluate it as
    `evaluate_served` does, and unload it."""
    name = "bench-bare-loop"
    root = model_url.removesuffix("/v1")
    loaded = httpx.post(
        f"{root}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(adapter)}, timeout=120
    )
    loaded.raise_for_status()
    try:
        return asyncio.run(evaluate_served(model_url, name, task))
    finally:
        httpx.post(f"{root}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=120)


def serving(gateway_url: str) -> dict[str, Any]:
    policies = httpx.get(f"{gateway_url}/v1/admin/policies", timeout=30).json()["data"]
    return next(p for p in policies if p["name"] == POLICY)


def exploration_spend(gateway_url: str, client_answers: int, scored: int) -> str:
    """What exploration generated beside the clients' answers, per client answer."""
    spend = httpx.get(f"{gateway_url}/v1/admin/policies/{POLICY}/exploration", timeout=30).json()
    day = spend["recorded_last_day"]
    return (
        f"exploration: {day['answers']} unserved answers to {day['explored_calls']} of {client_answers} client calls, "
        f"{day['tokens'] / client_answers:.1f} extra generated tokens a client call; reward function: {scored} scorings"
    )


def promotion_timeline(gateway_url: str, traffic_started: datetime) -> str:
    """When each version was promoted, and how far the lineage had gone by then (the lag).

    Read from the admin API at the end: each ever-promoted version's `promoted` transition,
    and the newest version created before it (the lineage's head when it was promoted)."""
    listed = httpx.get(f"{gateway_url}/v1/admin/policies/{POLICY}/versions", timeout=30).json()["data"]
    created = sorted((datetime.fromisoformat(v["created_at"]), v["version"]) for v in listed)
    events = []
    for version in listed:
        if version["status"] not in ("promoted", "retired"):
            continue
        detail = httpx.get(f"{gateway_url}/v1/admin/versions/{version['id']}", timeout=30).json()
        for transition in detail["transitions"]:
            if transition["to_status"] == "promoted":
                at = datetime.fromisoformat(transition["created_at"])
                newest = max((number for when, number in created if when <= at), default=version["version"])
                events.append((at, version["version"], newest))
    rejected = sum(v["status"] == "rejected" for v in listed)
    steps = [
        f"v{number} at {(at - traffic_started).total_seconds() / 60:.1f} min (newest then v{newest})"
        for at, number, newest in sorted(events)
    ]
    return f"promotions: {', '.join(steps) or 'none'}; {len(listed)} versions, {rejected} rejected"


def run_product(
    task: Task,
    traffic: str,
    samples: int,
    rate: float,
    settle_s: float,
    seed: int,
    keep: bool = False,
    bare_adapter: Path | None = None,
) -> LoopResult:
    """One product run of a traffic shape; `keep` leaves its directory (logs, database) for a post-mortem.
    `bare_adapter`: the bare loop's final LoRA, evaluated at this run's inference server beside the
    promoted version (LoopResult.reference_after)."""
    work = Path(tempfile.mkdtemp(prefix=f"apprentice-bench-{task.name}-{traffic}-"))
    port, model_port = free_port(), free_port()
    scorer = TaskScorer(task) if traffic.endswith("_explore") else None
    config = product_config(work / "data", port, model_port, scorer.url if scorer else None)
    config_path = work / "apprentice.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPRENTICE_") and k != "DATABASE_URL"}
    # The environment without APPRENTICE_* and DATABASE_URL: the database is up's embedded one.
    up = ManagedProcess(
        "apprentice up",
        [sys.executable, "-m", "apprentice.cli", "up", "--config", str(config_path)],
        work / "up.log",
        env=env,
        inherit_env=False,
        cwd=REPO,
    )
    gateway_url = f"http://127.0.0.1:{port}"
    model_url = f"http://127.0.0.1:{model_port}/v1"
    up.start()
    try:
        deadline = time.monotonic() + 900
        while "Apprentice is up" not in up.log_text():
            if not up.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"apprentice up did not start:\n{up.log_text()[-3000:]}")
            time.sleep(0.5)
        base_name = "HuggingFaceTB/SmolLM2-135M-Instruct"
        before = asyncio.run(evaluate_served(model_url, base_name, task))
        log(f"product {task.name}: base {before.text()}; traffic at {rate:.2f} samples/s")
        started, traffic_started = time.monotonic(), datetime.now(timezone.utc)
        asyncio.run(drive(f"{gateway_url}/v1", task, traffic, samples, rate, seed))
        time.sleep(settle_s)  # the last rewards' groups, the canary's last verdict
        wall = time.monotonic() - started
        policy = serving(gateway_url)
        promoted = (policy.get("promoted") or {}).get("name")
        head_name = (policy.get("lineage_head") or {}).get("name")
        notes = [
            f"promoted at the end: {promoted or 'none (base model)'}",
            f"lineage head: {head_name or 'base'}",
            promotion_timeline(gateway_url, traffic_started),
        ]
        after = before if promoted is None else asyncio.run(evaluate_served(model_url, promoted, task))
        canary = (policy.get("canary") or {}).get("name")
        if canary:
            head = asyncio.run(evaluate_served(model_url, canary, task))
            notes.append(f"canary {canary}: {head.text()}")
        if scorer is not None:
            notes.append(exploration_spend(gateway_url, samples, scorer.scored))
        reference = None if bare_adapter is None else evaluate_adapter(model_url, bare_adapter, task)
        if reference is not None:
            notes.append(f"the bare loop's final LoRA at this server: {reference.text()}")
        log(f"product {task.name}/{traffic}: {before.text()} -> {after.text()} in {wall:.0f}s; " + "; ".join(notes))
        return LoopResult(before, after, samples, wall, notes, reference_after=reference)
    finally:
        if scorer is not None:
            scorer.close()
        up.signal(2)  # Ctrl-C, as a person stops it
        up.wait_stopped(time.monotonic() + 90)
        if keep:
            log(f"product {task.name}/{traffic}: kept {work} (data/logs, data/pgdata)")
        else:
            shutil.rmtree(work, ignore_errors=True)


# --------------------------------------------------------------------------- report


Result = tuple[Task, str, int, LoopResult, LoopResult, float]  # task, traffic, seed, bare, product, rate


def report(results: list[Result], command: str, write: bool) -> None:
    rows = []
    for task, traffic, seed, bare, product, rate in results:
        rows.append(
            [
                f"{task.name}: {task.describe}",
                traffic,
                seed,
                bare.samples,
                f"{rate:.2f}/s",
                bare.before.text(),
                bare.after.text(),
                f"{bare.wall_s / 60:.1f} min",
                product.before.text(),
                product.after.text(),
                product.reference_after.text() if product.reference_after else "-",
                f"{product.wall_s / 60:.1f} min",
                f"{gain_ratio(product):.2f}",
                f"{product.wall_s / bare.wall_s:.2f}",
            ]
        )
    table = markdown_table(
        [
            "task",
            "traffic",
            "seed",
            "answers",
            "rate",
            "bare: before",
            "bare: after",
            "bare: wall",
            "product: before",
            "product: after (promoted)",
            "bare: after, at the product's server",
            "product: wall",
            "gain ratio",
            "wall ratio",
        ],
        rows,
    )
    notes = "\n".join(
        f"- {task.name}/{traffic}/seed {seed}: " + "; ".join(product.notes)
        for task, traffic, seed, _, product, _ in results
    )
    body = (
        f"{machine_line()}\n\nCommand: `{command}`\n\n{table}\n\n"
        f"Held-out success on {EVAL_SAMPLES} samples of {len(EVAL_TOPICS)} prompts neither loop trained on "
        "(Wilson 95% intervals). Gain ratio: (product after - product before) / (bare after at the product's "
        "server - product before): both loops' final versions and the base read by one evaluator, the "
        "product's inference server (same prompts, same request seeds; see `gain_ratio`); target at "
        "least 0.8. The bare loop's own in-process readings are its before/after columns. Wall ratio: "
        "product / bare; target at most 1.5. The product's traffic is paced at the "
        "bare loop's measured answer rate, rewards arrive 0.5-8 s late and shuffled, promotion is "
        "automatic (sequential test), at `apprentice up`'s shipped settings for every traffic shape (see the "
        f"module's docstring for the shapes).\n\n{notes}\n"
    )
    print(body)
    if write:
        write_section(section_title(sorted({traffic for _, traffic, *_ in results})), body)


def section_title(traffics: list[str]) -> str:
    """One section of docs/benchmarks.md per set of traffic shapes, so a run of one shape does
    not replace another's figures."""
    return SECTION_TITLE if traffics == ["grouped"] else f"{SECTION_TITLE} ({', '.join(traffics)} traffic)"


def main() -> None:
    global EVAL_SAMPLES
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", action="append", choices=sorted(TASKS), help="Repeatable; default: all.")
    parser.add_argument("--traffic", action="append", choices=TRAFFIC, help="Repeatable; default: grouped.")
    parser.add_argument("--seed", action="append", type=int, help="Repeatable; default: 0.")
    parser.add_argument("--samples", type=int, default=None, help="Rewarded samples per loop (default: per task).")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="torch threads of the bare loop.")
    parser.add_argument("--settle", type=float, default=45.0, help="Seconds after the traffic for the last verdict.")
    parser.add_argument("--eval-samples", type=int, default=EVAL_SAMPLES, help="Held-out samples per evaluation.")
    parser.add_argument("--no-write", action="store_true", help="Print only; leave docs/benchmarks.md alone.")
    parser.add_argument("--keep", action="store_true", help="Keep each product run's directory (logs, database).")
    args = parser.parse_args()
    EVAL_SAMPLES = args.eval_samples
    from learner.models import fetch_default_model

    model_dir = fetch_default_model()
    results: list[Result] = []
    for name in args.task or sorted(TASKS):
        task = TASKS[name]
        samples = args.samples or task.samples
        for seed in args.seed or [SEED]:
            bare, rate = run_bare(task, model_dir, samples, args.threads, seed)
            for traffic in args.traffic or ["grouped"]:
                product = run_product(task, traffic, bare.samples, rate, args.settle, seed, args.keep, bare.adapter_dir)
                results.append((task, traffic, seed, bare, product, rate))
                report(results, "python -m bench.learning_efficiency " + " ".join(sys.argv[1:]), False)
            if bare.adapter_dir is not None and not args.keep:
                shutil.rmtree(bare.adapter_dir, ignore_errors=True)
    report(results, "python -m bench.learning_efficiency " + " ".join(sys.argv[1:]), not args.no_write)


if __name__ == "__main__":
    main()
