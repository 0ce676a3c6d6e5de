"""Learner runs along the training lineage: one long-lived trainer, chained versions, the staleness rule."""

from __future__ import annotations

import psycopg

from learner.jobs import run as run_module
from learner.jobs.policy_trainer import PolicyTrainer
from learner.jobs.run import run_once
from tests.support.runs import add_trajectory, populate, settings_for, trained


def group(db: psycopg.Connection, base: str, task: str, version: str | None = None) -> list[str]:
    """Four rewarded answers to one task (rewards 1, 0, 1, 0), sampled by `version` (None: the base model)."""
    return [
        add_trajectory(
            db,
            task=task,
            answer=[40 + i, 50 + len(task), 2],
            reward=float((i + 1) % 2),
            base_model=base,
            version=version,
        )
        for i in range(4)
    ]


def parent_of(db: psycopg.Connection, version_id: str) -> str | None:
    return db.execute("SELECT parent_version_id::text FROM adapter_versions WHERE id = %s", (version_id,)).fetchone()[0]


def lora_weights(trainer: PolicyTrainer) -> list:
    return [p.detach().clone() for p in trainer.model.parameters() if p.requires_grad]


def test_consecutive_runs_form_a_chain_in_one_trainer(database_url, db, base, tmp_path):
    settings = settings_for(database_url, tmp_path, base)
    trainer = PolicyTrainer(settings.policies[0])
    populate(db, base)
    first = run_once(settings, "p", trainer=trainer)
    assert first.status == "succeeded", first.error
    assert parent_of(db, first.version_id) is None and first.metrics["start"] == "fresh"
    steps_after_first = trainer.optimizer_steps()
    assert steps_after_first == first.metrics["train"]["optimizer_steps"] > 0

    fresh = group(db, base, "task E", version=first.version_id)  # sampled by the new candidate (the head)
    second = run_once(settings, "p", trainer=trainer)
    assert second.status == "succeeded", second.error
    assert parent_of(db, second.version_id) == first.version_id, "v2 continues v1, not the base model"
    assert (
        db.execute("SELECT from_version_id::text FROM training_runs WHERE id = %s", (second.run_id,)).fetchone()[0]
        == first.version_id
    )
    assert trained(db, fresh) == [second.run_id] * 4
    assert second.metrics["start"] == "continued" and not second.metrics["base_model_loaded"]
    assert (trainer.base_loads, trainer.adapter_loads) == (1, 1), "the model was loaded once for both runs"
    assert trainer.optimizer_steps() == steps_after_first + second.metrics["train"]["optimizer_steps"], (
        "AdamW's state carried over: its step count keeps growing"
    )
    assert trainer.version == second.version_id


def test_a_nan_run_leaves_the_trainer_as_it_was(database_url, db, base, tmp_path, monkeypatch):
    settings = settings_for(database_url, tmp_path, base)
    trainer = PolicyTrainer(settings.policies[0])
    populate(db, base)
    first = run_once(settings, "p", trainer=trainer)
    before, steps = lora_weights(trainer), trainer.optimizer_steps()
    ids = group(db, base, "task E", version=first.version_id)
    real = run_module.group_advantages
    monkeypatch.setattr(run_module, "group_advantages", lambda rewards, kind: [float("nan")] * len(rewards))
    aborted = run_once(settings, "p", trainer=trainer)
    assert aborted.status == "aborted" and trained(db, ids) == [None] * 4
    assert trainer.version == first.version_id and trainer.optimizer_steps() == steps
    assert all(bool((a == b).all()) for a, b in zip(before, lora_weights(trainer), strict=True)), (
        "the pre-run LoRA weights are back"
    )

    monkeypatch.setattr(run_module, "group_advantages", real)
    retry = run_once(settings, "p", trainer=trainer)
    assert retry.status == "succeeded" and retry.metrics["start"] == "continued"
    assert parent_of(db, retry.version_id) == first.version_id and trained(db, ids) == [retry.run_id] * 4


def test_after_the_lineage_is_rejected_the_next_run_starts_from_the_promoted_version(database_url, db, base, tmp_path):
    settings = settings_for(database_url, tmp_path, base)
    trainer = PolicyTrainer(settings.policies[0])
    populate(db, base)
    v1 = run_once(settings, "p", trainer=trainer)
    db.execute("UPDATE adapter_versions SET status = 'promoted' WHERE id = %s", (v1.version_id,))
    group(db, base, "task E", version=v1.version_id)
    v2 = run_once(settings, "p", trainer=trainer)
    group(db, base, "task F", version=v2.version_id)
    v3 = run_once(settings, "p", trainer=trainer)
    assert [parent_of(db, v.version_id) for v in (v2, v3)] == [v1.version_id, v2.version_id]
    assert v3.metrics["start"] == "continued" and trainer.adapter_loads == 1

    # the promotion job's verdict on a losing canary: every lineage version is rejected
    db.execute(
        "UPDATE adapter_versions SET status = 'rejected' WHERE id = ANY(%s::uuid[])", ([v2.version_id, v3.version_id],)
    )
    off_lineage = group(db, base, "task G", version=v3.version_id)
    on_lineage = group(db, base, "task H", version=v1.version_id)
    v4 = run_once(settings, "p", trainer=trainer)
    assert v4.status == "succeeded", v4.error
    assert parent_of(db, v4.version_id) == v1.version_id, "back to the promoted version"
    assert v4.metrics["start"] == "loaded" and not v4.metrics["base_model_loaded"]
    assert (trainer.base_loads, trainer.adapter_loads) == (1, 2)
    assert trainer.optimizer_steps() == v4.metrics["train"]["optimizer_steps"], "a fresh optimizer"
    assert trained(db, on_lineage) == [v4.run_id] * 4
    assert trained(db, off_lineage) == [v4.run_id] * 4, "consumed without training"
    assert v4.metrics["stale_trajectories"] == {"off_lineage": 4}
    assert v4.metrics["train"]["samples"] == 4


def test_data_older_than_max_staleness_is_consumed_without_training(database_url, db, base, tmp_path):
    populate(db, base)
    v1 = run_once(settings_for(database_url, tmp_path, base), "p")
    too_old = group(db, base, "task E")  # sampled by the base model: one version behind the head v1
    current = group(db, base, "task F", version=v1.version_id)
    second = run_once(settings_for(database_url, tmp_path, base, max_staleness=0), "p")
    assert second.status == "succeeded", second.error
    assert trained(db, too_old) == [second.run_id] * 4 and trained(db, current) == [second.run_id] * 4
    # with the base model's leftover of populate (a group too small to train, waiting for company)
    assert second.metrics["stale_trajectories"] == {"too_stale": 4} and second.metrics["train"]["samples"] == 4
    # a skipped run consumes stale data too: it does not pile up
    only_old = group(db, base, "task G")
    third = run_once(settings_for(database_url, tmp_path, base, max_staleness=0), "p")
    assert third.status == "skipped" and trained(db, only_old) == [third.run_id] * 4


def test_the_trigger_runs_back_to_back_while_runs_produce_candidates(database_url, db, base, tmp_path):
    from learner.jobs.scheduler import Learner

    settings = settings_for(database_url, tmp_path, base, min_new_groups=1)
    learner = Learner(settings)
    populate(db, base)
    group(db, base, "task E")
    last = learner.check_trigger(settings.policies[0])
    statuses = [o.status for o in learner.outcomes]
    # one run takes both usable groups; the next finds only groups that cannot train (too small,
    # another model's) and stops the series instead of spinning until the next poll
    assert statuses == ["succeeded", "skipped"] and last is learner.outcomes[-1]
    assert learner.trainers["p"].base_loads == 1
