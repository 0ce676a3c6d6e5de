"""Gates a candidate must pass before it serves any traffic (pure functions).

1. `run_finished`: the training run that produced it ended with status `succeeded`. A run
   still `running` means "not yet" (the candidate waits); failed, aborted or skipped runs,
   or no run at all, fail the gate.
2. `loss_finite`: the run's final loss is a finite number (a NaN or infinite loss means the
   weights are garbage even if the run "succeeded").
3. `kl_bound`: the KL of the new adapter to the incumbent, per token, is at most the
   policy's `promotion.kl_bound`. Read from `training_runs.metrics["kl_to_incumbent"]` when
   the learner records it there, else from `training_runs.kl` (the learner's KL estimate).
   A run that measured no KL passes this gate with the note "not measured"; a NaN KL fails.

Any metric that is not finite inside `training_runs.metrics` (e.g. `grad_norm`) also fails
`loss_finite`: it is the same failure (diverged training) reported under another name.

4. `adapter_files` (added by the promotion job, which runs where the adapters are written:
   `files.adapter_files_problem`): the directory holds a readable config and whole weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from apprentice.promotion.rows import TrainingRun

KL_METRIC_KEYS = ("kl_to_incumbent", "kl_incumbent", "kl")

PASS, FAIL, WAIT = "pass", "fail", "wait"


def json_number(value: Any) -> Any:
    """A float that JSON (and PostgreSQL's jsonb) can hold: NaN and infinities become strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "nan", "inf", "-inf"
    return value


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)  # "NaN" / "inf" as stored by JSON writers
        except ValueError:
            return None
    return None


def _not_finite(value: Any) -> bool:
    number = _number(value)
    return number is not None and not math.isfinite(number)


@dataclass
class GateReport:
    outcome: str  # pass | fail | wait
    checks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.outcome == PASS

    def failures(self) -> list[str]:
        return [f"{c['name']}: {c['detail']}" for c in self.checks if c["outcome"] == FAIL]

    def as_json(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "checks": self.checks}


def _check(name: str, outcome: str, detail: str, value: Any = None) -> dict[str, Any]:
    return {"name": name, "outcome": outcome, "detail": detail, "value": json_number(value)}


def kl_of(run: TrainingRun) -> tuple[float | None, str]:
    """The run's KL to the incumbent and where it was read from."""
    for key in KL_METRIC_KEYS:
        if run.metrics.get(key) is not None:
            return _number(run.metrics[key]), f"training_runs.metrics.{key}"
    if run.kl is not None:
        return _number(run.kl), "training_runs.kl"
    return None, "not measured"


def evaluate_gates(run: TrainingRun | None, kl_bound: float | None) -> GateReport:
    """Check the training run that produced a version (None when none is recorded)."""
    if run is None:
        return GateReport(FAIL, [_check("run_finished", FAIL, "no training run is recorded for this version")])
    if run.status == "running":
        return GateReport(WAIT, [_check("run_finished", WAIT, "the training run is still running", run.status)])
    checks = [_run_finished(run), _loss_finite(run), _kl_bound(run, kl_bound)]
    outcome = FAIL if any(c["outcome"] == FAIL for c in checks) else PASS
    return GateReport(outcome, checks)


def _run_finished(run: TrainingRun) -> dict[str, Any]:
    if run.status != "succeeded":
        error = f" ({run.error})" if run.error else ""
        return _check("run_finished", FAIL, f"the training run ended {run.status}{error}", run.status)
    return _check("run_finished", PASS, "the training run succeeded", run.status)


def _loss_finite(run: TrainingRun) -> dict[str, Any]:
    loss = _number(run.loss)
    bad_metrics = sorted(key for key, value in run.metrics.items() if key not in KL_METRIC_KEYS and _not_finite(value))
    if loss is None:
        return _check("loss_finite", FAIL, "the training run recorded no loss", None)
    if not math.isfinite(loss):
        return _check("loss_finite", FAIL, f"the loss is {loss}", loss)
    if bad_metrics:
        return _check("loss_finite", FAIL, f"metrics not finite: {', '.join(bad_metrics)}", loss)
    return _check("loss_finite", PASS, f"loss {loss:.6g}", loss)


def _kl_bound(run: TrainingRun, kl_bound: float | None) -> dict[str, Any]:
    kl, source = kl_of(run)
    if kl is None:
        return _check("kl_bound", PASS, "KL to the incumbent not measured by the run", None)
    if not math.isfinite(kl):
        return _check("kl_bound", FAIL, f"KL is {kl} ({source})", kl)
    if kl_bound is not None and kl > kl_bound:
        return _check("kl_bound", FAIL, f"KL {kl:.6g} > bound {kl_bound:g} ({source})", kl)
    bound = f"<= {kl_bound:g}" if kl_bound is not None else "(no bound)"
    return _check("kl_bound", PASS, f"KL {kl:.6g} {bound} ({source})", kl)


def with_files_check(report: GateReport, problem: str | None) -> GateReport:
    """`report` with the `adapter_files` check added (`problem`: what is wrong, None when whole)."""
    if report.outcome == WAIT:
        return report
    if problem is None:
        check = _check("adapter_files", PASS, "adapter config and weights are whole")
    else:
        check = _check("adapter_files", FAIL, problem)
    outcome = FAIL if report.outcome == FAIL or problem is not None else PASS
    return GateReport(outcome, [*report.checks, check])
