"""How the scheduler starts a training run (`learning.launcher`).

- `in_process`: in the learner process itself, with the policy's long-lived PolicyTrainer (the
  model and the lineage's optimizer stay in memory from run to run). The default.
- `torchrun`: a child `python -m torch.distributed.run --nproc-per-node <processes> -m
  learner.jobs.one_run ...` on this machine, one process per GPU (learner/jobs/ranks.py).
- `kubernetes`: a batch/v1 Job per run running the same command in a pod
  (learner/jobs/kubernetes.py).

The last two start a fresh process per run: the model is loaded from the files of the version
the run starts from and the optimizer starts fresh, as after a learner restart (session.py).
Each launcher chooses the run's id and passes it with `--run-id`, waits for the run to end,
and reads its outcome from that `training_runs` row; a run that wrote no row (the policy's lock
was busy, learning paused or disabled, or the process died before its run began) is reported
from what the command printed, else as failed.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import uuid
from datetime import datetime
from typing import Any, Protocol

import psycopg
from psycopg.rows import dict_row

from apprentice.settings import PolicySettings, Settings
from learner.jobs.run import RunOutcome

log = logging.getLogger(__name__)

ONE_RUN_MODULE = "learner.jobs.one_run"


class Launcher(Protocol):
    def launch(self, trigger: str) -> RunOutcome:
        """Start one run of the launcher's policy, wait for its end, return its outcome."""
        ...


def one_run_arguments(policy: PolicySettings, trigger: str, run_id: str, config_path: str | None = None) -> list[str]:
    """`torch.distributed.run ... -m learner.jobs.one_run ...`'s arguments (after the Python executable)."""
    learning = policy.learning
    rendezvous = any(arg.startswith(("--rdzv", "--nnodes", "--master")) for arg in learning.torchrun_args)
    args = ["-m", "torch.distributed.run", *([] if rendezvous else ["--standalone"])]
    args += ["--nproc-per-node", str(learning.processes), *learning.torchrun_args]
    args += ["-m", ONE_RUN_MODULE, "--policy", policy.name, "--trigger", trigger, "--run-id", run_id, "--no-progress"]
    if config_path:
        args += ["--config", config_path]
    return args


def run_outcome(database_url: str, policy: str, run_id: str, fallback: RunOutcome) -> RunOutcome:
    """The outcome recorded in run `run_id`'s row (and its candidate's name and path); `fallback`
    when the run wrote no row."""
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as connection:
        row = connection.execute(
            "SELECT r.status, r.error, r.metrics, v.id::text AS version_id, v.name, v.path "
            "FROM training_runs r LEFT JOIN adapter_versions v ON v.id = r.produced_version_id "
            "WHERE r.id = %s",
            (run_id,),
        ).fetchone()
    if row is None:
        return fallback
    status = row["status"]
    if status == "running":  # the process ended without closing its row: it died
        status = "failed"
    return RunOutcome(
        status,
        policy,
        run_id,
        row["version_id"],
        row["name"],
        row["path"],
        error=row["error"] or fallback.error if status == "failed" else row["error"],
        metrics=row["metrics"] or {},
    )


def record_failed_launch(
    database_url: str, policy: str, run_id: str, trigger: str, started_at: datetime, error: str
) -> None:
    """End run `run_id` as failed with `error` when its process never ended it: the row is written
    when the run never began (a pod that never started), else closed if still `running` (a run
    the launcher gave up waiting for). A row the run already closed is left as it is."""
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute(
            "INSERT INTO training_runs (id, policy, status, trigger, started_at, finished_at, duration_s, error) "
            "VALUES (%(id)s, %(policy)s, 'failed', %(trigger)s, %(started)s, now(), "
            "extract(epoch FROM now() - %(started)s), %(error)s) "
            "ON CONFLICT (id) DO UPDATE SET status = 'failed', finished_at = now(), error = EXCLUDED.error, "
            "duration_s = extract(epoch FROM now() - training_runs.started_at) "
            "WHERE training_runs.status = 'running'",
            {"id": run_id, "policy": policy, "trigger": trigger, "started": started_at, "error": error},
        )


class InProcessLauncher:
    """The run in this process, with the policy's long-lived trainer."""

    def __init__(self, settings: Settings, policy: PolicySettings, database_url: str) -> None:
        from learner.jobs.session import PolicyTrainer

        self.settings, self.policy, self.url = settings, policy, database_url
        self.trainer = PolicyTrainer(policy)

    def launch(self, trigger: str) -> RunOutcome:
        from learner.jobs.one_run import run_policy

        return run_policy(self.settings, self.policy.name, trigger=trigger, database_url=self.url, trainer=self.trainer)


class TorchrunLauncher:
    """A child torchrun on this machine; the config reaches it through $APPRENTICE_CONFIG (set by
    `apprentice learner --config`) and the database through $APPRENTICE_DATABASE_URL."""

    def __init__(self, policy: PolicySettings, database_url: str, python: str = sys.executable) -> None:
        self.policy, self.url, self.python = policy, database_url, python

    def command(self, trigger: str, run_id: str) -> list[str]:
        return [self.python, *one_run_arguments(self.policy, trigger, run_id, os.environ.get("APPRENTICE_CONFIG"))]

    def launch(self, trigger: str) -> RunOutcome:
        run_id = str(uuid.uuid4())
        command = self.command(trigger, run_id)
        log.info(
            "policy %s: run %s under torchrun (%d processes)", self.policy.name, run_id, self.policy.learning.processes
        )
        env = {**os.environ, "APPRENTICE_DATABASE_URL": self.url}
        # stdout carries rank 0's JSON summary; stderr (the ranks' logs) goes to the learner's own.
        done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True, check=False)
        printed = _last_json(done.stdout)
        fallback = RunOutcome(
            str(printed.get("status") or "failed"),
            self.policy.name,
            printed.get("run_id"),
            error=printed.get("error") or (f"torchrun exited with {done.returncode}" if done.returncode else None),
        )
        return run_outcome(self.url, self.policy.name, run_id, fallback)


def _last_json(text: str) -> dict[str, Any]:
    """The JSON object `apprentice learn` printed last ({} when none)."""
    start = text.rfind("\n{")
    start = start + 1 if start >= 0 else text.find("{")
    if start < 0:
        return {}
    try:
        value = json.loads(text[start:])
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def launcher_for(settings: Settings, policy: PolicySettings, database_url: str) -> Launcher:
    """The launcher `policy.learning.launcher` names."""
    kind = policy.learning.launcher
    if kind == "torchrun":
        return TorchrunLauncher(policy, database_url)
    if kind == "kubernetes":
        from learner.jobs.kubernetes import KubernetesLauncher

        return KubernetesLauncher(policy, database_url)
    return InProcessLauncher(settings, policy, database_url)
