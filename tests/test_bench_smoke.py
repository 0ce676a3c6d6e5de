"""Every bench still runs: each bench's `--quick` mode, as a user runs it (`python -m bench.NAME
--quick` from the repository root), must exit 0 and leave docs/benchmarks.md as it was.

What this proves is that a bench works, not its figures: a quick run is too short to measure
anything. It is here so that a change to the product or to bench.harness that breaks a bench is
seen in CI, not months later by whoever reruns it. A new bench must be listed in BENCHES (or in
NOT_SMOKED, with the reason): `test_every_bench_is_listed` fails otherwise.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT

REPORT = REPO_ROOT / "docs" / "benchmarks.md"

# (module, arguments): gateway_overhead's third target, the LiteLLM proxy, installs LiteLLM into a
# virtual environment of its own first: not in a smoke run.
BENCHES: list[tuple[str, list[str]]] = [
    ("adapter_switch", ["--quick"]),
    ("canary_simulation", ["--quick", "--no-write"]),
    ("canary_stickiness", ["--quick", "--no-write"]),
    ("exploration_latency", ["--quick"]),
    ("dashboard_pages", ["--quick", "--repeats", "1", "--warmups", "0"]),
    ("gateway_overhead", ["--quick", "--targets", "direct,gateway", "--no-lock-test"]),
    ("history_scale", ["--quick"]),
    ("inference_throughput", ["--quick"]),
    ("learner_split", ["--quick"]),
    ("learner_step", ["--quick"]),
    ("limits_overhead", ["--quick"]),
    ("promotion_ceiling", ["--quick", "--no-write"]),
    ("promotion_lag", ["--quick", "--no-write"]),
    ("promotion_latency", ["--quick"]),
    ("protocol_overhead", ["--quick"]),
    ("redaction_overhead", ["--quick"]),
    ("reward_ingest", ["--quick"]),
    ("tracing_overhead", ["--quick"]),
]
NOT_SMOKED = {
    "learning_efficiency": "trains SmolLM2 for minutes by design (product loop beside a bare loop); no quick mode yet",
    "distillation_efficiency": "built on learning_efficiency's loops: minutes of training per arm",
    "sigterm_stress": "starts the training command again and again by design (half a minute even with --quick); "
    "tests/learner/test_distributed_launchers.py signals one run in the suite",
    "soak": "a trend over tens of minutes of traffic through `apprentice up`; nothing to see in seconds",
}
LIBRARIES = {"harness", "loadgen", "report", "stats", "side_by_side", "soak_probe", "soak_trend", "priority_endpoint"}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_bench_is_listed() -> None:
    scripts = {p.stem for p in (REPO_ROOT / "bench").glob("*.py") if p.stem != "__init__"} - LIBRARIES
    assert scripts == {name for name, _ in BENCHES} | set(NOT_SMOKED)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "args"), BENCHES, ids=[name for name, _ in BENCHES])
def test_the_quick_mode_runs_and_writes_nothing(name: str, args: list[str]) -> None:
    before = digest(REPORT)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"bench.{name} exited {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}"
    assert digest(REPORT) == before, f"bench.{name} --quick wrote docs/benchmarks.md"
