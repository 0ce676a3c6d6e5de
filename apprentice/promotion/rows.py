"""Typed rows of the promotion tables, read once at the edge of the store.

Promotion code reads attributes, not string keys, so a renamed or dropped column fails where
the row is built (a KeyError naming the column) instead of deep inside a decision; and a new
column reaches no answer until it is added here and to the admin API's models.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Row

from apprentice.promotion.status import VersionStatus

_Row = TypeVar("_Row")


def _columns(cls: type[_Row], row: Row[Any] | Mapping[str, Any]) -> dict[str, Any]:
    """The row's values for the dataclass's fields (extra columns are left out)."""
    mapping: Mapping[Any, Any] = row._mapping if isinstance(row, Row) else row
    return {field.name: mapping[field.name] for field in fields(cls)}  # type: ignore[arg-type]


@dataclass(frozen=True)
class AdapterVersion:
    """An `adapter_versions` row: one trained LoRA adapter of a policy and where it stands."""

    id: uuid.UUID
    policy: str
    version: int
    name: str  # the LoRA name the inference endpoints serve it under, e.g. "support-agent-v3"
    status: VersionStatus
    base_model: str
    path: str
    parent_version_id: uuid.UUID | None
    training_run_id: uuid.UUID | None
    rank: int | None
    alpha: float | None
    target_modules: list[str] | None
    canary_share: float | None
    gates: dict[str, Any]
    evaluation: dict[str, Any]
    files_deleted_at: datetime | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Row[Any] | Mapping[str, Any]) -> AdapterVersion:
        values = _columns(cls, row)
        values["status"] = VersionStatus(values["status"])
        return cls(**values)


@dataclass(frozen=True)
class Transition:
    """An `adapter_transitions` row: one status change, who asked for it and why."""

    id: int
    adapter_version_id: uuid.UUID
    policy: str
    from_status: VersionStatus | None  # None: the version's first row (it became a candidate)
    to_status: VersionStatus
    actor: str  # the admin key's name, or "auto"
    reason: str | None
    created_at: datetime

    @classmethod
    def from_row(cls, row: Row[Any] | Mapping[str, Any]) -> Transition:
        values = _columns(cls, row)
        values["from_status"] = None if values["from_status"] is None else VersionStatus(values["from_status"])
        values["to_status"] = VersionStatus(values["to_status"])
        return cls(**values)


@dataclass(frozen=True)
class TrainingRun:
    """A `training_runs` row: the learner run that produced a version (what its gates check)."""

    id: uuid.UUID
    policy: str
    status: str  # running | succeeded | failed | aborted | skipped
    trigger: str
    kind: str  # rl (GRPO) | sft (distillation from a teacher), migration 0010
    host: str | None
    pid: int | None
    started_at: datetime
    finished_at: datetime | None
    from_version_id: uuid.UUID | None
    produced_version_id: uuid.UUID | None
    trajectories: int | None
    groups: int | None
    groups_equal_rewards: int | None
    groups_greedy: int | None
    samples: int | None
    tokens: int | None
    loss: float | None
    mean_reward: float | None
    mean_advantage: float | None
    kl: float | None
    clip_fraction: float | None
    duration_s: float | None
    code_version: str | None
    config: dict[str, Any]
    metrics: dict[str, Any]
    error: str | None

    @classmethod
    def from_row(cls, row: Row[Any] | Mapping[str, Any]) -> TrainingRun:
        return cls(**_columns(cls, row))


@dataclass(frozen=True)
class PolicyState:
    """A `policy_state` row: whether an admin paused learning and automatic promotion."""

    policy: str
    learning_paused: bool
    updated_by: str | None
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Row[Any] | Mapping[str, Any]) -> PolicyState:
        return cls(**_columns(cls, row))
