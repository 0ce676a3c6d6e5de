"""How the scheduler starts a training run (`learning.launcher`).

- `in_process`: in the learner process itself, with the policy's long-lived PolicyTrainer (the
  model and the lineage's optimizer stay in memory from run to run). The default.
- `torchrun`: a child `python -m torch.distributed.run --nproc-per-node <processes> -m
  learner.jobs.one_run ...` on this machine, one process per GPU (learner/jobs/ranks.py).
- `kubernetes`: a batch/v1 Job per run running the same command in a pod
  (learner/jobs/kubernetes.py).

The last two start a fresh process per run: the model is loaded from the files of the version
the run starts from and the optimizer starts fresh, as after a learner restart (policy_trainer.py).
Each launcher chooses the run's id and passes it with `--run-id`, waits for the run to end,
and reads its outcome from that `training_runs` row (training_runs.launch_outcome); a run that
wrote no row (the policy's lock was busy, learning paused or disabled, or the process died
before its run began) is reported from what the command printed, else as failed.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import uuid
from typing import Any, Protocol

from apprentice.settings import PolicySettings, Settings
from learner.jobs.kubernetes import KubernetesLauncher
from learner.jobs.one_run import one_run_arguments, run_policy
from learner.jobs.policy_trainer import PolicyTrainer
from learner.jobs.training_runs import RunOutcome, launch_outcome

log = logging.getLogger(__name__)


class Launcher(Protocol):
    def launch(self, trigger: str) -> RunOutcome:
        """Start one run of the launcher's policy, wait for its end, return its outcome."""
        ...


class InProcessLauncher:
    """The run in this process, with the policy's long-lived trainer."""

    def __init__(self, settings: Settings, policy: PolicySettings, database_url: str) -> None:
        self.settings, self.policy, self.url = settings, policy, database_url
        self.trainer = PolicyTrainer(policy)

    def launch(self, trigger: str) -> RunOutcome:
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
        return launch_outcome(self.url, self.policy.name, run_id, fallback)


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
        return KubernetesLauncher(policy, database_url)
    return InProcessLauncher(settings, policy, database_url)
