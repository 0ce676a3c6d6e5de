"""SIGTERM at any point of a training run: its row always ends, and the process exits 143.

torchrun stopping its group, a Kubernetes Job's deadline or an operator sends SIGTERM to the
one-run command (`python -m learner.jobs.one_run`, learner/jobs/one_run.py) whatever it is
doing: importing torch, loading the model, stepping, saving the adapter, writing the row. Each
trial here runs the command on the tiny model against a real PostgreSQL and sends SIGTERM at a
uniformly random moment between the run's row appearing and the time a run takes without a
signal (measured first, three times), so the signal lands in every phase over many trials.

The run trains on 40 extra groups beside tests/support/runs.py's few, so that training and
saving take a measurable share of it. A signalled trial passes when the process exited 143 (or
with the run's own status 0, when the signal came after the command returned) and its row is
either `failed` saying SIGTERM with no adapter version, or `succeeded` with exactly one (the run
had finished). Anything else fails it: a death by signal (-15, -11), a row left `running`, a
version without a succeeded row. Reported per phase, read from what the run had logged before
the signal.

    python -m bench.sigterm_stress --trials 50
    python -m bench.sigterm_stress --quick          # 3 trials: a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import yaml

from bench.harness import pg_connect, scratch_database
from learner.models import fetch_default_model
from tests.learner.tiny_model import build_tiny_model
from tests.support.runs import add_trajectory, populate, settings_for

ROOT = Path(__file__).resolve().parents[1]
TABLES = "rewards, calls, trajectories, training_runs, adapter_versions"
EXTRA_GROUPS = 40


def populate_more(db, base: str) -> None:
    """tests/support/runs.py's trajectories and EXTRA_GROUPS groups of four more, with longer answers."""
    populate(db, base)
    for group in range(EXTRA_GROUPS):
        for member, reward in enumerate([1.0, 0.0, 1.0, 0.0]):
            answer = [200 + (group * 7 + member * 13 + i) % 300 for i in range(24)] + [2]
            add_trajectory(db, task=f"task E{group}", answer=answer, reward=reward, base_model=base)


def phase_of(log_lines: list[str]) -> str:
    """Where the run was when the signal came, from what it had logged."""
    text = "\n".join(log_lines)
    if "produced candidate" in text:
        return "after the row was closed (exiting)"
    if "training from" in text:
        return "training, saving or closing the row"
    return "starting (imports, selection, model load)"


class Trial:
    """One run of the command, stopped by SIGTERM `delay_s` after its row appeared (None: not stopped)."""

    def __init__(self, database_url: str, config: Path, delay_s: float | None) -> None:
        self.database_url = database_url
        self.config = config
        self.delay_s = delay_s
        self.lines: list[str] = []
        self.lines_at_signal: list[str] = []

    def _read(self, stream) -> None:
        for raw in stream:
            self.lines.append(raw.decode(errors="replace").rstrip())

    def run(self) -> dict:
        run_id = str(uuid.uuid4())
        command = [sys.executable, "-m", "learner.jobs.one_run", "--config", str(self.config), "--policy", "p"]
        command += ["--run-id", run_id, "--no-progress"]
        started = time.monotonic()
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        reader = threading.Thread(target=self._read, args=(process.stderr,), daemon=True)
        reader.start()
        with pg_connect(self.database_url, autocommit=True) as db:
            row_at = None
            while row_at is None and process.poll() is None:
                if db.execute("SELECT 1 FROM training_runs WHERE id = %s", (run_id,)).fetchone():
                    row_at = time.monotonic()
                else:
                    time.sleep(0.01)
            signalled = False
            if self.delay_s is not None and row_at is not None:
                while time.monotonic() < row_at + self.delay_s and process.poll() is None:
                    time.sleep(0.005)
                if process.poll() is None:
                    self.lines_at_signal = list(self.lines)
                    process.send_signal(signal.SIGTERM)
                    signalled = True
            try:
                process.wait(timeout=120)
            finally:
                if process.poll() is None:
                    process.kill()
            reader.join(10)
            row = db.execute("SELECT status, error FROM training_runs WHERE id = %s", (run_id,)).fetchone()
            versions = db.execute("SELECT count(*) FROM adapter_versions").fetchone()[0]
        return {
            "signalled": signalled,
            "code": process.returncode,
            "status": row[0] if row else None,
            "error": (row[1] or "") if row else "",
            "versions": versions,
            "row_after_s": (row_at - started) if row_at else None,
            "run_s": time.monotonic() - (row_at or started),
            "phase": phase_of(self.lines_at_signal) if signalled else "finished before the signal",
            "log": self.lines[-15:],
        }


def verdict(result: dict) -> str | None:
    """None when the trial ended as it must, else what went wrong."""
    if result["signalled"]:
        if result["code"] not in (143, 0):
            return f"exit {result['code']} (143, or 0 once the command had returned, expected)"
        if result["status"] == "succeeded":
            return None if result["versions"] == 1 else f"a succeeded row with {result['versions']} versions"
        if result["status"] != "failed" or "SIGTERM" not in result["error"]:
            return f"row {result['status']!r} {result['error'][:80]!r} (failed saying SIGTERM, or succeeded)"
        if result["versions"] != 0:
            return f"{result['versions']} adapter versions written by a stopped run"
        if result["code"] != 143:
            return "a run stopped by the signal exited 0"
        return None
    if result["code"] != 0 or result["status"] != "succeeded" or result["versions"] != 1:
        return f"unsignalled run: exit {result['code']}, row {result['status']!r}, {result['versions']} versions"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="one unsignalled run and 3 trials: a smoke run")
    args = parser.parse_args()
    trials, baselines = (3, 1) if args.quick else (args.trials, 3)
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="sigterm-stress-"))
    base = str(build_tiny_model(work / "tiny-model", tokenizer_dir=fetch_default_model()))
    failures: list[tuple[int, str, dict]] = []
    phases: Counter[str] = Counter()
    outcomes: dict[str, Counter[str]] = {}
    with scratch_database("apprentice_bench_sigterm") as url:

        def fresh_config(index: int) -> Path:
            with pg_connect(url, autocommit=True) as db:
                db.execute(f"TRUNCATE {TABLES} CASCADE")
                populate_more(db, base)
            settings = settings_for(url, work / f"data-{index}", base)
            include = {"data_dir", "policies", "database_url"}
            config = work / f"config-{index}.yaml"
            config.write_text(yaml.safe_dump(json.loads(settings.model_dump_json(include=include))))
            return config

        durations = []
        for index in range(baselines):
            result = Trial(url, fresh_config(index), None).run()
            if (problem := verdict(result)) is not None:
                print("\n".join(result["log"]))
                raise SystemExit(f"a run without a signal did not succeed: {problem}")
            durations.append(result["run_s"])
        span = max(durations)
        print(f"a run takes {span:.1f} s from its row to its exit without a signal ({len(durations)} runs)", flush=True)
        for index in range(trials):
            delay = rng.uniform(0, span)
            result = Trial(url, fresh_config(baselines + index), delay).run()
            phases[result["phase"]] += 1
            outcomes.setdefault(result["phase"], Counter())[f"{result['code']} {result['status']}"] += 1
            problem = verdict(result)
            print(
                f"trial {index + 1}: signal at {delay:.2f} s, {result['phase']}: exit {result['code']}, "
                f"row {result['status']}{'' if problem is None else '  FAILED: ' + problem}",
                flush=True,
            )
            if problem is not None:
                failures.append((index + 1, problem, result))
    print(f"\n{trials} trials, {trials - len(failures)} passed; where the signal landed (exit status, row):")
    for phase, count in phases.most_common():
        print(f"  {phase}: {count}  {dict(outcomes[phase])}")
    for index, problem, result in failures:
        print(f"\ntrial {index}: {problem}\n" + "\n".join(result["log"]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
