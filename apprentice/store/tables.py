"""The schema, as SQLAlchemy Core tables. Alembic migrations in `migrations/` create it.

Designed for millions of calls: payloads are JSONB, hot lookups are indexed (a call by the
`chatcmpl-...` id the client holds, a trajectory's calls, a policy's recent trajectories),
and stitching keys are 16-byte hashes.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Double,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

metadata = MetaData()

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("name", Text, nullable=False),
    Column("tenant", Text, nullable=False),
    # "client" keys call /v1; "admin" keys also reach the admin API.
    Column("role", Text, nullable=False, server_default="client"),
    # sha256 of the key: keys are 32 random bytes, so an unsalted fast hash is safe.
    Column("key_hash", LargeBinary, nullable=False, unique=True),
    # The first characters, to tell keys apart in listings without revealing them.
    Column("key_prefix", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("revoked_at", DateTime(timezone=True)),
    # 0009: the key's own rate limits and budget (RateLimits fields; absent: the configured default).
    Column("limits", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # 0009: the key's calls are recorded but never trained on (their trajectories: trainable false).
    Column("training_opt_out", Boolean, nullable=False, server_default=text("false")),
)

# 0011: each gateway process's current rate-limit window counts, exchanged about every second so
# that every process decides from the sum (gateway/limits/sync.py). Small: old windows are deleted.
limit_counters = Table(
    "limit_counters",
    metadata,
    Column("process_id", Text, primary_key=True),
    Column("scope", Text, primary_key=True),  # "key:<id>" or "tenant:<name>"
    Column("window_s", Integer, primary_key=True),
    Column("window_index", BigInteger, primary_key=True),  # floor(epoch seconds / window_s)
    Column("requests", BigInteger, nullable=False, server_default="0"),
    Column("tokens", BigInteger, nullable=False, server_default="0"),
    Column("spend_usd", Double, nullable=False, server_default="0"),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

trajectories = Table(
    "trajectories",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("model", Text, nullable=False),
    # Set when `model` is a policy that Apprentice trains.
    Column("policy", Text),
    Column("client_trajectory_id", Text),
    Column("group_id", Text),
    # A trajectory first seen on one gateway process and later found to continue another
    # (stitched when shipped) points at the one it joined; its id stays valid as an alias.
    Column("merged_into", UUID(as_uuid=True), ForeignKey("trajectories.id")),
    Column("adapter_version_id", UUID(as_uuid=True)),
    Column("first_call_at", DateTime(timezone=True), nullable=False),
    Column("last_call_at", DateTime(timezone=True), nullable=False),
    Column("call_count", Integer, nullable=False, server_default="0"),
    Column("trained_in_run_id", UUID(as_uuid=True)),
    # 0009: false when a call of it came from a key that opted out of training or from a policy
    # with record_for_training false: recorded for observability, never selected or judged.
    Column("trainable", Boolean, nullable=False, server_default=text("true")),
    # 0015: false for an exploration sample (gateway/exploration): an answer no client saw,
    # trained on with its group, never counted in the canary's arms.
    Column("served", Boolean, nullable=False, server_default=text("true")),
    # 0014: the run's task family (apprentice.grouping.task_family of its first call and the
    # client's X-Task-Family): the learner's cross-prompt baseline and the canary's strata.
    Column("task_family", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # 0013: the canary arm the run was assigned at its first call (analysis by assigned arm),
    # the version it pointed to, the probability of the canary's arm then, the randomised unit
    # ('group:<id>', 'client:<id>', 'run:<id>') and the task hash the canary compares within.
    Column("arm", Text),
    Column("arm_version_id", UUID(as_uuid=True)),
    Column("arm_share", Double),
    Column("arm_unit", Text),
    Column("task_key", Text),
    Index("ix_trajectories_policy_last_call", "policy", "last_call_at"),
    Index(
        "ix_trajectories_policy_family_last_call",
        "policy",
        "task_family",
        "last_call_at",
        postgresql_where=text("task_family IS NOT NULL"),
    ),
    Index(
        "ix_trajectories_tenant_client_id",
        "tenant",
        "client_trajectory_id",
        postgresql_where=text("client_trajectory_id IS NOT NULL"),
    ),
    Index("ix_trajectories_group", "group_id", postgresql_where=text("group_id IS NOT NULL")),
    Index("ix_trajectories_merged_into", "merged_into", postgresql_where=text("merged_into IS NOT NULL")),
    Index("ix_trajectories_last_call", "last_call_at", "id"),
    # 0007: the dashboard's list by version, the canary's arms, a version's provenance.
    Index(
        "ix_trajectories_version_last_call",
        "adapter_version_id",
        "last_call_at",
        "id",
        postgresql_where=text("adapter_version_id IS NOT NULL"),
    ),
    Index("ix_trajectories_policy_first_call", "policy", "first_call_at"),
    Index(
        "ix_trajectories_policy_arm_first_call",
        "policy",
        "first_call_at",
        postgresql_where=text("arm IS NOT NULL"),
    ),
    CheckConstraint("arm IN ('canary', 'incumbent')", name="trajectories_arm"),
    Index(
        "ix_trajectories_trained_in_run", "trained_in_run_id", postgresql_where=text("trained_in_run_id IS NOT NULL")
    ),
)

# Partitioned by RANGE on created_at (migration 0012, docs/history.md): one partition per day
# or week, created ahead and dropped by retention (apprentice/store/history.py), and a DEFAULT
# partition for rows outside every range and for the rows retention keeps. The primary key holds
# the partition key: a journal line's created_at never changes between retries, so
# ON CONFLICT (id, created_at) keeps ingestion exactly-once.
calls = Table(
    "calls",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    # The `id` of the upstream's answer (chatcmpl-...), which the client already holds.
    Column("response_id", Text),
    Column("trajectory_id", UUID(as_uuid=True), nullable=False),
    Column("tenant", Text, nullable=False),
    Column("api_key_id", UUID(as_uuid=True)),
    Column("model", Text, nullable=False),
    Column("policy", Text),
    Column("upstream", Text),
    Column("upstream_model", Text),
    Column("adapter_version_id", UUID(as_uuid=True)),
    Column("created_at", DateTime(timezone=True), primary_key=True),
    Column("latency_ms", Double),
    Column("ttft_ms", Double),
    Column("status_code", Integer, nullable=False),
    Column("error", JSONB),
    Column("stream", Boolean, nullable=False, server_default="false"),
    # What the upstream was asked and answered: chat completions for every call the gateway
    # runs through its chat pipeline (translated calls included: what the learner trains on).
    Column("request", JSONB, nullable=False),
    Column("response", JSONB),
    # The protocol the client spoke: chat.completions, responses or messages; for a call the
    # gateway translated, the request and answer as the client sent and received them.
    Column("protocol", Text, nullable=False, server_default="chat.completions"),
    Column("native_request", JSONB),
    Column("native_response", JSONB),
    Column("prompt_tokens", Integer),
    Column("completion_tokens", Integer),
    Column("temperature", Double),
    # blake2b-128 of (tenant, model, request messages + first answer): what a later call of
    # the same run carries as its prefix.
    Column("continuation_key", LargeBinary),
    # Same hash of the request up to its last assistant message: the previous call's
    # continuation key if this call continues a run.
    Column("parent_key", LargeBinary),
    # True while the parent was not known on the process that served the call; the shipper
    # stitches such calls once the parent is stored.
    Column("stitch_pending", Boolean, nullable=False, server_default="false"),
    Column("shipped_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # 0015: an unserved attempt (exploration sample): the served call whose request it answered.
    Column("explores_call_id", UUID(as_uuid=True)),
    Index("ix_calls_response_id", "response_id"),
    Index("ix_calls_trajectory", "trajectory_id", "created_at"),
    Index("ix_calls_policy_created", "policy", "created_at"),
    Index("ix_calls_continuation_key", "continuation_key"),
    Index("ix_calls_parent_key_pending", "parent_key", postgresql_where=text("stitch_pending")),
    postgresql_partition_by="RANGE (created_at)",
)

# Secrets this installation generates for itself, shared by all its gateway processes
# (e.g. the key that derives trajectory ids from client-chosen names).
# 0019: writes to a partition of `calls` while retention copies its kept rows, recorded by the
# trigger function calls_retention_change() that retention puts on that partition only
# (apprentice/store/history.py, the one writer and reader). Empty between retention passes.
calls_retention_changes = Table(
    "calls_retention_changes",
    metadata,
    Column("partition", Text, nullable=False),
    Column("call_id", UUID(as_uuid=True), nullable=False),
    Column("operation", Text, nullable=False),
    Index("ix_calls_retention_changes_partition", "partition"),
)

instance_secrets = Table(
    "instance_secrets",
    metadata,
    Column("name", Text, primary_key=True),
    Column("value", LargeBinary, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# Rewards: every accepted reward is a row (history is never deleted). A row is *current*
# when status = 'linked' and superseded_at IS NULL: at most one per (trajectory_id, name).
# The learner's "rewarded trajectories of policy P not yet trained on" is
#   SELECT t.id, r.value FROM trajectories t
#   JOIN rewards r ON r.trajectory_id = t.id AND r.name = 'reward'
#                 AND r.status = 'linked' AND r.superseded_at IS NULL
#   WHERE t.policy = :p AND t.trained_in_run_id IS NULL AND t.merged_into IS NULL
# (ix_rewards_current). Rows whose trajectory is not stored yet are 'pending'
# (trajectory_id NULL) and are linked by gateway/store/rewards.py when it lands.
rewards = Table(
    "rewards",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    # Arrival order: the tie-break between rewards observed at the same instant.
    Column("seq", BigInteger, Identity(always=False), nullable=False),
    Column("tenant", Text, nullable=False),
    # "trajectory" (a gateway or client trajectory id) or "call" (chatcmpl-... or call uuid).
    Column("target_kind", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("target_trajectory_id", UUID(as_uuid=True)),
    Column("target_call", Text),
    # The (root) trajectory once linked; NULL while pending.
    Column("trajectory_id", UUID(as_uuid=True)),
    Column("status", Text, nullable=False, server_default="pending"),
    Column("reject_reason", Text),
    Column("name", Text, nullable=False, server_default="reward"),
    Column("value", Double, nullable=False),
    Column("metrics", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("comment", Text),
    Column("group_id", Text),
    Column("idempotency_key", Text),
    Column("content_hash", LargeBinary, nullable=False),
    Column("source", Text, nullable=False),  # "key", "webhook:<secret name>" or "judge"
    Column("api_key_id", UUID(as_uuid=True)),
    # A judge's score: the judgement (judge model, rubric hash) it came from.
    Column("judgement_id", UUID(as_uuid=True)),
    # When the outcome was observed (client `timestamp`, else receipt): "latest" means this.
    Column("observed_at", DateTime(timezone=True), nullable=False),
    Column("received_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("linked_at", DateTime(timezone=True)),
    Column("superseded_at", DateTime(timezone=True)),
    CheckConstraint("status IN ('pending', 'linked', 'rejected')", name="ck_rewards_status"),
    CheckConstraint("(status = 'pending') = (trajectory_id IS NULL)", name="ck_rewards_linked"),
    Index(
        "ix_rewards_current",
        "trajectory_id",
        "name",
        postgresql_where=text("status = 'linked' AND superseded_at IS NULL"),
    ),
    Index(
        "ix_rewards_slot",
        "trajectory_id",
        "name",
        text("observed_at DESC"),
        text("seq DESC"),
        postgresql_where=text("trajectory_id IS NOT NULL"),
    ),
    Index("ix_rewards_pending", "received_at", postgresql_where=text("status = 'pending'")),
    Index("ix_rewards_judgement", "judgement_id", postgresql_where=text("judgement_id IS NOT NULL")),
    Index("ix_rewards_received", "received_at"),
    # 0007: the dashboard's trajectory list filtered by a reward range.
    Index(
        "ix_rewards_current_value",
        "name",
        "value",
        postgresql_include=["trajectory_id"],
        postgresql_where=text("status = 'linked' AND superseded_at IS NULL"),
    ),
    Index(
        "uq_rewards_idempotency",
        "tenant",
        "idempotency_key",
        "content_hash",
        unique=True,
        postgresql_where=text("idempotency_key IS NOT NULL"),
    ),
)

# Signatures of accepted webhook deliveries, to refuse replays across gateway processes.
# Rows older than twice the tolerance window are deleted: older ones are refused as stale.
reward_signatures = Table(
    "reward_signatures",
    metadata,
    Column("signature", LargeBinary, primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("signed_at", DateTime(timezone=True), nullable=False),
    Column("received_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("ix_reward_signatures_signed_at", "signed_at"),
)


training_runs = Table(
    "training_runs",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("policy", Text, nullable=False),
    Column("status", Text, nullable=False, server_default="running"),  # running|succeeded|failed|aborted|skipped
    Column("trigger", Text, nullable=False, server_default="manual"),
    # "rl": GRPO on the policy's own samples; "sft": distillation from a teacher (migration 0010)
    Column("kind", Text, nullable=False, server_default="rl"),
    Column("host", Text),
    Column("pid", Integer),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("finished_at", DateTime(timezone=True)),
    Column("from_version_id", UUID(as_uuid=True)),
    Column("produced_version_id", UUID(as_uuid=True)),
    Column("trajectories", Integer),
    Column("groups", Integer),
    Column("groups_equal_rewards", Integer),
    Column("groups_greedy", Integer),
    Column("samples", Integer),
    Column("tokens", BigInteger),
    Column("loss", Double),
    Column("mean_reward", Double),
    Column("mean_advantage", Double),
    Column("kl", Double),
    Column("clip_fraction", Double),
    Column("duration_s", Double),
    Column("code_version", Text),
    Column("config", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("metrics", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("error", Text),
)

adapter_versions = Table(
    "adapter_versions",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("policy", Text, nullable=False),
    Column("version", Integer, nullable=False),
    # The LoRA name inference endpoints know it by (vLLM's lora_name), e.g. "support-agent-v3".
    Column("name", Text, nullable=False, unique=True),
    Column("status", Text, nullable=False, server_default="candidate"),  # candidate|canary|promoted|retired|rejected
    Column("base_model", Text, nullable=False),
    Column("path", Text, nullable=False),
    Column("parent_version_id", UUID(as_uuid=True), ForeignKey("adapter_versions.id")),
    Column("training_run_id", UUID(as_uuid=True), ForeignKey("training_runs.id")),
    Column("rank", Integer),
    Column("alpha", Double),
    Column("target_modules", JSONB),
    Column("canary_share", Double),
    Column("gates", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("evaluation", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("files_deleted_at", DateTime(timezone=True)),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

adapter_transitions = Table(
    "adapter_transitions",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("adapter_version_id", UUID(as_uuid=True), ForeignKey("adapter_versions.id"), nullable=False),
    Column("policy", Text, nullable=False),
    Column("from_status", Text),
    Column("to_status", Text, nullable=False),
    Column("actor", Text, nullable=False),  # the admin key's name, or "auto"
    Column("reason", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("ix_adapter_transitions_policy", "policy", "id"),
)

policy_state = Table(
    "policy_state",
    metadata,
    Column("policy", Text, primary_key=True),
    Column("learning_paused", Boolean, nullable=False, server_default="false"),
    Column("updated_by", Text),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# One LLM judging of one group (or one chunk of a large group) by one judge and rubric.
# The unique key (its members, judge and rubric) is what "never judged twice" means; a row is
# claimed as 'running' with a lease (a process that dies leaves it to be claimed again after the
# lease), and ends 'judged' (its
# scores are rewards with source 'judge' and this judgement_id) or 'failed' with the reason.
judgements = Table(
    "judgements",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("policy", Text, nullable=False),
    Column("tenant", Text, nullable=False),
    # The group within its tenant as the learner groups it: "group:<client id>" or "task:<hash>".
    Column("group_key", Text, nullable=False),
    Column("chunk", Integer, nullable=False, server_default="0"),
    # md5 of the sorted trajectory ids: a group with new members is a new judgement.
    Column("members_key", Text, nullable=False),
    Column("judge_model", Text, nullable=False),
    Column("rubric_hash", Text, nullable=False),
    Column("mode", Text, nullable=False),  # missing | always | manual
    Column("status", Text, nullable=False, server_default="running"),  # running | judged | failed
    Column("reason", Text),
    Column("trajectory_ids", ARRAY(UUID(as_uuid=True)), nullable=False),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("prompt_tokens", BigInteger, nullable=False, server_default="0"),
    Column("completion_tokens", BigInteger, nullable=False, server_default="0"),
    # The judge's own calls are recorded under this client trajectory id (never trained on).
    Column("judge_trajectory", Text),
    Column("answer", JSONB),
    Column("lease_until", DateTime(timezone=True)),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("finished_at", DateTime(timezone=True)),
    CheckConstraint("status IN ('running', 'judged', 'failed')", name="ck_judgements_status"),
    # What "never judged twice" means: the same trajectories, judge and rubric (migration 0008).
    Index("uq_judgements_members", "policy", "judge_model", "rubric_hash", "members_key", unique=True),
    Index("ix_judgements_group", "policy", "tenant", "group_key"),
    Index("ix_judgements_members", "trajectory_ids", postgresql_using="gin"),
    Index("ix_judgements_policy_started", "policy", "started_at"),
)

# 0016: evaluation sets (docs/evaluation-sets.md). A held-out set of a policy: items (a prompt
# conversation, a snapshot of a recorded trajectory's, scored by an expected answer, the judge or
# an operator's reward function), runs (one version, or the base model, scored on the set) and
# each run's per-item results, which the promotion's evaluation gate compares item by item.
# Written only by apprentice/evalsets/store.py.
eval_sets = Table(
    "eval_sets",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("policy", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("description", Text),
    # How items without their own `scoring` are scored (apprentice/evalsets/scoring.py).
    Column("scoring", JSONB, nullable=False),
    Column("created_by", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("uq_eval_sets_policy_name", "policy", "name", unique=True),
)

eval_items = Table(
    "eval_items",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("set_id", UUID(as_uuid=True), ForeignKey("eval_sets.id", ondelete="CASCADE"), nullable=False),
    # The conversation the version answers (chat messages, ending where the answer starts).
    Column("messages", JSONB, nullable=False),
    # The recorded trajectory it was taken from, if any (kept as a snapshot: history may be dropped).
    Column("source_trajectory_id", UUID(as_uuid=True)),
    # This item's own scoring; NULL: the set's.
    Column("scoring", JSONB),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("ix_eval_items_set", "set_id", "created_at"),
)

eval_runs = Table(
    "eval_runs",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("set_id", UUID(as_uuid=True), ForeignKey("eval_sets.id", ondelete="CASCADE"), nullable=False),
    Column("policy", Text, nullable=False),
    # The version scored; NULL: the base model.
    Column("adapter_version_id", UUID(as_uuid=True), ForeignKey("adapter_versions.id")),
    # The model name the endpoint was called with (the LoRA name, or the base model).
    Column("target", Text, nullable=False),
    Column("trigger", Text, nullable=False),  # cli | gate | admin
    Column("status", Text, nullable=False, server_default="running"),  # running | finished | failed
    Column("items", Integer, nullable=False, server_default="0"),
    Column("scored", Integer, nullable=False, server_default="0"),
    Column("mean", Double),
    Column("error", Text),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("finished_at", DateTime(timezone=True)),
    CheckConstraint("status IN ('running', 'finished', 'failed')", name="ck_eval_runs_status"),
    Index("ix_eval_runs_set_target", "set_id", "target", "started_at"),
    Index("ix_eval_runs_version", "adapter_version_id"),
)

eval_results = Table(
    "eval_results",
    metadata,
    Column("run_id", UUID(as_uuid=True), ForeignKey("eval_runs.id", ondelete="CASCADE"), primary_key=True),
    Column("item_id", UUID(as_uuid=True), ForeignKey("eval_items.id", ondelete="CASCADE"), primary_key=True),
    # In [0, 1] for expected answers and the judge; the reward function's own scale. NULL: not scored.
    Column("score", Double),
    Column("answer", Text),
    Column("detail", Text),  # why: the judge's explanation, the match, or the scoring error
)

# 0014: reward functions (settings: policies[].reward_functions; gateway/scoring): one row per
# trajectory and function name, claimed 'running' with a lease, ending 'scored' (the score is a
# reward with source 'function') or 'failed' after max_attempts. Its started_at times are the
# function's hourly budget across gateway processes.
function_scorings = Table(
    "function_scorings",
    metadata,
    Column("trajectory_id", UUID(as_uuid=True), ForeignKey("trajectories.id", ondelete="CASCADE"), primary_key=True),
    Column("name", Text, primary_key=True),
    Column("policy", Text, nullable=False),
    Column("status", Text, nullable=False, server_default="running"),  # running | scored | failed
    Column("attempts", Integer, nullable=False, server_default="1"),
    Column("value", Double),
    Column("error", Text),
    Column("lease_until", DateTime(timezone=True)),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("finished_at", DateTime(timezone=True)),
    CheckConstraint("status IN ('running', 'scored', 'failed')", name="ck_function_scorings_status"),
    Index("ix_function_scorings_budget", "policy", "name", "started_at"),
)
