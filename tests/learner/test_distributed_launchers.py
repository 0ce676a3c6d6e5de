"""Launching runs: torchrun on this machine, a Kubernetes Job per run (against a fake API server
over real HTTP whose "kubelet" runs the Job's command here), and how a step is shared by ranks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from psycopg.types.json import Jsonb

from apprentice.settings import Settings
from learner.distributed.sharding import split_step
from learner.jobs.kubernetes import KubernetesLauncher, job_manifest, started
from learner.jobs.scheduler import Learner
from tests.learner.fake_kubernetes import FakeCluster, FakeKubernetesAPI
from tests.support.runs import populate, settings_for, trained

TOKEN = "fake-service-account-token"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def base(tiny_model_dir) -> str:
    return str(tiny_model_dir)


def write_config(path: Path, settings, *, with_database: bool) -> Path:
    """The settings as the YAML file a child process (or a pod) reads."""
    include = {"data_dir", "policies"} | ({"database_url"} if with_database else set())
    path.write_text(yaml.safe_dump(json.loads(settings.model_dump_json(include=include))))
    return path


def write_kubeconfig(path: Path, server: str, token: str, token_file: Path | None = None) -> Path:
    user = {"tokenFile": str(token_file)} if token_file else {"token": token}
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "test",
                "clusters": [{"name": "fake", "cluster": {"server": server}}],
                "users": [{"name": "learner", "user": user}],
                "contexts": [{"name": "test", "context": {"cluster": "fake", "user": "learner"}}],
            }
        )
    )
    return path


def test_a_step_is_split_into_whole_samples_balanced_by_tokens():
    sizes = {0: 50, 1: 10, 2: 40, 3: 30, 4: 5}
    shares = split_step([3, 0, 4, 1, 2], sizes, 2)
    assert sorted(s for share in shares for s in share) == [0, 1, 2, 3, 4], "every sample exactly once"
    assert shares == [[0, 4, 1], [3, 2]], "longest first to the lighter rank; each share in the step's order"
    assert split_step([3, 0, 4, 1, 2], sizes, 2) == shares, "a pure function: every rank computes the same"
    assert split_step([7], {7: 3}, 3) == [[7], [], []], "a rank may get nothing"


def test_a_run_under_torchrun_writes_one_adapter_version_and_one_row(database_url, db, base, tmp_path, monkeypatch):
    """Two gloo processes train together; rank 0 alone writes the version, its files and the run's row."""
    ids = populate(db, base)
    settings = settings_for(database_url, tmp_path / "data", base, launcher="torchrun", processes=2)
    monkeypatch.setenv("APPRENTICE_CONFIG", str(write_config(tmp_path / "config.yaml", settings, with_database=False)))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    learner = Learner(settings, database_url=database_url)
    assert learner.trainers == {}, "no model in the scheduler's process"

    outcome = learner.run("p", "test")

    assert outcome is not None and outcome.status == "succeeded", outcome.error
    runs = db.execute(
        "SELECT id::text, status, trigger, metrics, produced_version_id::text FROM training_runs"
    ).fetchall()
    assert len(runs) == 1
    run_id, status, trigger, metrics, produced = runs[0]
    assert (run_id, status, trigger) == (outcome.run_id, "succeeded", "test")
    assert metrics["ranks"] == 2 and metrics["distributed"] == "ddp" and metrics["train"]["optimizer_steps"] >= 1
    versions = db.execute("SELECT id::text, name, path, training_run_id::text FROM adapter_versions").fetchall()
    assert versions == [(produced, "p-v1", outcome.path, run_id)]
    directory = Path(outcome.path).parent
    assert sorted(p.name for p in directory.iterdir()) == ["p-v1"], "one adapter directory, no leftovers"
    assert (Path(outcome.path) / "adapter_model.safetensors").is_file()
    assert trained(db, ids["useful"]) == [run_id] * 4


def kube_settings(database_url, tmp_path, base, api_url, token_file=None, **kube):
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api_url, TOKEN, token_file)
    config_path = tmp_path / "config.yaml"
    section = {
        "image": "registry.example/apprentice-learner:1.0",
        "namespace": "learning",
        "config_path": str(config_path),
        "kubeconfig": str(kubeconfig),
        "env_from": [{"secretRef": {"name": "apprentice-db"}}],
        "env": [{"name": "OMP_NUM_THREADS", "value": "1"}],
        "node_selector": {"nvidia.com/gpu.product": "H100"},
        "labels": {"team": "ml"},
        "poll_s": 0.2,
        **kube,
    }
    settings = settings_for(database_url, tmp_path / "data", base, launcher="kubernetes", kubernetes=section)
    write_config(config_path, settings, with_database=False)
    return settings


def test_the_kubernetes_launcher_runs_a_job_per_run_and_reads_its_row(database_url, db, base, tmp_path):
    import kubernetes_validate

    populate(db, base)
    cluster = FakeCluster(TOKEN, secrets={"apprentice-db": {"APPRENTICE_DATABASE_URL": database_url}}, log_dir=tmp_path)
    with FakeKubernetesAPI(cluster) as api:
        settings = kube_settings(database_url, tmp_path, base, api.url)
        outcome = Learner(settings, database_url=database_url).run("p", "min_new_groups:3")
        logs = "\n".join(p.read_text()[-3000:] for p in cluster.logs.values())
        assert outcome is not None and outcome.status == "succeeded", f"{outcome}\n{logs}"

    ((name, manifest),) = cluster.jobs.items()
    run_id = outcome.run_id
    assert name == f"apprentice-learn-p-{run_id[:8]}" and manifest["metadata"]["namespace"] == "learning"
    labels = manifest["spec"]["template"]["metadata"]["labels"]
    assert labels["apprentice.dev/policy"] == "p" and labels["apprentice.dev/run-id"] == run_id
    assert labels["team"] == "ml" and manifest["metadata"]["labels"] == labels
    spec = manifest["spec"]
    assert spec["backoffLimit"] == 0 and spec["ttlSecondsAfterFinished"] == 3600
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
    container = pod["containers"][0]
    assert container["image"] == "registry.example/apprentice-learner:1.0"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1, "one GPU per process"
    command = container["command"]
    assert command[:3] == ["python", "-m", "torch.distributed.run"]
    assert command[command.index("--nproc-per-node") + 1] == "1"
    assert command[command.index("-m", 3) + 1] == "learner.jobs.one_run"
    assert command[command.index("--run-id") + 1] == run_id and command[command.index("--policy") + 1] == "p"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert database_url not in json.dumps(manifest), "the database URL comes from a Secret, never the Job"
    kubernetes_validate.validate(manifest, "1.30", strict=True)

    row = db.execute(
        "SELECT status, trigger, produced_version_id IS NOT NULL FROM training_runs WHERE id = %s", (run_id,)
    ).fetchone()
    assert row == ("succeeded", "min_new_groups:3", True)
    assert outcome.version_name == "p-v1" and Path(outcome.path, "adapter_config.json").is_file()
    assert cluster.deleted == [name], "the finished Job is deleted"
    delete = [body for method, _, body in cluster.requests if method == "DELETE"]
    assert delete == [{"propagationPolicy": "Background"}], "with its pods"


def test_a_job_that_fails_before_its_run_is_reported_failed_and_deleted(database_url, db, base, tmp_path):
    cluster = FakeCluster(TOKEN, secrets={"apprentice-db": {"APPRENTICE_DATABASE_URL": database_url}}, log_dir=tmp_path)
    with FakeKubernetesAPI(cluster) as api:
        settings = kube_settings(database_url, tmp_path, base, api.url, config_path="/nonexistent/config.yaml")
        outcome = Learner(settings, database_url=database_url).run("p", "schedule")
    assert outcome is not None and outcome.status == "failed"
    assert "without a training run row" in (outcome.error or "") and "Failed" in (outcome.error or "")
    assert db.execute("SELECT count(*) FROM training_runs").fetchone() == (0,)
    assert cluster.deleted == list(cluster.jobs)


def test_a_refused_job_is_a_failed_run_with_the_api_message(database_url, db, base, tmp_path):
    cluster = FakeCluster("another-token", log_dir=tmp_path)
    with FakeKubernetesAPI(cluster) as api:
        settings = kube_settings(database_url, tmp_path, base, api.url)
        outcome = Learner(settings, database_url=database_url).run("p", "schedule")
    assert outcome is not None and outcome.status == "failed"
    assert "401 Unauthorized" in (outcome.error or "") and not cluster.jobs
    sent = cluster.requests[0]
    assert sent[0] == "POST" and sent[1] == "/apis/batch/v1/namespaces/learning/jobs"


def test_the_job_template_asks_for_the_gpus_of_its_processes(tmp_path, base):
    settings = settings_for(
        "postgresql://x@127.0.0.1/db",
        tmp_path,
        base,
        launcher="kubernetes",
        processes=8,
        distributed="fsdp",
        kubernetes={"image": "img:1", "resources": {"limits": {"memory": "200Gi"}}, "shm_size": None},
    )
    manifest = job_manifest(settings.policies[0], "schedule", "0" * 8 + "-0000-0000-0000-000000000000")
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {"limits": {"memory": "200Gi", "nvidia.com/gpu": 8}}
    assert container["command"][container["command"].index("--nproc-per-node") + 1] == "8"
    assert "--standalone" in container["command"] and container["volumeMounts"] == []
    with pytest.raises(ValueError, match="kubernetes"):
        settings_for("postgresql://x@127.0.0.1/db", tmp_path, base, launcher="kubernetes")


# The launcher's waiting, against a cluster that misbehaves: the pod is a stand-in that writes
# the run's row as one_run would (no model, no training), so each test takes about a second.


def stand_in(status: str = "succeeded", sleep_s: float = 0.0) -> str:
    """Python run in place of the pod's command: write run --run-id's row with `status`, then sleep."""
    return (
        "import os, sys, time, psycopg\n"
        "run_id = sys.argv[sys.argv.index('--run-id') + 1]\n"
        "with psycopg.connect(os.environ['APPRENTICE_DATABASE_URL'], autocommit=True) as c:\n"
        "    c.execute(\"INSERT INTO training_runs (id, policy, status, trigger) VALUES (%s, 'p', %s, 'stand-in')\", "
        f"(run_id, {status!r}))\n"
        f"time.sleep({sleep_s})\n"
    )


def stand_in_cluster(database_url: str, tmp_path: Path, **faults) -> FakeCluster:
    secrets = {"apprentice-db": {"APPRENTICE_DATABASE_URL": database_url}}
    return FakeCluster(TOKEN, secrets=secrets, log_dir=tmp_path, stand_in=stand_in(), **faults)


def launch(database_url: str, tmp_path: Path, api: FakeKubernetesAPI, **kube):
    settings = kube_settings(database_url, tmp_path, str(tmp_path / "no-model"), api.url, poll_s=0.05, **kube)
    return KubernetesLauncher(settings.policies[0], database_url).launch("schedule")


def served(cluster: FakeCluster, method: str) -> int:
    return sum(1 for sent, _, _ in cluster.requests if sent == method)


def test_a_read_answered_503_is_tried_again(database_url, db, tmp_path):
    cluster = stand_in_cluster(database_url, tmp_path, faults=[("GET", 503), ("GET", 503)])
    with FakeKubernetesAPI(cluster) as api:
        outcome = launch(database_url, tmp_path, api, api_retry_s=30)
    assert outcome.status == "succeeded", outcome.error
    assert not cluster.faults and served(cluster, "GET") >= 3, "both 503s were served, then a read succeeded"
    assert cluster.deleted == list(cluster.jobs)


def test_a_401_after_the_token_rotated_is_tried_again_with_the_new_token(database_url, db, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    cluster = stand_in_cluster(database_url, tmp_path, rotate_token=("rotated-token", token_file))
    with FakeKubernetesAPI(cluster) as api:
        outcome = launch(database_url, tmp_path, api, token_file=token_file, api_retry_s=30)
    assert outcome.status == "succeeded", outcome.error
    assert cluster.token == "rotated-token" and cluster.deleted == list(cluster.jobs)


@pytest.mark.parametrize("fault", ["answer lost", "503"])
def test_a_create_whose_answer_failed_is_settled_by_reading_the_job(database_url, db, tmp_path, fault):
    """Lost answer: the Job exists, it is not created twice. 503: there is none, the create is tried again."""
    if fault == "answer lost":
        cluster = stand_in_cluster(database_url, tmp_path, drop_create_answer=True)
    else:
        cluster = stand_in_cluster(database_url, tmp_path, faults=[("POST", 503)])
    with FakeKubernetesAPI(cluster) as api:
        outcome = launch(database_url, tmp_path, api, api_retry_s=30)
    assert outcome.status == "succeeded", outcome.error
    assert served(cluster, "POST") == (1 if fault == "answer lost" else 2) and len(cluster.jobs) == 1
    assert db.execute("SELECT count(*) FROM training_runs").fetchone() == (1,)
    assert cluster.deleted == list(cluster.jobs)


def test_a_job_whose_pod_never_starts_is_deleted_and_its_run_failed(database_url, db, tmp_path):
    cluster = stand_in_cluster(database_url, tmp_path, pending=True)
    with FakeKubernetesAPI(cluster) as api:
        began = time.monotonic()
        outcome = launch(database_url, tmp_path, api, start_timeout_s=1, active_deadline_s=10)
        waited = time.monotonic() - began
    assert outcome.status == "failed" and 1 <= waited < 10, "the launcher, not the Job's deadline, ended it"
    assert "no pod started within 1 s" in (outcome.error or "")
    (name,) = cluster.jobs
    assert cluster.deleted == [name] and not cluster.processes
    status, trigger, error, finished = db.execute(
        "SELECT status, trigger, error, finished_at IS NOT NULL FROM training_runs WHERE id = %s", (outcome.run_id,)
    ).fetchone()
    assert (status, trigger, finished) == ("failed", "schedule", True)
    assert error.startswith("JobNotStarted: ") and "ready 0" in error


def test_an_api_failing_past_api_retry_s_ends_the_run_and_its_job(database_url, db, tmp_path):
    """The pod runs (its row says `running`); reads fail for longer than api_retry_s: the launcher
    deletes the Job (the pod is stopped) and closes the row as failed, saying why."""
    cluster = stand_in_cluster(database_url, tmp_path, faults=[("GET", 503)] * 1000)
    cluster.stand_in = stand_in("running", sleep_s=60)
    with FakeKubernetesAPI(cluster) as api:
        began = time.monotonic()
        outcome = launch(database_url, tmp_path, api, api_retry_s=1)
        waited = time.monotonic() - began
        (process,) = cluster.processes.values()
        assert process.wait(timeout=10) != 0, "the deleted Job's pod is stopped"
    assert outcome.status == "failed" and waited < 10
    assert "503" in (outcome.error or "")
    assert cluster.deleted == list(cluster.jobs)
    status, error = db.execute("SELECT status, error FROM training_runs WHERE id = %s", (outcome.run_id,)).fetchone()
    assert status == "failed" and error.startswith("KubernetesError: GET ") and "503" in error


def test_the_job_status_says_whether_its_pod_started():
    assert not started({"status": {"active": 1, "ready": 0}}), "a pending pod is active, not ready"
    assert started({"status": {"active": 1, "ready": 1}})
    assert started({"status": {"failed": 1}}) and started({"status": {"succeeded": 1, "ready": 0}})
    assert started({"status": {"active": 1}}), "before Kubernetes 1.24 (no ready): active is all there is"
    assert not started({"status": {}}) and not started({})


def add_teacher_trajectory(db, task: str, answer: str, reward: float) -> str:
    """A trajectory the hosted teacher answered for policy p (upstream = the teacher's model_name)."""
    trajectory = str(uuid.uuid4())
    at = datetime.now(timezone.utc) - timedelta(minutes=1)
    db.execute(
        "INSERT INTO trajectories (id, tenant, model, policy, first_call_at, last_call_at, call_count) "
        "VALUES (%s, 'acme', 'p', 'p', %s, %s, 1)",
        (trajectory, at, at),
    )
    request = {"model": "p", "messages": [{"role": "user", "content": task}]}
    response = {"id": "chatcmpl-t", "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}}]}
    db.execute(
        "INSERT INTO calls (id, trajectory_id, tenant, model, policy, upstream, upstream_model, created_at, "
        "status_code, request, response, temperature) "
        "VALUES (%s, %s, 'acme', 'p', 'p', 'teacher', 'teacher-rule', %s, 200, %s, %s, 1.0)",
        (str(uuid.uuid4()), trajectory, at, Jsonb(request), Jsonb(response)),
    )
    db.execute(
        "INSERT INTO rewards (id, tenant, target_kind, target, trajectory_id, status, linked_at, value, "
        "content_hash, source, observed_at) VALUES (%s, 'acme', 'trajectory', %s, %s, 'linked', now(), %s, "
        "'\\x00', 'key', now())",
        (str(uuid.uuid4()), trajectory, trajectory, reward),
    )
    return trajectory


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_distillation_run_under_torchrun_trains_on_both_ranks(
    database_url, db, base, tmp_path, monkeypatch, strategy
):
    """A policy behind its teacher: the torchrun run is a distillation (kind sft) trained by both
    ranks. Under FSDP the steps are taken by an optimizer over the shards, and counted."""
    chosen = [
        add_teacher_trajectory(db, f"Describe item {i}.", f"In short: item {i} is useful.", 1.0) for i in range(5)
    ]
    left_out = add_teacher_trajectory(db, "Describe item 9.", "It depends on many things.", 0.0)
    teacher_entry = {"model_name": "teacher", "litellm_params": {"model": "openai/teacher-rule", "api_key": "sk-t"}}
    settings = Settings(
        database_url=database_url,
        data_dir=tmp_path / "data",
        model_list=[teacher_entry],
        policies=[
            {
                "name": "p",
                "base_model": base,
                "endpoints": ["http://127.0.0.1:9/v1"],
                "learning": {
                    "launcher": "torchrun",
                    "processes": 2,
                    "distributed": strategy,
                    "micro_batch_size": 1,
                    "grad_accumulation": 2,
                },
                "teacher": {"model": "teacher", "distill": {"min_reward": 1.0, "top_share": None, "lr": 1e-3}},
            }
        ],
    )
    path = tmp_path / "config.yaml"
    include = {"data_dir", "policies", "model_list"}
    path.write_text(yaml.safe_dump(json.loads(settings.model_dump_json(include=include))))
    monkeypatch.setenv("APPRENTICE_CONFIG", str(path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    outcome = Learner(settings, database_url=database_url).run("p", "test")

    assert outcome is not None and outcome.status == "succeeded", (outcome.error, outcome.metrics)
    kind, metrics = db.execute("SELECT kind, metrics FROM training_runs WHERE id = %s", (outcome.run_id,)).fetchone()
    assert kind == "sft" and metrics["ranks"] == 2 and metrics["distill"]["chosen"] == 5
    assert metrics["distributed"] == strategy
    assert metrics["train"]["optimizer_steps"] == 6, "5 segments, steps of 2, 2 epochs"
    assert metrics["optimizer_steps_total"] == 6, "a fresh process: the run's steps are all its optimizer took"
    assert db.execute("SELECT count(*) FROM adapter_versions").fetchone() == (1,)
    assert trained(db, chosen) == [outcome.run_id] * 5 and trained(db, [left_out]) == [None]


def test_sigterm_closes_the_run_row_as_failed(database_url, db, base, tmp_path):
    """The one-run command stopped by SIGTERM (torchrun stopping its group, a Job's deadline) says
    so on its row instead of leaving it `running`."""
    populate(db, base)
    settings = settings_for(database_url, tmp_path / "data", base)
    config = write_config(tmp_path / "config.yaml", settings, with_database=True)
    run_id = str(uuid.uuid4())
    command = [sys.executable, "-m", "learner.jobs.one_run", "--config", str(config), "--policy", "p"]
    command += ["--run-id", run_id, "--no-progress"]
    process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while db.execute("SELECT 1 FROM training_runs WHERE id = %s", (run_id,)).fetchone() is None:
            assert process.poll() is None and time.monotonic() < deadline, "the run never wrote its row"
            time.sleep(0.02)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 143, stderr.decode()[-2000:]
    status, error = db.execute("SELECT status, error FROM training_runs WHERE id = %s", (run_id,)).fetchone()
    assert status == "failed" and "SIGTERM" in error
    assert db.execute("SELECT count(*) FROM adapter_versions").fetchone() == (0,)
