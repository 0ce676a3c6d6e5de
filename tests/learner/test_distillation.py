"""Warm start from a teacher (docs/distillation.md): SmolLM2 learns a hidden rule from the answers a
hosted teacher gave on its behalf, takes over by the automatic canary, then keeps learning by RL.

Real processes throughout: `apprentice serve-model` (the real SmolLM2) is the policy's endpoint,
the fake upstream plays the hosted teacher ("teacher-rule": answers "In short: X is Y." three
times in four, rambles otherwise, tests/support/fake_teacher.py), a real gateway routes the
policy's calls and PostgreSQL records them; rewards arrive by the signed webhook.

1. Teacher phase: the policy has no version, so the teacher answers every call to "writer".
2. Distillation: `run_distillation` (kind sft) keeps the teacher's answers rewarded 1
   (min_reward) and fine-tunes SmolLM2's LoRA on them; the promotion tick gates it and starts
   its canary (loading it into the server).
3. Held-out success (prompts neither phase saw, straight at the server, same seeds for base and
   distilled) rises from the base rate (the rule is never stated: about 0) toward the teacher's.
4. Canary: half the runs go to the distilled version, half to the teacher; the automatic
   promotion tick promotes it (takeover) when it is not worse than the teacher within the
   margin, and says what it saves per call (both prices known).
5. RL continues from the distilled version: after takeover the reward also prefers a warm
   adjective (something the teacher never optimised); an RL run (kind rl) on the policy's own
   samples trains from the distilled version and records a child of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.conftest import wait_for
from tests.support.fake_teacher import RULE_PREFIX, follows_rule
from tests.support.learning import (
    ALL_THINGS,
    BASE,
    POLICY,
    WEBHOOK_SECRET,
    deliver_late,
    linked_rewards,
    openai_client,
    sample,
)

pytestmark = pytest.mark.learning

TEACHER = "teacher"
TEACHER_THINGS = ALL_THINGS[:20]
TEACHER_SEEDS = (0, 1, 2, 3)  # seed 3: the teacher rambles (reward 0)
CANARY_THINGS = ALL_THINGS[24:44]
CANARY_SEEDS = (10, 11, 12, 13)  # a further batch adds 4 to each
CANARY_BATCHES = 3
RL_THINGS = ALL_THINGS[44:50]
RL_SEEDS = (20, 21, 22, 23)
EVAL_THINGS = ALL_THINGS[70:90]
EVAL_SEEDS = (5,)
MARGIN = 0.4  # distilled held-out success >= base + MARGIN
TAKEOVER_MARGIN = 0.3
# Measured: 580 s with the machine's load average at 8-9 on its 2 cores (teacher phase and base
# eval 48 s, distillation and canary start 190 s, distilled eval 64 s, canary 119 s, RL phase and
# run 158 s); 872 s at load 11-12 with a larger teacher phase. The server and the trainer share
# the cores with everything else running there.
BUDGET_S = 900

LEARNING = {
    "lr": 1e-4,
    "micro_batch_size": 8,
    "grad_accumulation": 2,
    "min_group_size": 3,
    "reward_wait_s": 0,
    "lora_rank": 8,
    "lora_alpha": 16,
    "seed": 0,
}


# After takeover the operator's reward also prefers a warm description (half the teacher's adjectives):
# something the teacher never optimised, for RL to improve on (groups whose answers differ in it).
WARM = {"bright", "warm", "lovely", "gentle", "calm"}


def reward_of(text: str, finish_reason: str | None) -> float:
    return 1.0 if follows_rule(text, finish_reason) else 0.0


def rl_reward_of(text: str, finish_reason: str | None) -> float:
    words = text.strip().rstrip(".").split()
    return reward_of(text, finish_reason) * (1.5 if words and words[-1].lower() in WARM else 1.0)


def send(
    client: Any, things: list[str], seeds: tuple[int, ...], score: Callable[[str, str | None], float] = reward_of
) -> list[dict[str, Any]]:
    """Through the gateway (raw, for the trajectory id), rewarded by the hidden rule."""
    from concurrent.futures import ThreadPoolExecutor

    def one(job: tuple[str, int]) -> dict[str, Any]:
        thing, seed = job
        answer = client.chat.completions.with_raw_response.create(
            model=POLICY,
            messages=[{"role": "user", "content": f"Describe {thing} in 8 words or fewer."}],
            max_tokens=16,
            seed=seed,
        )
        completion = answer.parse()
        choice = completion.choices[0]
        text = choice.message.content or ""
        return {
            "thing": thing,
            "trajectory_id": answer.headers["x-trajectory-id"],
            "text": text,
            "at": time.time(),
            "reward": score(text, choice.finish_reason),
        }

    with ThreadPoolExecutor(32) as pool:
        return list(pool.map(one, [(t, s) for t in things for s in seeds]))


def deliver(gateway: Any, db: Any, results: list[dict[str, Any]]) -> None:
    import random

    items = [
        {"trajectory_id": r["trajectory_id"], "reward": r["reward"], "idempotency_key": f"{r['trajectory_id']}:r"}
        for r in results
    ]
    deliver_late(gateway.url, items, random.Random(3)).join()
    ids = [r["trajectory_id"] for r in results]
    wait_for(lambda: linked_rewards(db, ids) == len(ids), timeout=60, message="rewards linked")


def probe(client: Any) -> str:
    """The model that serves a new run of the policy now (an unrewarded one-token call)."""
    completion = client.chat.completions.create(
        model=POLICY, messages=[{"role": "user", "content": "Describe a probe."}], max_tokens=1
    )
    return completion.model


def held_out(client: Any, model: str) -> float:
    """Success by the hidden rule on prompts no phase sent, at temperature 1 with fixed seeds.

    `sample` (tests/support/learning.py) scores its word limit: 1 means the answer ended by itself within
    8 words; the rule also needs the prefix."""
    results = sample(client, model, EVAL_THINGS, EVAL_SEEDS, raw=False)
    return sum(r["reward"] == 1.0 and r["text"].strip().startswith(RULE_PREFIX) for r in results) / len(results)


def test_distil_from_the_teacher_take_over_by_canary_then_continue_by_rl(
    model_server, start_gateway, fake_upstream, database_url, db, tmp_path, capsys
):
    import torch

    from apprentice.promotion.tick import run_promotion_tick
    from apprentice.settings import Settings
    from learner.jobs.distill import run_distillation
    from learner.jobs.policy_trainer import PolicyTrainer
    from learner.jobs.run import run_once

    started = time.monotonic()
    torch.set_num_threads(2)
    teacher_entry = {
        "model_name": TEACHER,
        "litellm_params": {"model": "openai/teacher-rule", "api_base": fake_upstream.api_base, "api_key": "sk-t"},
        "model_info": {"input_cost_per_token": 1.5e-7, "output_cost_per_token": 6e-7},
    }
    policy = {
        "name": POLICY,
        "base_model": BASE,
        "endpoints": [model_server.api_base],
        "temperature": 1.0,
        "learning": LEARNING,
        "promotion": {
            "canary_share": 0.5,
            "min_samples": 16,
            "confidence": 0.9,
            "method": "sequential",
            "kl_bound": 1.0,
        },
        "teacher": {
            "model": TEACHER,
            "takeover_margin": TAKEOVER_MARGIN,
            "distill": {"min_reward": 1.0, "top_share": None, "min_trajectories": 16, "lr": 1e-3, "epochs": 2},
        },
        "model_info": {"input_cost_per_token": 1e-8, "output_cost_per_token": 1e-8},
    }
    gateway = start_gateway(
        model_list=[teacher_entry],
        policies=[policy],
        adapter_poll_interval_s=0.2,
        rewards={"webhook_secrets": [{"secret": WEBHOOK_SECRET, "tenant": "local"}]},
    )
    settings = Settings(
        database_url=database_url, data_dir=tmp_path / "learner", model_list=[teacher_entry], policies=[policy]
    )
    through_gateway, direct = openai_client(gateway.base_url), openai_client(model_server.api_base)
    timeline: list[str] = []

    def mark(what: str) -> None:
        timeline.append(f"{what} {time.monotonic() - started:.0f}s")

    # 1. the teacher serves the policy's traffic; its calls and rewards are recorded under the policy
    teacher_results = send(through_gateway, TEACHER_THINGS, TEACHER_SEEDS)
    teacher_rate = sum(r["reward"] for r in teacher_results) / len(teacher_results)
    assert 0.7 <= teacher_rate <= 0.8, teacher_rate
    deliver(gateway, db, teacher_results)
    served = db.execute("SELECT DISTINCT upstream, adapter_version_id FROM calls WHERE policy = %s", (POLICY,))
    assert served.fetchall() == [(TEACHER, None)]
    base_rate = held_out(direct, BASE)
    mark("teacher phase and base eval")

    # 2. distillation: the teacher's answers rewarded 1, rendered with SmolLM2's template, SFT
    trainer = PolicyTrainer(settings.policy(POLICY))  # type: ignore[arg-type]
    distilled = run_distillation(settings, POLICY, trigger="test", trainer=trainer)
    assert distilled.status == "succeeded", (distilled.status, distilled.error, distilled.metrics)
    run = db.execute(
        "SELECT kind, trajectories, from_version_id, metrics->'distill' FROM training_runs WHERE id = %s",
        (distilled.run_id,),
    ).fetchone()
    good = sum(r["reward"] == 1.0 for r in teacher_results)
    assert run[0] == "sft" and run[1] == good and run[2] is None, run
    assert (
        run[3]["teacher"] == TEACHER and run[3]["chosen"] == good and run[3]["left_out"] == len(teacher_results) - good
    )
    trained = db.execute(
        "SELECT count(*) FROM trajectories WHERE trained_in_run_id = %s", (distilled.run_id,)
    ).fetchone()[0]
    assert trained == good, "the run marks exactly the teacher trajectories it trained on"
    tick = run_promotion_tick(settings, database_url, policies=[POLICY])
    assert not tick.errors, tick.errors
    status = db.execute("SELECT status FROM adapter_versions WHERE name = %s", (distilled.version_name,)).fetchone()
    assert status == ("canary",), "the distilled candidate passed the gates and serves the canary's share"
    mark("distilled + canary")

    # 3. held-out success rises from the base rate toward the teacher's
    distilled_rate = held_out(direct, distilled.version_name)  # type: ignore[arg-type]
    mark("distilled eval")

    # 4. canary against the teacher; the automatic tick decides the takeover
    canary_results = send(through_gateway, CANARY_THINGS, CANARY_SEEDS)
    deliver(gateway, db, canary_results)
    arms = dict(
        db.execute(
            "SELECT coalesce(adapter_version_id::text, upstream), count(*) FROM calls c "
            "WHERE policy = %s AND c.created_at > "
            "(SELECT min(created_at) FROM adapter_transitions WHERE to_status = 'canary') "
            "GROUP BY 1",
            (POLICY,),
        ).fetchall()
    )
    assert arms.get(TEACHER, 0) >= 16 and arms.get(distilled.version_id, 0) >= 16, arms
    # The tick waits while the interval is too wide to decide (its half-width is about 0.33 at
    # 40 runs an arm, and the arms are drawn at random); more traffic, as production would send,
    # until it decides or CANARY_BATCHES have been sent.
    for batch in range(1, CANARY_BATCHES + 1):
        tick = run_promotion_tick(settings, database_url, policies=[POLICY])
        version = db.execute(
            "SELECT status, evaluation FROM adapter_versions WHERE name = %s", (distilled.version_name,)
        ).fetchone()
        takeover = version[1]["takeover"]
        if version[0] != "canary" or batch == CANARY_BATCHES:
            break
        seeds = tuple(seed + 4 * batch for seed in CANARY_SEEDS)
        deliver(gateway, db, send(through_gateway, CANARY_THINGS, seeds))
    mark(f"canary ({batch} batch{'es' if batch > 1 else ''})")
    assert version[0] == "promoted", (tick.actions, tick.errors, takeover)
    assert takeover["decision"] == "promote" and "takes over from the teacher" in takeover["reason"]
    assert takeover["cost"]["saving_per_call"] > 0 and takeover["latency"]["policy_median_ms"] > 0
    reason = db.execute(
        "SELECT reason FROM adapter_transitions WHERE adapter_version_id = %s AND to_status = 'promoted'",
        (distilled.version_id,),
    ).fetchone()[0]
    assert "takes over from the teacher" in reason and "saves" in reason

    # 5. RL continues from the distilled version, on the policy's own traffic
    # The gateway re-reads the serving versions on NOTIFY and every 0.2 s; a probe tells when it has.
    wait_for(
        lambda: probe(through_gateway) == distilled.version_name, timeout=15, interval=0.2, message="takeover served"
    )
    rl_results = send(through_gateway, RL_THINGS, RL_SEEDS, rl_reward_of)
    deliver(gateway, db, rl_results)
    served = db.execute(
        "SELECT DISTINCT c.adapter_version_id::text FROM calls c WHERE c.trajectory_id = ANY(%s::uuid[])",
        ([r["trajectory_id"] for r in rl_results],),
    ).fetchall()
    assert served == [(distilled.version_id,)], "after takeover the distilled version serves every run"
    rl = run_once(settings, POLICY, trigger="test-rl", trainer=trainer)
    assert rl.status == "succeeded", (rl.status, rl.error, rl.metrics)
    rl_run = db.execute("SELECT kind, from_version_id::text FROM training_runs WHERE id = %s", (rl.run_id,)).fetchone()
    parent = db.execute(
        "SELECT parent_version_id::text FROM adapter_versions WHERE id = %s", (rl.version_id,)
    ).fetchone()[0]
    assert rl_run == ("rl", distilled.version_id) and parent == distilled.version_id
    assert rl.metrics["groups"]["usable"] >= 1, rl.metrics["groups"]
    mark("rl run")

    # the admin API shows the teacher, the distilled version and the comparison
    shown = httpx.get(f"{gateway.base_url}/admin/policies/{POLICY}/teacher", timeout=30)
    assert shown.status_code == 200, shown.text
    body = shown.json()
    assert body["teacher"]["model"] == TEACHER and body["status"] == "taken_over"
    assert [v["name"] for v in body["distilled_versions"]] == [distilled.version_name]
    assert body["comparison"]["cost"]["teacher_per_call"] > body["comparison"]["cost"]["policy_per_call"]

    elapsed = time.monotonic() - started
    with capsys.disabled():
        print(
            f"\ndistillation test: base {base_rate:.3f} -> distilled {distilled_rate:.3f} held out "
            f"({len(EVAL_THINGS)} prompts); teacher {teacher_rate:.3f}; "
            f"{distilled.metrics['train']['optimizer_steps']} SFT steps on {good} teacher answers; "
            f"takeover: {takeover['reason']}; {elapsed:.0f}s"
        )
        print("  " + "; ".join(timeline))
    assert distilled_rate >= base_rate + MARGIN, (base_rate, distilled_rate)
    assert elapsed < BUDGET_S, f"the distillation test took {elapsed:.0f}s"
