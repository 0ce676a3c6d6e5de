"""Wire types of the admin API (/v1/admin/...), built from promotion's typed rows.

Every answer names its fields here: a column added to a table reaches no answer until it is
added to a model, and a column renamed or dropped fails when the model is built (an error
naming the field) instead of silently answering null. A model read from a typed row names only
fields of that row, with the row's types (`_fields_of` checks it when this module is imported):
the row is the one field list, the model chooses which of them the API answers.
"""

from __future__ import annotations

import uuid
from dataclasses import fields
from datetime import datetime
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from apprentice.evalsets.scoring import Scoring
from apprentice.promotion.listing import PolicySummary, VersionDetail, VersionListing
from apprentice.promotion.provenance import Provenance
from apprentice.promotion.rows import AdapterVersion, TrainingRun, Transition
from apprentice.promotion.serving import ActionResult
from apprentice.promotion.status import VersionStatus
from apprentice.settings import NotBoolean
from gateway.http.timestamps import Timestamp
from gateway.judging.agreement import AgreementReport, Bucket, Figures, Interval


class _FromRow(BaseModel):
    """A model read from the attributes of a typed row (`apprentice.promotion.rows`)."""

    model_config = ConfigDict(from_attributes=True)


_Model = TypeVar("_Model", bound=type[BaseModel])


def _fields_of(row: type, *, constants: tuple[str, ...] = ("object",)) -> Any:
    """Class decorator: every field of the model (but its `constants`) is a field of the typed row
    `row`, declared with the same type; a field the row lacks or types otherwise fails at import."""

    def check(model: _Model) -> _Model:
        declared = {f.name: str(f.type) for f in fields(row)}
        for name, annotation in model.__annotations__.items():
            if name in constants:
                continue
            if name not in declared:
                raise TypeError(f"{model.__name__}.{name}: {row.__name__} has no such field")
            if declared[name] != str(annotation):
                raise TypeError(f"{model.__name__}.{name}: {annotation} here, {declared[name]} in {row.__name__}")
        return model

    return check


class VersionBrief(_FromRow):
    id: uuid.UUID
    name: str = Field(description="The LoRA name the inference endpoints serve it under.")
    version: int
    status: VersionStatus
    canary_share: float | None = None


class PolicyOut(BaseModel):
    object: Literal["policy"] = "policy"
    name: str
    base_model: str
    endpoints: list[str]
    promotion: dict[str, Any] = Field(description="The policy's `promotion` settings.")
    learning_paused: bool
    paused_by: str | None = None
    promoted: VersionBrief | None = Field(
        description="Serves every trajectory the canary does not; none: the base model serves."
    )
    canary: VersionBrief | None = Field(description="Serves `canary_share` of new trajectories.")
    candidates: int = Field(
        description="Candidates of the live lineage (the canary's ancestors and the versions "
        "still waiting for their gates or to become the canary)."
    )
    lineage: list[VersionBrief] = Field(
        description="The live lineage, oldest first: the candidates and the canary "
        "newer than the promoted version, each trained from the one "
        "before."
    )
    lineage_head: VersionBrief | None = Field(
        description="The version the learner's next run continues: the newest "
        "of the lineage, else the promoted version; none: the base "
        "model."
    )

    @classmethod
    def of(cls, summary: PolicySummary) -> PolicyOut:
        policy = summary.policy
        return cls(
            name=policy.name,
            base_model=policy.base_model,
            endpoints=policy.endpoints,
            promotion=policy.promotion.model_dump(mode="json"),
            learning_paused=summary.learning_paused,
            paused_by=summary.paused_by,
            promoted=VersionBrief.model_validate(summary.promoted) if summary.promoted else None,
            canary=VersionBrief.model_validate(summary.canary) if summary.canary else None,
            candidates=summary.candidates,
            lineage=[VersionBrief.model_validate(v) for v in summary.lineage],
            lineage_head=VersionBrief.model_validate(summary.lineage_head) if summary.lineage_head else None,
        )


class PolicyListOut(BaseModel):
    object: Literal["list"] = "list"
    data: list[PolicyOut]


@_fields_of(Transition)
class TransitionOut(_FromRow):
    id: int
    from_status: VersionStatus | None
    to_status: VersionStatus
    actor: str = Field(description="The admin key's name, or `auto`.")
    reason: str | None
    created_at: datetime


@_fields_of(TrainingRun)
class TrainingRunOut(_FromRow):
    id: uuid.UUID
    policy: str
    status: str = Field(description="running, succeeded, failed, aborted or skipped.")
    trigger: str
    kind: str = Field(description="rl (GRPO on rewarded trajectories) or sft (distillation from the teacher).")
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


@_fields_of(AdapterVersion)
class VersionOut(_FromRow):
    object: Literal["adapter_version"] = "adapter_version"
    id: uuid.UUID
    policy: str
    version: int
    name: str
    status: VersionStatus
    base_model: str
    path: str
    parent_version_id: uuid.UUID | None
    training_run_id: uuid.UUID | None
    rank: int | None
    alpha: float | None
    target_modules: list[str] | None
    canary_share: float | None
    gates: dict[str, Any] = Field(description="The gate checks: run finished, loss finite, KL under the bound.")
    evaluation: dict[str, Any] = Field(description="The canary comparison (arms, interval, verdict, decision).")
    files_deleted_at: datetime | None
    created_at: datetime
    updated_at: datetime


class SamplerOut(BaseModel):
    version_id: uuid.UUID | None = Field(description="None: the base model sampled them.")
    name: str | None = Field(description="The sampling version's LoRA name; None: the base model.")
    trajectories: int = Field(description="How many of the trajectories the version trained on it sampled.")


class ParentOut(BaseModel):
    id: uuid.UUID
    name: str


class VersionLineageOut(VersionOut):
    """A version with where it came from: its parent, the lineage, what it trained on."""

    parent: ParentOut | None = Field(description="The version it was trained from; none: the base model.")
    lineage: bool = Field(
        description="Whether it is in the live lineage (a candidate or the canary newer than the promoted version)."
    )
    lineage_head: str | None = Field(
        description="The LoRA name of the policy's lineage head (the version the next "
        "learner run continues); none: the base model."
    )
    samples: int | None = Field(description="The samples its training run took (none: no run recorded).")
    sampled_by: list[SamplerOut] = Field(
        description="The versions that sampled the trajectories it trained on, most first."
    )

    @classmethod
    def parts(cls, version: AdapterVersion, found: Provenance, head: AdapterVersion | None) -> dict[str, Any]:
        parent = found.parent
        return {
            **dict(VersionOut.model_validate(version)),
            "parent": ParentOut(id=parent.id, name=parent.name) if parent is not None else None,
            "lineage": found.in_lineage,
            "lineage_head": head.name if head is not None else None,
            "samples": found.samples,
            "sampled_by": [
                SamplerOut(version_id=s.version_id, name=s.name, trajectories=s.trajectories) for s in found.sampled_by
            ],
        }


class VersionListOut(BaseModel):
    object: Literal["list"] = "list"
    data: list[VersionLineageOut]

    @classmethod
    def of(cls, listing: VersionListing) -> VersionListOut:
        return cls(
            data=[
                VersionLineageOut(**VersionLineageOut.parts(v, listing.provenance[v.id], listing.lineage_head))
                for v in listing.versions
            ]
        )


class VersionDetailOut(VersionLineageOut):
    training_run: TrainingRunOut | None = Field(description="The `training_runs` row that produced it.")
    transitions: list[TransitionOut]

    @classmethod
    def of(cls, detail: VersionDetail) -> VersionDetailOut:
        return cls(
            **VersionLineageOut.parts(detail.version, detail.provenance, detail.lineage_head),
            training_run=TrainingRunOut.model_validate(detail.training_run) if detail.training_run else None,
            transitions=[TransitionOut.model_validate(t) for t in detail.transitions],
        )


class EndpointOutcomeOut(_FromRow):
    endpoint: str
    action: str = Field(description="present, loaded or reloaded.")
    attempts: int


class ActionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(default=None, max_length=2000, description="Recorded with the transition.")


class PromoteIn(ActionIn):
    force: bool = Field(default=False, description="Promote a candidate even if it fails its gates.")


class RollbackIn(ActionIn):
    # The document says what `_one` refuses: exactly one of the two, not null.
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [
                {"required": ["version_id"], "properties": {"version_id": {"type": "string"}}},
                {"required": ["version"], "properties": {"version": {"type": ["integer", "string"]}}},
            ]
        },
    )

    version_id: str | None = Field(default=None, description="The retired version's id or LoRA name.")
    version: Annotated[int | str | None, NotBoolean] = Field(default=None, description='Or its number (3 or "v3").')

    @model_validator(mode="after")
    def _one(self) -> RollbackIn:
        if (self.version_id is None) == (self.version is None):
            raise ValueError("give exactly one of version_id and version")
        return self


class ActionOut(BaseModel):
    object: Literal["adapter_version.transition"] = "adapter_version.transition"
    changed: bool = Field(description="False when the version already had the asked status (nothing written).")
    from_status: VersionStatus
    version: VersionOut
    retired: list[VersionBrief] = Field(
        description="Versions that changed status with it: the version a promotion "
        "retired, the lineage a rollback or a canary's rejection rejected."
    )
    endpoints: list[EndpointOutcomeOut] = Field(description="Where the adapter was loaded and verified.")
    gates: dict[str, Any] | None = None

    @classmethod
    def of(cls, result: ActionResult) -> ActionOut:
        transition = result.transition
        return cls(
            changed=transition.changed,
            from_status=transition.from_status,
            version=VersionOut.model_validate(transition.version),
            retired=[VersionBrief.model_validate(v) for v in transition.side_effects],
            endpoints=[EndpointOutcomeOut.model_validate(e) for e in result.endpoints],
            gates=result.gates.as_json() if result.gates is not None else None,
        )


class PolicyStateOut(_FromRow):
    object: Literal["policy_state"] = "policy_state"
    policy: str
    learning_paused: bool
    updated_by: str | None
    updated_at: datetime


class IntervalOut(BaseModel):
    low: float
    high: float


class SpearmanOut(BaseModel):
    mean: float | None = Field(
        description="Mean over groups of Spearman's rho between the judge's scores and the webhook rewards "
        "(average ranks for ties); none: no group where it is defined."
    )
    groups: int = Field(description="Groups where rho is defined (neither side constant within the group).")
    interval: IntervalOut | None = Field(
        description="95% percentile bootstrap interval, resampling groups; none under two groups."
    )


class PairwiseOut(BaseModel):
    accuracy: float | None = Field(
        description="Over the pairs of a group whose webhook rewards differ: the judge orders them the same "
        "way 1, ties them 0.5, the other way 0; the sum over all pairs divided by their number. "
        "None: no such pair."
    )
    pairs: int
    groups: int = Field(description="Groups with at least one such pair.")
    interval: IntervalOut | None = Field(
        description="95% percentile bootstrap interval, resampling groups (pairs of a group are not "
        "independent); none under two groups."
    )


class AgreementFiguresOut(BaseModel):
    trajectories: int = Field(description="Trajectories with both a current webhook reward and a current judge score.")
    groups: int = Field(description="Judged groups (judgements) with at least two such trajectories.")
    spearman: SpearmanOut
    pairwise: PairwiseOut

    @classmethod
    def parts(cls, figures: Figures) -> dict[str, Any]:
        def interval(found: Interval | None) -> IntervalOut | None:
            return IntervalOut(low=found.low, high=found.high) if found is not None else None

        return {
            "trajectories": figures.trajectories,
            "groups": figures.groups,
            "spearman": SpearmanOut(
                mean=figures.spearman, groups=figures.spearman_groups, interval=interval(figures.spearman_interval)
            ),
            "pairwise": PairwiseOut(
                accuracy=figures.pairwise_accuracy,
                pairs=figures.pairs,
                groups=figures.pairwise_groups,
                interval=interval(figures.pairwise_interval),
            ),
        }


class _BucketSpan(BaseModel):
    start: datetime = Field(description="The bucket's first instant (UTC), inclusive.")
    end: datetime = Field(description="Exclusive.")


class AgreementBucketOut(AgreementFiguresOut, _BucketSpan):
    """The figures of the groups judged in one hour or day (the span's fields come first)."""


class JudgeSourceOut(BaseModel):
    judge_model: str
    rubric_hash: str
    groups: int = Field(description="Its judgements with at least one trajectory that has both rewards.")
    trajectories: int


class JudgeAgreementOut(BaseModel):
    """How well the judge ranks each judged group the way the webhook rewards do."""

    object: Literal["judge.agreement"] = "judge.agreement"
    policy: str
    webhook_reward: str = Field(description="The webhook reward's name (the policy's `learning.reward_name`).")
    judge_reward: str = Field(description="The judge's reward name (`judge.reward_name`, else `judge`).")
    bucket: Bucket
    since: datetime | None = Field(description="Only groups judged at or after this time; none: all.")
    rubric_hash: str | None = Field(description="Only judgements with this rubric hash; none: any.")
    resamples: int = Field(description="Bootstrap resamples of every interval (fewer when there are many groups).")
    overall: AgreementFiguresOut
    buckets: list[AgreementBucketOut] = Field(
        description="Oldest first, by the time the group was judged; only buckets with data."
    )
    judges: list[JudgeSourceOut] = Field(description="The judge models and rubric hashes that contributed.")

    @classmethod
    def of(
        cls,
        report: AgreementReport,
        *,
        policy: str,
        webhook_reward: str,
        judge_reward: str,
        bucket: Bucket,
        since: datetime | None,
        rubric_hash: str | None,
    ) -> JudgeAgreementOut:
        return cls(
            policy=policy,
            webhook_reward=webhook_reward,
            judge_reward=judge_reward,
            bucket=bucket,
            since=since,
            rubric_hash=rubric_hash,
            resamples=report.resamples,
            overall=AgreementFiguresOut(**AgreementFiguresOut.parts(report.overall)),
            buckets=[
                AgreementBucketOut(start=b.start, end=b.end, **AgreementFiguresOut.parts(b.figures))
                for b in report.buckets
            ],
            judges=[
                JudgeSourceOut(
                    judge_model=s.judge_model, rubric_hash=s.rubric_hash, groups=s.groups, trajectories=s.trajectories
                )
                for s in report.sources
            ],
        )


# ---------------------------------------------------------------- evaluation sets (docs/evaluation-sets.md)


def _without_nul(value: Any) -> Any:
    """Refuse a NUL character anywhere in a document that PostgreSQL stores as text or jsonb (it
    holds neither), so the request answers 400 naming the problem instead of failing in the store."""
    if isinstance(value, str) and "\x00" in value:
        raise ValueError("text must not contain the NUL character (\\u0000)")
    if isinstance(value, dict):
        for key, item in value.items():
            _without_nul(key)
            _without_nul(item)
    elif isinstance(value, list):
        for item in value:
            _without_nul(item)
    return value


class _StoredDocument(BaseModel):
    """A request body stored as text and jsonb: no NUL characters anywhere."""

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        return _without_nul(value)


class EvalSetIn(_StoredDocument):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str | None = Field(default=None, max_length=2000)
    scoring: Scoring = Field(description="How items without their own scoring are scored.")


class EvalItemIn(_StoredDocument):
    model_config = ConfigDict(extra="forbid")

    messages: list[dict[str, Any]] = Field(
        min_length=1, description="The conversation the version answers (chat messages, ending before the answer)."
    )
    scoring: Scoring | None = Field(default=None, description="This item's scoring; none: the set's.")


class TrajectoryQueryIn(_StoredDocument):
    model_config = ConfigDict(extra="forbid")

    since: Timestamp | None = Field(
        default=None,
        description="Trajectories whose last call is at or after this (RFC 3339, UTC when no offset, or unix seconds).",
    )
    until: Timestamp | None = Field(default=None, description="... and before this.")
    reward_name: str | None = Field(default=None, description="Filter on this current reward (default: the policy's).")
    min_reward: Annotated[float | None, NotBoolean] = None
    max_reward: Annotated[float | None, NotBoolean] = None
    limit: Annotated[int, NotBoolean] = Field(default=100, ge=1, le=10_000)


class EvalItemsIn(_StoredDocument):
    """Items to add: given outright, recorded trajectories by id, or those a query finds (any mix)."""

    model_config = ConfigDict(extra="forbid")

    items: list[EvalItemIn] = Field(default_factory=list, max_length=10_000)
    trajectory_ids: list[uuid.UUID] = Field(
        default_factory=list, max_length=10_000, description="Recorded trajectories of the policy (their last call)."
    )
    query: TrajectoryQueryIn | None = None
    scoring: Scoring | None = Field(default=None, description="The scoring of the trajectory items; none: the set's.")


class EvalItemOut(_FromRow):
    object: Literal["eval.item"] = "eval.item"
    id: uuid.UUID
    messages: list[dict[str, Any]]
    source_trajectory_id: uuid.UUID | None
    scoring: dict[str, Any] | None
    created_at: datetime


class EvalRunOut(_FromRow):
    object: Literal["eval.run"] = "eval.run"
    id: uuid.UUID
    adapter_version_id: uuid.UUID | None = Field(description="The version scored; none: the base model.")
    target: str = Field(description="The model name the endpoints were called with.")
    trigger: str = Field(description="cli | gate | admin")
    status: str
    items: int
    scored: int
    mean: float | None
    error: str | None
    started_at: datetime
    finished_at: datetime | None


class EvalSetOut(_FromRow):
    object: Literal["eval.set"] = "eval.set"
    id: uuid.UUID
    policy: str
    name: str
    description: str | None
    scoring: dict[str, Any]
    created_by: str | None
    created_at: datetime
    items: int = Field(description="How many items the set holds.")
    gate: bool = Field(default=False, description="The policy's promotion.eval_gate uses this set.")


class EvalSetListOut(BaseModel):
    object: Literal["list"] = "list"
    data: list[EvalSetOut]


class EvalSetDetailOut(EvalSetOut):
    item_list: list[EvalItemOut] = Field(description="The set's items, oldest first.")
    runs: list[EvalRunOut] = Field(description="The latest runs on the set, newest first.")


class EvalItemsAddedOut(BaseModel):
    object: Literal["list"] = "list"
    data: list[EvalItemOut]
    missing_trajectory_ids: list[uuid.UUID] = Field(
        description="Ids asked for that are not the policy's recorded trajectories with a conversation."
    )
