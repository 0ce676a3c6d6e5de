"""Calls record the protocol the client spoke, and the native request and answer when the
gateway translated them to chat completions (Responses, Anthropic Messages).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("calls", sa.Column("protocol", sa.Text, nullable=False, server_default="chat.completions"))
    op.add_column("calls", sa.Column("native_request", pg.JSONB))
    op.add_column("calls", sa.Column("native_response", pg.JSONB))


def downgrade() -> None:
    op.drop_column("calls", "native_response")
    op.drop_column("calls", "native_request")
    op.drop_column("calls", "protocol")
