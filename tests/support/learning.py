"""The shared harness of the real-model learning tests (tests/learner/test_*learning.py, distillation).

Each of those tests runs the same loop: the real SmolLM2 behind `apprentice serve-model`, a
gateway in front of it, calls sent with the official openai client (a fixed seed each), rewards
delivered late and shuffled through the signed webhook, `run_once` in-process, each candidate
promoted through the admin API, and held-out success measured straight at the server, base and
final on the same prompts and seeds. The task, prompts, reward rule and learner settings live
here once; the tests keep their own rounds, margins and assertions.

The base model's held-out answers are the same in every test that asks for them (same prompt,
seed, max_tokens, temperature: the server seeds each request), so `sample` keeps them for the
session: the second test that evaluates the base model on those prompts reads them, it does
not sample them again. Adapters are never cached (their names repeat across tests).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
POLICY = "writer"
WORD_LIMIT = 8
MAX_TOKENS = 16
ROUNDS = 4
TASKS_PER_ROUND = 8
SAMPLES_PER_TASK = 6
EVAL_PROMPTS = 40
WEBHOOK_SECRET = "whsec-learning-test"
# The arguments every learning test starts the SmolLM2 server with (one server per session).
SERVER_ARGS = ("--threads", "2", "--max-batch-size", "32")

THINGS = """the ocean, a cat, winter, coffee, the moon, a library, friendship, a bicycle, rain, music, a forest,
bread, the sun, a city, a river, chess, a volcano, a garden, snow, a train, a violin, the desert, a candle, honey,
a lighthouse, thunder, a bridge, an owl, autumn, a museum, tea, a mountain, a kite, the wind, a clock, an island,
a teacher, a market, fog, a dragon, a piano, spring, a whale, a castle, the stars, a map, a storm, a pencil, a
village, summer, a tiger, a harbor, a cloud, a dog, a mirror, chocolate, a rainbow, a painter, a song, a spider,
the night, a farm, a robot, a wave, a bee, a park, a ship, the sky, a hospital, a key, a puzzle, a bakery, a fox,
a glacier, a lake, an apple, a tree, a cave, a comet, a festival, a rose, a tower, silence, a kitchen, a camel,
a poem, the rainforest, a bell, a nest, a shadow, a canyon, a diary, a parrot, a meadow, a telescope, a lantern"""
ALL_THINGS = [t.strip() for t in THINGS.replace("\n", " ").split(",")]
TRAIN_THINGS = ALL_THINGS[: ROUNDS * TASKS_PER_ROUND]
EVAL_THINGS = ALL_THINGS[ROUNDS * TASKS_PER_ROUND : ROUNDS * TASKS_PER_ROUND + EVAL_PROMPTS]

LEARNING: dict[str, Any] = {
    "lr": 3e-4,
    "epochs": 1,
    "micro_batch_size": 8,
    "grad_accumulation": 2,
    "min_group_size": 4,
    "reward_wait_s": 0,
    "advantage": "grpo",
    "aggregation": "token",
    "eps_low": 0.2,
    "eps_high": 0.28,
    "tis_cap": 2.0,
    "lora_rank": 8,
    "lora_alpha": 16,
    "seed": 0,
}


def prompt(thing: str) -> str:
    return f"Describe {thing} in {WORD_LIMIT} words or fewer."


def reward_of(text: str, finish_reason: str | None) -> float:
    """Verifiable: the answer ended by itself and has 1 to WORD_LIMIT words."""
    return 1.0 if finish_reason == "stop" and 1 <= len(text.split()) <= WORD_LIMIT else 0.0


def round_things(round_number: int) -> list[str]:
    """The training prompts of one round: TASKS_PER_ROUND things no other round sends."""
    return TRAIN_THINGS[round_number * TASKS_PER_ROUND : (round_number + 1) * TASKS_PER_ROUND]


def round_seeds(round_number: int) -> tuple[int, ...]:
    """SAMPLES_PER_TASK seeds per prompt (one GRPO group), different in every round."""
    return tuple(1000 * round_number + i for i in range(SAMPLES_PER_TASK))


# (model, prompt text, seed, max_tokens) -> (text, finish_reason) of the base model, for the session.
_BASE_ANSWERS: dict[tuple[str, str, int, int], tuple[str, str | None]] = {}


def sample(
    client: Any,
    model: str,
    things: list[str],
    seeds: tuple[int, ...],
    *,
    raw: bool,
    prompt_of: Callable[[str], str] = prompt,
    score: Callable[[str, str | None], float] = reward_of,
) -> list[dict[str, Any]]:
    """One call per (thing, seed), 32 at a time so that the server batches them.

    raw: through the gateway, reading the trajectory id from `x-trajectory-id`. Otherwise
    straight at the server at temperature 1; the base model's answers are kept for the session
    (see the module docstring)."""

    def one(job: tuple[str, int]) -> dict[str, Any]:
        thing, seed = job
        messages = [{"role": "user", "content": prompt_of(thing)}]
        key = (model, messages[0]["content"], seed, MAX_TOKENS)
        trajectory = None
        if raw:
            answer = client.chat.completions.with_raw_response.create(
                model=model, messages=messages, max_tokens=MAX_TOKENS, seed=seed
            )
            completion, trajectory = answer.parse(), answer.headers["x-trajectory-id"]
            text, finish = completion.choices[0].message.content or "", completion.choices[0].finish_reason
        elif model == BASE and key in _BASE_ANSWERS:
            text, finish = _BASE_ANSWERS[key]
        else:
            completion = client.chat.completions.create(
                model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=1.0, seed=seed
            )
            text, finish = completion.choices[0].message.content or "", completion.choices[0].finish_reason
            if model == BASE:
                _BASE_ANSWERS[key] = (text, finish)
        return {
            "thing": thing,
            "seed": seed,
            "text": text,
            "finish_reason": finish,
            "trajectory_id": trajectory,
            "at": time.time(),
            "reward": score(text, finish),
        }

    jobs = [(thing, seed) for thing in things for seed in seeds]
    with ThreadPoolExecutor(32) as pool:
        return list(pool.map(one, jobs))


def success_rate(results: list[dict[str, Any]]) -> float:
    return sum(r["reward"] for r in results) / len(results)


def post_rewards(gateway_url: str, items: list[dict[str, Any]]) -> None:
    """Signed webhook delivery (Apprentice-Signature, Stripe's scheme)."""
    body = json.dumps({"rewards": items}).encode()
    stamp = int(time.time())
    signature = hmac.new(WEBHOOK_SECRET.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
    answer = httpx.post(
        f"{gateway_url}/v1/rewards",
        content=body,
        timeout=60,
        headers={"Content-Type": "application/json", "Apprentice-Signature": f"t={stamp},v1={signature}"},
    )
    assert answer.status_code == 200, answer.text


def reward_items(results: list[dict[str, Any]], round_number: int) -> list[dict[str, Any]]:
    items = []
    for r in results:
        item = {
            "trajectory_id": r["trajectory_id"],
            "reward": r["reward"],
            "timestamp": r["at"],
            "idempotency_key": f"{r['trajectory_id']}:reward",
        }
        if TRAIN_THINGS.index(r["thing"]) % 2 == 0:  # half the groups are named by the sender, half by their task
            item["group_id"] = f"round-{round_number}-{r['thing']}"
        items.append(item)
    return items


def deliver_late(gateway_url: str, items: list[dict[str, Any]], rng: random.Random) -> threading.Thread:
    """Rewards trickle in over a few seconds, out of order, in small batches."""
    shuffled = items[:]
    rng.shuffle(shuffled)

    def run() -> None:
        for start in range(0, len(shuffled), 12):
            time.sleep(rng.uniform(0.3, 1.2))
            post_rewards(gateway_url, shuffled[start : start + 12])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def linked_rewards(db: Any, trajectory_ids: list[str]) -> int:
    return db.execute(
        "SELECT count(*) FROM rewards WHERE trajectory_id = ANY(%s::uuid[]) AND status = 'linked' "
        "AND superseded_at IS NULL",
        (trajectory_ids,),
    ).fetchone()[0]


def learning_policy(endpoint: str, **extra: Any) -> dict[str, Any]:
    """The policy every learning test trains: SmolLM2 at `endpoint`, test_learning's learner settings."""
    return {
        "name": POLICY,
        "base_model": BASE,
        "endpoints": [endpoint],
        "temperature": 1.0,
        "learning": LEARNING,
        "promotion": {"kl_bound": 1.0},
        **extra,
    }


def openai_client(base_url: str) -> Any:
    """The official openai client as the learning tests use it: no retries, long timeouts (a loaded CPU)."""
    import openai

    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)


def start_learning_gateway(start_gateway: Any, policy: dict[str, Any], **config: Any) -> Any:
    """A gateway for `policy` that polls its serving versions every 0.2 s and takes signed webhook rewards."""
    return start_gateway(
        policies=[policy],
        adapter_poll_interval_s=0.2,
        rewards={"webhook_secrets": [{"secret": WEBHOOK_SECRET, "tenant": "local"}]},
        **config,
    )


@dataclass
class Rounds:
    """The learner's side of each round: `run_once` in-process, the candidate promoted through the
    admin API (which loads it into the server), and a line of the timeline printed at the end."""

    settings: Any
    gateway: Any
    label: str
    started: float = field(default_factory=time.monotonic)
    outcomes: list[Any] = field(default_factory=list)
    timeline: list[str] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # rounds with every group solved (see train_and_promote)

    def mark(self, what: str) -> None:
        self.timeline.append(f"{what} {time.monotonic() - self.started:.0f}s")

    def train_and_promote(self, round_number: int, note: str = "", *, may_be_solved: bool = False) -> Any:
        """run_once, then promote its candidate; `note` goes in the round's timeline line.

        may_be_solved: a round whose every group got equal rewards (all solved, late in a run) has
        nothing to teach, and the learner rightly skips it; allowed only where the caller says so,
        and only for that reason. Nothing is promoted then and `final` stays the last candidate."""
        from learner.jobs.run import run_once

        outcome = run_once(self.settings, self.settings.policies[0].name, trigger=f"{self.label}-round-{round_number}")
        if may_be_solved and outcome.status == "skipped":
            assert outcome.error == "no group with a learning signal", (outcome.error, outcome.metrics)
            self.skipped.append(round_number)
            self.timeline.append(f"round {round_number} {self.elapsed:.0f}s {note} skipped: {outcome.error}")
            return outcome
        assert outcome.status == "succeeded", (outcome.status, outcome.error, outcome.metrics)
        self.outcomes.append(outcome)
        promoted = httpx.post(
            f"{self.gateway.base_url}/admin/versions/{outcome.version_name}/promote",
            timeout=120,
            json={"reason": self.label},
        )
        assert promoted.status_code == 200, promoted.text
        time.sleep(0.6)  # the gateway polls serving versions every 0.2 s
        train = outcome.metrics["train"]
        self.timeline.append(
            f"round {round_number} {self.elapsed:.0f}s {note} loss {train['loss']:.4f} steps {train['optimizer_steps']}"
        )
        return outcome

    @property
    def final(self) -> str:
        return self.outcomes[-1].version_name

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started
