"""Calls, trajectories, API keys and instance secrets.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("role", sa.Text, nullable=False, server_default="client"),
        sa.Column("key_hash", sa.LargeBinary, nullable=False, unique=True),
        sa.Column("key_prefix", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("revoked_at", sa.DateTime(timezone=True)),
    )
    op.create_table(
        "trajectories",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("policy", sa.Text),
        sa.Column("client_trajectory_id", sa.Text),
        sa.Column("group_id", sa.Text),
        sa.Column("merged_into", pg.UUID(as_uuid=True), sa.ForeignKey("trajectories.id")),
        sa.Column("adapter_version_id", pg.UUID(as_uuid=True)),
        sa.Column("first_call_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_call_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("call_count", sa.Integer, nullable=False, server_default="0"),
        sa.Column("trained_in_run_id", pg.UUID(as_uuid=True)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_trajectories_policy_last_call", "trajectories", ["policy", "last_call_at"])
    op.create_index(
        "ix_trajectories_tenant_client_id",
        "trajectories",
        ["tenant", "client_trajectory_id"],
        postgresql_where=sa.text("client_trajectory_id IS NOT NULL"),
    )
    op.create_index(
        "ix_trajectories_group", "trajectories", ["group_id"], postgresql_where=sa.text("group_id IS NOT NULL")
    )
    op.create_index(
        "ix_trajectories_merged_into",
        "trajectories",
        ["merged_into"],
        postgresql_where=sa.text("merged_into IS NOT NULL"),
    )
    op.create_table(
        "calls",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("response_id", sa.Text),
        sa.Column("trajectory_id", pg.UUID(as_uuid=True), nullable=False),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("api_key_id", pg.UUID(as_uuid=True)),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("policy", sa.Text),
        sa.Column("upstream", sa.Text),
        sa.Column("upstream_model", sa.Text),
        sa.Column("adapter_version_id", pg.UUID(as_uuid=True)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("latency_ms", sa.Double),
        sa.Column("ttft_ms", sa.Double),
        sa.Column("status_code", sa.Integer, nullable=False),
        sa.Column("error", pg.JSONB),
        sa.Column("stream", sa.Boolean, nullable=False, server_default="false"),
        sa.Column("request", pg.JSONB, nullable=False),
        sa.Column("response", pg.JSONB),
        sa.Column("prompt_tokens", sa.Integer),
        sa.Column("completion_tokens", sa.Integer),
        sa.Column("temperature", sa.Double),
        sa.Column("continuation_key", sa.LargeBinary),
        sa.Column("parent_key", sa.LargeBinary),
        sa.Column("stitch_pending", sa.Boolean, nullable=False, server_default="false"),
        sa.Column("shipped_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_calls_response_id", "calls", ["response_id"])
    op.create_index("ix_calls_trajectory", "calls", ["trajectory_id", "created_at"])
    op.create_index("ix_calls_policy_created", "calls", ["policy", "created_at"])
    op.create_index("ix_calls_continuation_key", "calls", ["continuation_key"])
    op.create_table(
        "instance_secrets",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("value", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_calls_parent_key_pending", "calls", ["parent_key"], postgresql_where=sa.text("stitch_pending"))


def downgrade() -> None:
    op.drop_table("instance_secrets")
    op.drop_table("calls")
    op.drop_table("trajectories")
    op.drop_table("api_keys")
