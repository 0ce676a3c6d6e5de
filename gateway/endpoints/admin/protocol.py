"""Wire types of the admin API (/v1/admin/...)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class VersionBrief(BaseModel):
    id: str
    name: str = Field(description="The LoRA name the inference endpoints serve it under.")
    version: int
    status: Literal["candidate", "canary", "promoted", "retired", "rejected"]
    canary_share: float | None = None


class PolicyOut(BaseModel):
    object: Literal["policy"] = "policy"
    name: str
    base_model: str
    endpoints: list[str]
    promotion: dict[str, Any] = Field(description="The policy's `promotion` settings.")
    learning_paused: bool
    paused_by: str | None = None
    promoted: VersionBrief | None = Field(description="Serves every trajectory the canary does not; "
                                                      "none: the base model serves.")
    canary: VersionBrief | None = Field(description="Serves `canary_share` of new trajectories.")
    candidates: int = Field(description="Versions waiting for their gates or a canary slot.")


class PolicyListOut(BaseModel):
    object: Literal["list"] = "list"
    data: list[PolicyOut]


class TransitionOut(BaseModel):
    id: int
    from_status: str | None
    to_status: str
    actor: str = Field(description="The admin key's name, or `auto`.")
    reason: str | None
    created_at: datetime


class VersionOut(BaseModel):
    object: Literal["adapter_version"] = "adapter_version"
    id: str
    policy: str
    version: int
    name: str
    status: str
    base_model: str
    path: str
    parent_version_id: str | None
    training_run_id: str | None
    rank: int | None
    alpha: float | None
    target_modules: list[str] | None
    canary_share: float | None
    gates: dict[str, Any] = Field(description="The gate checks: run finished, loss finite, KL under the bound.")
    evaluation: dict[str, Any] = Field(description="The canary comparison (arms, interval, verdict, decision).")
    files_deleted_at: datetime | None
    created_at: datetime
    updated_at: datetime


class VersionListOut(BaseModel):
    object: Literal["list"] = "list"
    data: list[VersionOut]


class VersionDetailOut(VersionOut):
    training_run: dict[str, Any] | None = Field(description="The `training_runs` row that produced it.")
    transitions: list[TransitionOut]


class EndpointOutcomeOut(BaseModel):
    endpoint: str
    action: str = Field(description="present, loaded or reloaded.")
    attempts: int


class ActionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(default=None, max_length=2000, description="Recorded with the transition.")


class PromoteIn(ActionIn):
    force: bool = Field(default=False, description="Promote a candidate even if it fails its gates.")


class RollbackIn(ActionIn):
    version_id: str | None = Field(default=None, description="The retired version's id or LoRA name.")
    version: int | str | None = Field(default=None, description="Or its number (3 or \"v3\").")

    @model_validator(mode="after")
    def _one(self) -> "RollbackIn":
        if (self.version_id is None) == (self.version is None):
            raise ValueError("give exactly one of version_id and version")
        return self


class ActionOut(BaseModel):
    object: Literal["adapter_version.transition"] = "adapter_version.transition"
    changed: bool = Field(description="False when the version already had the asked status (nothing written).")
    from_status: str
    version: VersionOut
    retired: list[VersionBrief] = Field(description="Versions retired by this promotion.")
    endpoints: list[EndpointOutcomeOut] = Field(description="Where the adapter was loaded and verified.")
    gates: dict[str, Any] | None = None


class PolicyStateOut(BaseModel):
    object: Literal["policy_state"] = "policy_state"
    policy: str
    learning_paused: bool
    updated_by: str | None
    updated_at: datetime
