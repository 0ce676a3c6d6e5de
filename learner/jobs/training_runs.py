"""The one writer of `training_runs`: how every training run, of every kind, begins and ends.

An RL run (run.py) and a distillation run (distill.py) differ in what they select and how they
train; their bookkeeping is the same and lives here, so that the two kinds cannot drift apart:

- `with_policy_lock`: one learner per policy at a time, across machines (a session-level
  PostgreSQL advisory lock keyed by the policy, held on the run's connection; a lost
  connection takes the lock with it); learning paused by an admin; a connection lost during the
  run recorded on its row over a new connection (`record_lost_connection`).
- `start`: the row (status running) committed first, the record of the attempt even if the
  process dies; holding the lock proves that any older `running` row of the policy belongs to a
  dead run, and those are closed as failed ("interrupted").
- `skip`, `fail`, `save_candidate`: the ends. `save_candidate` writes the adapter atomically,
  then ONE transaction records the candidate through the lifecycle, marks the trajectories the
  run consumed with its id and closes the row; killed before that commit, nothing is marked.
- `close_stopped`, `close_if_running`: what a process that is being stopped (SIGTERM) writes,
  over a new connection, when the run could not close its own row or closed it with another
  error; what a lost connection leaves to write.
- `launch_outcome`, `record_failed_launch`: what a launcher reads back from a run in another
  process and writes when that process never started it.

Nothing here imports torch: the end of a failed run must be recordable whatever state an
interrupted import of torch left behind (one_run.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from apprentice.promotion import lifecycle
from apprentice.settings import PolicySettings, Settings

if TYPE_CHECKING:
    from apprentice.promotion.rows import AdapterVersion
    from learner.jobs.policy_trainer import PolicyTrainer

log = logging.getLogger(__name__)

LOCK_CLASS = 0x4150_4C4E  # "APLN": the learner's advisory-lock namespace
_SOURCE_DIRS = ("learner/grpo", "learner/jobs")

Kind = Literal["rl", "sft"]  # training_runs.kind (migration 0010): GRPO or distillation


@dataclass
class RunOutcome:
    """What a run did. status: succeeded | skipped | aborted | failed | busy | paused | disabled."""

    status: str
    policy: str
    run_id: str | None = None
    version_id: str | None = None
    version_name: str | None = None
    path: str | None = None
    error: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)


def lock_key(policy: str) -> int:
    """The advisory lock's second key: a stable 32-bit hash of the policy name."""
    return int.from_bytes(hashlib.blake2b(policy.encode(), digest_size=4).digest(), "big", signed=True)


def code_version() -> str:
    """The git commit (with +dirty) when run from a checkout, and a hash of the learner's sources."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for directory in _SOURCE_DIRS:
        for path in sorted((root / directory).glob("*.py")):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    source = digest.hexdigest()[:12]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", *_SOURCE_DIRS],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        return f"git:{commit}{'+dirty' if dirty else ''} src:{source}"
    except (OSError, subprocess.SubprocessError):
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"apprentice {version('apprentice')} src:{source}"
        except PackageNotFoundError:
            return f"src:{source}"


def adapters_dir(settings: Settings, policy: PolicySettings) -> Path:
    return Path(policy.learning.adapters_dir or Path(settings.data_dir) / "adapters" / policy.name).resolve()


def learner_database_url(settings: Settings, database_url: str | None = None) -> str:
    """The libpq URL a learner connects with: the one given, the configured one, or the embedded server's."""
    from apprentice.store.engine import ensure_database_url, libpq_url

    # ensure_database_url exports the URL to the environment (for gateway workers); a learner
    # given its database needs no such side effect.
    url = database_url or settings.database_url or ensure_database_url(None, Path(settings.data_dir))
    return libpq_url(url)


# ------------------------------------------------------------------ the lock


def with_policy_lock(
    url: str, policy_name: str, locked_run: Callable[[psycopg.Connection[Any]], RunOutcome]
) -> RunOutcome:
    """Run `locked_run` holding the policy's advisory lock, unless another learner holds it or
    learning is paused. Every kind of run goes through here, so each one that loses its database
    connection says so on its row and returns `failed` instead of raising from the unlock on the
    dead connection (the lost connection took the lock with it)."""
    with psycopg.connect(url, autocommit=True) as connection:
        locked = connection.execute(
            "SELECT pg_try_advisory_lock(%s, %s)", (LOCK_CLASS, lock_key(policy_name))
        ).fetchone()
        if locked is None or not locked[0]:
            return RunOutcome("busy", policy_name, error="another learner holds this policy's lock")
        try:
            paused = connection.execute(
                "SELECT learning_paused FROM policy_state WHERE policy = %s", (policy_name,)
            ).fetchone()
            if paused and paused[0]:
                return RunOutcome("paused", policy_name)
            outcome = locked_run(connection)
            if connection.broken and outcome.run_id is not None:
                record_lost_connection(url, outcome)
            return outcome
        finally:
            if not connection.broken:  # a lost connection took the lock with it
                connection.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_CLASS, lock_key(policy_name)))


# ------------------------------------------------------------------ the row


def start(
    connection: psycopg.Connection[Any],
    policy: PolicySettings,
    trigger: str,
    config: dict[str, Any],
    kind: Kind,
    run_id: str | None = None,
) -> str:
    """Write the run's row (status running), closing the policy's rows of dead runs; `run_id`: the
    id a launcher chose, to find the row after."""
    run_id = run_id or str(uuid.uuid4())
    with connection.transaction():
        connection.execute(
            "UPDATE training_runs SET status = 'failed', finished_at = now(), "
            "error = 'interrupted: the learner ended before finishing this run' "
            "WHERE policy = %s AND status = 'running'",
            (policy.name,),
        )
        connection.execute(
            "INSERT INTO training_runs (id, policy, status, trigger, kind, host, pid, code_version, config) "
            "VALUES (%s, %s, 'running', %s, %s, %s, %s, %s, %s)",
            (run_id, policy.name, trigger, kind, socket.gethostname(), os.getpid(), code_version(), Jsonb(config)),
        )
    return run_id


def finish(
    connection: psycopg.Connection[Any],
    run_id: str,
    status: str,
    *,
    error: str | None = None,
    columns: dict[str, Any] | None = None,
    metrics: dict[str, Any] | None = None,
) -> None:
    """Close the row: its status, error, duration, metrics and the figures in `columns`."""
    columns = dict(columns or {})
    assignments = ", ".join(f"{name} = %({name})s" for name in columns)
    connection.execute(
        f"UPDATE training_runs SET status = %(status)s, finished_at = now(), error = %(error)s, "
        f"duration_s = extract(epoch FROM now() - started_at), metrics = %(metrics)s"
        f"{', ' + assignments if assignments else ''} WHERE id = %(id)s",
        {**columns, "status": status, "error": error, "metrics": Jsonb(_jsonable(metrics or {})), "id": run_id},
    )


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def mark_trained(connection: psycopg.Connection[Any], run_id: str, trajectory_ids: list[str]) -> int:
    """Mark the trajectories a run consumed (trained on or set aside) with its id."""
    if not trajectory_ids:
        return 0
    cursor = connection.execute(
        "UPDATE trajectories SET trained_in_run_id = %s WHERE id = ANY(%s::uuid[]) AND trained_in_run_id IS NULL",
        (run_id, trajectory_ids),
    )
    return cursor.rowcount


def skip(
    connection: psycopg.Connection[Any],
    policy: str,
    run_id: str,
    reason: str,
    *,
    metrics: dict[str, Any],
    columns: dict[str, Any] | None = None,
    consumed: list[str] | None = None,
) -> RunOutcome:
    """Finish the run as skipped; `consumed` (groups with no signal, stale data) is marked, nothing else."""
    with connection.transaction():
        mark_trained(connection, run_id, consumed or [])
        finish(connection, run_id, "skipped", error=reason, columns=columns, metrics=metrics)
    return RunOutcome("skipped", policy, run_id, metrics=metrics, error=reason)


def fail(
    connection: psycopg.Connection[Any],
    label: str,
    policy_name: str,
    run_id: str,
    exc: BaseException,
    metrics: dict[str, Any],
) -> RunOutcome:
    """Record a run that raised as `aborted` (a non-finite loss) or `failed`, and say so; an
    interrupt (KeyboardInterrupt, SystemExit, one_run's SIGTERM) is recorded and raised again.

    Imports nothing: a SIGTERM may have interrupted `import torch`, and importing it again then
    crashes the process (SIGSEGV). A NonFiniteLoss exists only once the trainer's module is loaded."""
    trainer_module = sys.modules.get("learner.grpo.trainer")
    non_finite = getattr(trainer_module, "NonFiniteLoss", None)
    status = "aborted" if non_finite is not None and isinstance(exc, non_finite) else "failed"
    log.exception("%s %s for %s %s", label, run_id, policy_name, status)
    try:
        finish(connection, run_id, status, error=f"{type(exc).__name__}: {exc}", metrics=metrics)
    except psycopg.Error:
        log.exception("could not record the end of run %s (closed when this process ends)", run_id)
    if not isinstance(exc, Exception):
        raise exc
    return RunOutcome(status, policy_name, run_id, error=f"{type(exc).__name__}: {exc}", metrics=metrics)


def close_if_running(url: str, run_id: str, error: str, *, timeout_s: float = 10.0) -> bool:
    """Close run `run_id` as failed with `error` over a new connection if it is still `running`
    (its own connection is gone or unusable). True when this closed it."""
    with psycopg.connect(url, autocommit=True, connect_timeout=max(1, int(timeout_s))) as connection:
        # the run's own connection may still hold the row's lock while the server notices it is gone
        connection.execute(f"SET lock_timeout = '{int(timeout_s * 1000)}ms'")
        cursor = connection.execute(
            "UPDATE training_runs SET status = 'failed', finished_at = now(), error = %s, "
            "duration_s = extract(epoch FROM now() - started_at) WHERE id = %s AND status = 'running'",
            (error, run_id),
        )
        return cursor.rowcount > 0


def close_stopped(url: str, run_id: str, reason: str, *, timeout_s: float = 10.0) -> bool:
    """The process running run `run_id` was stopped (SIGTERM): close its row as failed with `reason`
    over a new connection. A row still `running` gets `reason`; a row the run already closed as
    failed with another error (the interrupt landed inside an import or a library, which turned it
    into that error) gets `reason` first, so that the row says why; a succeeded row is left alone.
    True when this changed the row."""
    with psycopg.connect(url, autocommit=True, connect_timeout=max(1, int(timeout_s))) as connection:
        connection.execute(f"SET lock_timeout = '{int(timeout_s * 1000)}ms'")
        cursor = connection.execute(
            "UPDATE training_runs SET "
            "error = CASE WHEN status = 'running' THEN %(reason)s::text "
            "ELSE %(reason)s::text || ' (the run then ended with ' || coalesce(error, 'no error') || ')' END, "
            "finished_at = coalesce(finished_at, now()), "
            "duration_s = coalesce(duration_s, extract(epoch FROM now() - started_at)), status = 'failed' "
            "WHERE id = %(id)s AND (status = 'running' "
            "OR (status = 'failed' AND position(%(reason)s::text IN coalesce(error, '')) = 0))",
            {"reason": reason, "id": run_id},
        )
        return cursor.rowcount > 0


def record_lost_connection(url: str, outcome: RunOutcome, attempts: int = 5, delay_s: float = 2.0) -> None:
    """The run's connection died (PostgreSQL restarted, the network broke): its final transaction
    rolled back, so no version row exists and no trajectory is marked. Say so on the run's row over
    a new connection, retried for a while; if the database stays away, the log says it and the
    next run closes the row as interrupted."""
    assert outcome.run_id is not None
    outcome.error = (
        f"database connection lost: {outcome.error}; nothing was committed (no version, no trajectory "
        "marked trained), the next run retries"
    )
    for attempt in range(1, attempts + 1):
        try:
            close_if_running(url, outcome.run_id, outcome.error, timeout_s=5)
            log.error("learner run %s for %s failed: %s", outcome.run_id, outcome.policy, outcome.error)
            return
        except psycopg.Error as exc:
            log.warning("run %s: recording its end, attempt %d of %d: %s", outcome.run_id, attempt, attempts, exc)
            time.sleep(delay_s)
    log.error(
        "learner run %s for %s failed and the database stayed away: %s (the next run marks it interrupted)",
        outcome.run_id,
        outcome.policy,
        outcome.error,
    )


# ------------------------------------------------------------------ the candidate


def remove_orphan_adapters(connection: psycopg.Connection[Any], directory: Path, policy: str) -> None:
    """This policy's adapter directories that no version row refers to: left by killed runs.

    Only names this policy's runs write (`<policy>-v<n>` and their temporary siblings) are
    touched, so a directory shared with other policies or other files is safe.
    """
    from learner.grpo.adapters import TMP_PREFIX

    if not directory.is_dir():
        return
    known = {Path(r[0]).resolve() for r in connection.execute("SELECT path FROM adapter_versions").fetchall()}
    prefix = f"{policy}-v"
    for entry in directory.iterdir():
        ours = entry.name.startswith(prefix) or entry.name.startswith(TMP_PREFIX + prefix)
        if ours and entry.is_dir() and entry.resolve() not in known:
            log.info("removing adapter directory %s: no version refers to it (interrupted run)", entry)
            shutil.rmtree(entry, ignore_errors=True)


@dataclass
class Trained:
    """What a run that took optimizer steps hands `save_candidate`."""

    connection: psycopg.Connection[Any]
    policy: PolicySettings
    trainer: PolicyTrainer
    run_id: str
    directory: Path  # the policy's adapters directory
    head: AdapterVersion | None  # the version the run trained from (None: the base model)
    consumed: list[str]  # trajectories to mark with the run's id (trained on or set aside)
    columns: dict[str, Any]  # the training_runs figures of the run (loss, samples, ...)
    metrics: dict[str, Any]
    started: float  # time.monotonic() when the run began
    # The trained LoRA weights gathered whole, when the model holds shards (FSDP); else None.
    adapter_state: dict[str, Any] | None = None


def save_candidate(run: Trained, label: str) -> RunOutcome:
    """Save the adapter under the next version's name, then commit the candidate (child of the head)
    with the run's end; the trainer then holds the new version."""
    from learner.grpo.adapters import save_adapter

    policy = run.policy
    number = lifecycle.next_version_number(run.connection, policy.name)
    name = f"{policy.name}-v{number}"
    out_dir = run.directory / name
    if out_dir.exists():  # an orphan of a killed run (version rows always get a fresh number)
        shutil.rmtree(out_dir)
    save_adapter(run.trainer.model, out_dir, policy.base_model, state_dict=run.adapter_state)
    config = json.loads((out_dir / "adapter_config.json").read_text())
    candidate = lifecycle.NewCandidate(
        id=uuid.uuid4(),
        policy=policy.name,
        version=number,
        name=name,
        base_model=policy.base_model,
        path=str(out_dir),
        parent_version_id=run.head.id if run.head else None,
        training_run_id=uuid.UUID(run.run_id),
        rank=int(config["r"]),
        alpha=float(config["lora_alpha"]),
        target_modules=list(config.get("target_modules") or []),
    )
    run.metrics["duration_s"] = time.monotonic() - run.started
    try:
        with run.connection.transaction():
            lifecycle.record_candidate(run.connection, candidate)
            mark_trained(run.connection, run.run_id, run.consumed)
            finish(
                run.connection,
                run.run_id,
                "succeeded",
                columns={**run.columns, "produced_version_id": str(candidate.id)},
                metrics=run.metrics,
            )
    except BaseException:
        shutil.rmtree(out_dir, ignore_errors=True)
        raise
    run.trainer.commit(str(candidate.id))
    log.info(
        "policy %s: %s %s produced candidate %s (%d trajectories, loss %s, %.1fs)",
        policy.name,
        label,
        run.run_id,
        name,
        run.columns.get("trajectories") or 0,
        run.columns.get("loss"),
        run.metrics["duration_s"],
    )
    return RunOutcome("succeeded", policy.name, run.run_id, str(candidate.id), name, str(out_dir), metrics=run.metrics)


# ------------------------------------------------------------------ runs in other processes


def launch_outcome(database_url: str, policy: str, run_id: str, fallback: RunOutcome) -> RunOutcome:
    """The outcome recorded in run `run_id`'s row (and its candidate's name and path), for a
    launcher whose run ran in another process; `fallback` when the run wrote no row."""
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
