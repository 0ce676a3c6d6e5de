"""The product loop learns: SmolLM2-135M-Instruct gets better at a verifiable task from its own traffic.

Real processes throughout: `apprentice serve-model` (the real SmolLM2) is the policy's endpoint
behind a real gateway; the official openai client sends the calls (a fixed seed each, so the run
is reproducible); rewards arrive through the signed webhook a few seconds late, shuffled, and one
group's rewards only after the learner has run (stale data for the next round, sampled by an
older adapter); the learner runs in-process (`run_once`, as `apprentice learn` does);
each candidate is promoted through the admin API, which loads it into the server, and the
gateway then routes the policy's calls to it (on-policy rounds).

The task: "Describe X in 8 words or fewer." Reward 1 when the answer ends by itself (not cut at
max_tokens) within 8 words. The base model manages that about one time in five.

Success is measured on prompts no round trained on, base and final candidate on the same
prompts and seeds, straight at the inference server.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import wait_for
from tests.support.processes import ModelServerProcess

POLICY = "writer"
BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
WORD_LIMIT = 8
MAX_TOKENS = 16
ROUNDS = 4
TASKS_PER_ROUND = 8
SAMPLES_PER_TASK = 6
EVAL_PROMPTS = 40
EVAL_SEEDS = (11,)
WEBHOOK_SECRET = "whsec-learning-test"
MARGIN = 0.25
BUDGET_S = 600

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

LEARNING = {
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


def sample(client: Any, model: str, things: list[str], seeds: tuple[int, ...], *, raw: bool) -> list[dict[str, Any]]:
    """One call per (thing, seed), 32 at a time so that the server batches them."""

    def one(job: tuple[str, int]) -> dict[str, Any]:
        thing, seed = job
        messages = [{"role": "user", "content": prompt(thing)}]
        if raw:
            answer = client.chat.completions.with_raw_response.create(
                model=model, messages=messages, max_tokens=MAX_TOKENS, seed=seed
            )
            completion, trajectory = answer.parse(), answer.headers["x-trajectory-id"]
        else:
            completion = client.chat.completions.create(
                model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=1.0, seed=seed
            )
            trajectory = None
        choice = completion.choices[0]
        text = choice.message.content or ""
        return {
            "thing": thing,
            "seed": seed,
            "text": text,
            "trajectory_id": trajectory,
            "at": time.time(),
            "reward": reward_of(text, choice.finish_reason),
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


@pytest.fixture
def model_server(smollm2_dir: Path, tmp_path: Path):
    server = ModelServerProcess(tmp_path, smollm2_dir, BASE, "--threads", "2", "--max-batch-size", "32")
    server.start()
    yield server
    server.stop()


def test_the_learner_improves_the_policy_from_its_own_rewarded_traffic(
    model_server, start_gateway, database_url, db, tmp_path, capsys
):
    import openai
    import torch

    from apprentice.settings import Settings
    from learner.jobs.run import run_once

    started = time.monotonic()
    torch.set_num_threads(2)
    rng = random.Random(7)
    policy = {
        "name": POLICY,
        "base_model": BASE,
        "endpoints": [model_server.api_base],
        "temperature": 1.0,
        "learning": LEARNING,
        "promotion": {"kl_bound": 1.0},
    }
    gateway = start_gateway(
        policies=[policy],
        adapter_poll_interval_s=0.2,
        rewards={"webhook_secrets": [{"secret": WEBHOOK_SECRET, "tenant": "local"}]},
    )
    through_gateway = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=300)
    direct = openai.OpenAI(base_url=model_server.api_base, api_key="unused", max_retries=0, timeout=300)
    settings = Settings(database_url=database_url, data_dir=tmp_path / "learner", policies=[policy])

    base_results = sample(direct, BASE, EVAL_THINGS, EVAL_SEEDS, raw=False)
    base_rate = success_rate(base_results)
    timeline = [f"base eval {time.monotonic() - started:.0f}s"]

    held_back: list[dict[str, Any]] = []
    outcomes = []
    round_rates = []
    for round_number in range(ROUNDS):
        things = TRAIN_THINGS[round_number * TASKS_PER_ROUND : (round_number + 1) * TASKS_PER_ROUND]
        seeds = tuple(1000 * round_number + i for i in range(SAMPLES_PER_TASK))
        results = sample(through_gateway, POLICY, things, seeds, raw=True)
        round_rates.append(success_rate(results))
        late_thing = things[-1] if round_number < ROUNDS - 1 else None  # its rewards come after the learner ran
        on_time = [r for r in results if r["thing"] != late_thing]
        delivery = deliver_late(gateway.url, reward_items(on_time, round_number) + held_back, rng)
        expected = [r["trajectory_id"] for r in on_time] + [i["trajectory_id"] for i in held_back]
        delivery.join()
        wait_for(
            lambda expected=expected: linked_rewards(db, expected) == len(expected),
            timeout=60,
            message="rewards linked",
        )
        held_back = reward_items([r for r in results if r["thing"] == late_thing], round_number)

        outcome = run_once(settings, POLICY, trigger=f"test-round-{round_number}")
        assert outcome.status == "succeeded", (outcome.status, outcome.error, outcome.metrics)
        outcomes.append(outcome)
        promoted = httpx.post(
            f"{gateway.base_url}/admin/versions/{outcome.version_name}/promote",
            timeout=120,
            json={"reason": "learning test"},
        )
        assert promoted.status_code == 200, promoted.text
        time.sleep(0.6)  # the gateway polls serving versions every 0.2 s
        timeline.append(
            f"round {round_number} {time.monotonic() - started:.0f}s rate {round_rates[-1]:.2f} "
            f"loss {outcome.metrics['train']['loss']:.4f} steps {outcome.metrics['train']['optimizer_steps']}"
        )

    final = outcomes[-1].version_name
    final_results = sample(direct, final, EVAL_THINGS, EVAL_SEEDS, raw=False)
    final_rate = success_rate(final_results)
    elapsed = time.monotonic() - started

    runs = db.execute(
        "SELECT status, trajectories, groups, groups_equal_rewards, groups_greedy, tokens, "
        "clip_fraction, metrics->'train'->>'tis_mean', metrics->'train'->>'behaviour_gap' "
        "FROM training_runs ORDER BY started_at"
    ).fetchall()
    with capsys.disabled():
        print(
            f"\nlearning test: base {base_rate:.3f} -> {final} {final_rate:.3f} on {len(base_results)} samples of "
            f"{len(EVAL_THINGS)} fresh prompts; rounds {[round(r, 2) for r in round_rates]}; {elapsed:.0f}s"
        )
        print("  " + "; ".join(timeline))
        for run in runs:
            print("  run", run)

    # the loop really ran as production would: routed to each new version, stale data corrected
    served = db.execute(
        "SELECT count(DISTINCT adapter_version_id) FROM calls WHERE policy = %s AND adapter_version_id IS NOT NULL",
        (POLICY,),
    ).fetchone()[0]
    assert served == ROUNDS - 1, "rounds after the first were served by the newly promoted adapter"
    stale = db.execute(
        "SELECT count(*) FROM trajectories t JOIN training_runs r ON r.id = t.trained_in_run_id "
        "WHERE t.adapter_version_id IS DISTINCT FROM r.from_version_id"
    ).fetchone()[0]
    assert stale >= SAMPLES_PER_TASK, "late rewards trained a later run on data an older version sampled"
    assert all(run[0] == "succeeded" for run in runs)

    assert len(EVAL_THINGS) >= 32 and not set(EVAL_THINGS) & set(TRAIN_THINGS)
    assert final_rate >= base_rate + MARGIN, (base_rate, final_rate)
    assert elapsed < BUDGET_S, f"the learning test took {elapsed:.0f}s"
