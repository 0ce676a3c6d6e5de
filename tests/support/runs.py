"""Learner runs against PostgreSQL without a gateway: trajectories, calls and rewards written as the
gateway records them (exact token ids and logprobs), a set of groups that selection must sort
(useful, equal rewards, too small, another model's), and the settings of a policy on the tiny model.

Used by tests/learner/test_grpo_run.py, test_lineage_runs.py, test_learning_faults.py and
test_distributed_launchers.py; the `base` fixture (the tiny model's directory) is in
tests/learner/conftest.py.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
from psycopg.types.json import Jsonb

from apprentice.settings import Settings


def settings_for(database_url: str, data_dir: Path, base_model: str, **learning) -> Settings:
    learning = {"lr": 1e-3, "micro_batch_size": 4, "grad_accumulation": 2, "reward_wait_s": 0, **learning}
    return Settings(
        database_url=database_url,
        data_dir=data_dir,
        policies=[
            {"name": "p", "base_model": base_model, "endpoints": ["http://127.0.0.1:9/v1"], "learning": learning}
        ],
    )


def add_trajectory(
    db: psycopg.Connection,
    *,
    task: str,
    answer: list[int],
    reward: float | None,
    base_model: str,
    upstream_model: str | None = None,
    group_id: str | None = None,
    tenant: str = "acme",
    temperature: float = 1.0,
    version: str | None = None,
) -> str:
    trajectory = str(uuid.uuid4())
    db.execute(
        "INSERT INTO trajectories (id, tenant, model, policy, group_id, first_call_at, last_call_at, call_count) "
        "VALUES (%s, %s, 'p', 'p', %s, now(), now(), 1)",
        (trajectory, tenant, group_id),
    )
    request = {"model": "p", "messages": [{"role": "user", "content": task}]}
    prompt = [1, 9, 17, 33, 2, 4] + [100 + len(task)]
    response = {
        "id": "chatcmpl-x",
        "prompt_token_ids": prompt,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": str(answer)},
                "token_ids": answer,
                "logprobs": {"content": [{"token": "t", "logprob": -3.0} for _ in answer]},
            }
        ],
    }
    db.execute(
        "INSERT INTO calls (id, trajectory_id, tenant, model, policy, upstream_model, adapter_version_id, "
        "created_at, status_code, request, response, temperature) "
        "VALUES (%s, %s, %s, 'p', 'p', %s, %s, now(), 200, %s, %s, %s)",
        (
            str(uuid.uuid4()),
            trajectory,
            tenant,
            upstream_model or base_model,
            version,
            Jsonb(request),
            Jsonb(response),
            temperature,
        ),
    )
    if reward is not None:
        db.execute(
            "INSERT INTO rewards (id, tenant, target_kind, target, trajectory_id, status, linked_at, value, "
            "content_hash, source, observed_at) VALUES (%s, %s, 'trajectory', %s, %s, 'linked', now(), %s, "
            "'\\x00', 'key', now())",
            (str(uuid.uuid4()), tenant, trajectory, trajectory, reward),
        )
    return trajectory


def populate(db, base) -> dict[str, list[str]]:
    ids: dict[str, list[str]] = {"useful": [], "equal": [], "small": [], "foreign": []}
    for i, reward in enumerate([1.0, 0.0, 1.0, 0.0]):
        ids["useful"].append(add_trajectory(db, task="task A", answer=[50 + i, 60, 2], reward=reward, base_model=base))
    for i in range(3):
        ids["equal"].append(add_trajectory(db, task="task B", answer=[70 + i, 2], reward=1.0, base_model=base))
    ids["small"].append(add_trajectory(db, task="task C", answer=[80, 2], reward=1.0, base_model=base))
    for i, reward in enumerate([1.0, 0.0]):
        ids["foreign"].append(
            add_trajectory(
                db, task="task D", answer=[90 + i, 2], reward=reward, base_model=base, upstream_model="gpt-4o"
            )
        )
    add_trajectory(db, task="task A", answer=[99, 2], reward=None, base_model=base)  # unrewarded: not used
    return ids


def trained(db, ids: list[str]) -> list[str | None]:
    rows = dict(
        db.execute(
            "SELECT id::text, trained_in_run_id::text FROM trajectories WHERE id = ANY(%s::uuid[])", (ids,)
        ).fetchall()
    )
    return [rows[i] for i in ids]
