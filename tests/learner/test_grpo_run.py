"""A learner run against PostgreSQL: selection, the candidate it records, and its safety rules."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psycopg
import pytest

from learner.jobs import run as run_module
from learner.jobs import training_runs
from learner.jobs.run import run_once
from learner.jobs.training_runs import LOCK_CLASS, lock_key
from tests.support.runs import add_trajectory, populate, settings_for, trained


def test_a_run_records_a_candidate_and_marks_what_it_used(database_url, db, base, tmp_path):
    ids = populate(db, base)
    outcome = run_once(settings_for(database_url, tmp_path, base), "p")
    assert outcome.status == "succeeded", outcome.error
    version = db.execute(
        "SELECT id::text, name, status, version, path, base_model, rank, training_run_id::text, "
        "parent_version_id FROM adapter_versions"
    ).fetchall()
    assert len(version) == 1
    vid, name, status, number, path, base_model, rank, run_id, parent = version[0]
    assert (name, status, number, base_model, rank, parent) == ("p-v1", "candidate", 1, base, 8, None)
    assert run_id == outcome.run_id and vid == outcome.version_id
    config = json.loads((Path(path) / "adapter_config.json").read_text())
    assert (
        config["r"] == 8 and not config.get("modules_to_save") and (Path(path) / "adapter_model.safetensors").exists()
    )
    assert db.execute("SELECT from_status, to_status, actor FROM adapter_transitions").fetchall() == [
        (None, "candidate", "auto")
    ]
    assert trained(db, ids["useful"]) == [run_id] * 4
    assert trained(db, ids["equal"]) == [run_id] * 3, "set aside: no signal, consumed"
    # A group of one trains against its task family's other rewards (docs/learner.md, families).
    assert trained(db, ids["small"]) == [run_id] and trained(db, ids["foreign"]) == [None, None]
    run = db.execute(
        "SELECT status, produced_version_id::text, trajectories, groups, groups_equal_rewards, "
        "groups_greedy, samples, tokens, loss, mean_reward, mean_advantage, kl, clip_fraction, "
        "duration_s, code_version, config, metrics FROM training_runs"
    ).fetchone()
    (
        status,
        produced,
        n_traj,
        groups,
        equal,
        greedy,
        samples,
        tokens,
        loss,
        mean_reward,
        mean_adv,
        kl,
        clip,
        duration,
        code,
        config_json,
        metrics,
    ) = run
    # the useful group of four, and the lone member of task C pooled against its family
    assert (status, produced, n_traj, groups, equal, greedy, samples) == ("succeeded", vid, 5, 2, 1, 0, 5)
    # |A|: 0.5 / 0.577 for each of the group of four; the lone member 1 - 5/7 over its family's spread
    # sqrt(0.75 x 0.25) (its family's eight rewards, six of them 1): 0.660. Mean of the five: 0.825.
    assert tokens == 14 and mean_reward == pytest.approx(0.6) and mean_adv == pytest.approx(0.825, abs=1e-3)
    assert loss is not None and kl is not None and 0 <= clip <= 1 and duration > 0
    assert "src:" in code and config_json["learning"]["lr"] == 1e-3
    assert metrics["skipped_trajectories"] == {"other_model": 2}
    assert metrics["groups"]["pooled"] == 1 and metrics["train"]["optimizer_steps"] >= 1

    again = run_once(settings_for(database_url, tmp_path, base), "p")
    assert again.status == "skipped", "nothing new to learn from"


def test_a_run_continues_from_the_promoted_version_and_trains_on_its_data(database_url, db, base, tmp_path):
    populate(db, base)
    first = run_once(settings_for(database_url, tmp_path, base), "p")
    db.execute("UPDATE adapter_versions SET status = 'promoted'")
    # served by the promoted adapter under its LoRA name (the gateway's routing records the id too)
    fresh = [
        add_trajectory(
            db, task="task E", answer=[40 + i, 2], reward=float(i % 2), base_model=base, upstream_model="p-v1"
        )
        for i in range(4)
    ]
    second = run_once(settings_for(database_url, tmp_path, base), "p")
    assert second.status == "succeeded", second.error
    parent, run_from = db.execute(
        "SELECT v.parent_version_id::text, r.from_version_id::text FROM adapter_versions v "
        "JOIN training_runs r ON r.id = v.training_run_id WHERE v.name = 'p-v2'"
    ).fetchone()
    assert parent == first.version_id == run_from
    assert trained(db, fresh) == [second.run_id] * 4


def test_one_learner_per_policy_the_advisory_lock(database_url, db, base, tmp_path):
    populate(db, base)
    with psycopg.connect(database_url, autocommit=True) as other:
        assert other.execute("SELECT pg_try_advisory_lock(%s, %s)", (LOCK_CLASS, lock_key("p"))).fetchone()[0]
        outcome = run_once(settings_for(database_url, tmp_path, base), "p")
        assert outcome.status == "busy"
    assert db.execute("SELECT count(*) FROM training_runs").fetchone()[0] == 0


def test_a_run_that_fails_before_its_commit_leaves_nothing_and_the_next_run_retries(
    database_url, db, base, tmp_path, monkeypatch
):
    ids = populate(db, base)
    db.execute("INSERT INTO training_runs (id, policy, status) VALUES (%s, 'p', 'running')", (str(uuid.uuid4()),))
    real_mark = training_runs.mark_trained

    def crash(connection, run_id, trajectory_ids):
        real_mark(connection, run_id, trajectory_ids)
        raise RuntimeError("killed in the middle of the final transaction")

    monkeypatch.setattr(training_runs, "mark_trained", crash)
    outcome = run_once(settings_for(database_url, tmp_path, base), "p")
    assert outcome.status == "failed" and "killed" in outcome.error
    assert db.execute("SELECT count(*) FROM adapter_versions").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM adapter_transitions").fetchone()[0] == 0
    assert trained(db, ids["useful"] + ids["equal"]) == [None] * 7, "rolled back with the version row"
    assert not [p for p in (tmp_path / "adapters" / "p").iterdir()], "no adapter files left behind"
    statuses = sorted(r[0] for r in db.execute("SELECT error FROM training_runs").fetchall())
    assert any("interrupted" in s for s in statuses), "the dead 'running' row is closed by the next run"

    monkeypatch.setattr(training_runs, "mark_trained", real_mark)
    (tmp_path / "adapters" / "p" / "p-v1").mkdir()  # an orphan left by a kill after the save
    (tmp_path / "adapters" / "p" / "p-v1" / "adapter_config.json").write_text("{}")
    retry = run_once(settings_for(database_url, tmp_path, base), "p")
    assert retry.status == "succeeded" and retry.version_name == "p-v1"
    assert trained(db, ids["useful"]) == [retry.run_id] * 4


def test_a_nan_loss_aborts_the_run_and_produces_no_candidate(database_url, db, base, tmp_path, monkeypatch):
    ids = populate(db, base)
    monkeypatch.setattr(run_module, "group_advantages", lambda rewards, kind: [float("nan")] * len(rewards))
    outcome = run_once(settings_for(database_url, tmp_path, base), "p")
    assert outcome.status == "aborted" and "NonFiniteLoss" in outcome.error
    assert db.execute("SELECT status FROM training_runs").fetchone()[0] == "aborted"
    assert db.execute("SELECT count(*) FROM adapter_versions").fetchone()[0] == 0
    assert trained(db, ids["useful"]) == [None] * 4


def test_greedy_groups_are_reported(database_url, db, base, tmp_path):
    for reward in (1.0, 0.0):
        add_trajectory(db, task="greedy task", answer=[5, 2], reward=reward, base_model=base, temperature=0.0)
    outcome = run_once(settings_for(database_url, tmp_path, base), "p")
    assert outcome.status == "skipped"
    assert db.execute("SELECT status, groups_greedy FROM training_runs").fetchone() == ("skipped", 1)


def test_the_scheduler_trigger_runs_once_enough_new_groups_wait(database_url, db, base, tmp_path):
    from learner.jobs.scheduler import Learner

    settings = settings_for(database_url, tmp_path, base, schedule="*/5 * * * *", min_new_groups=3)
    learner = Learner(settings)
    jobs = sorted(job.id for job in learner.build(blocking=False).get_jobs())
    assert jobs == ["schedule:p", "trigger:p"]
    add_trajectory(db, task="t1", answer=[5, 2], reward=1.0, base_model=base)
    add_trajectory(db, task="t1", answer=[6, 2], reward=0.0, base_model=base)
    assert learner.check_trigger(settings.policies[0]) is None, "one group waits, three wanted"
    populate(db, base)
    outcome = learner.check_trigger(settings.policies[0])
    assert outcome is not None and outcome.status == "succeeded"
    assert db.execute("SELECT trigger FROM training_runs").fetchone()[0].startswith("min_new_groups:")


def test_apprentice_learn_runs_once(database_url, db, base, tmp_path):
    import yaml
    from click.testing import CliRunner

    from learner.jobs.cli import learn_command

    populate(db, base)
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            json.loads(
                settings_for(database_url, tmp_path, base).model_dump_json(
                    include={"database_url", "data_dir", "policies"}
                )
            )
        )
    )
    result = CliRunner().invoke(learn_command, ["--config", str(config), "--policy", "p", "--no-progress"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{") :])
    assert summary["status"] == "succeeded" and summary["version"] == "p-v1" and summary["groups"]["usable"] == 1
