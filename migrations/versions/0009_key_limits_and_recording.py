"""Per-key limits and recording opt-outs.

`api_keys.limits` holds a key's own request, token and spend limits (a JSON object; keys absent
from it fall back to the configured defaults), so an operator changes one key's limits without a
restart. `api_keys.training_opt_out` marks a key whose calls are recorded but never trained on;
`trajectories.trainable` is where that choice (the key's or the policy's) lands, so the learner's
selection reads one column instead of joining keys and settings.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "api_keys",
        sa.Column("limits", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    )
    op.add_column(
        "api_keys",
        sa.Column("training_opt_out", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.add_column(
        "trajectories",
        sa.Column("trainable", sa.Boolean, nullable=False, server_default=sa.true()),
    )


def downgrade() -> None:
    op.drop_column("trajectories", "trainable")
    op.drop_column("api_keys", "training_opt_out")
    op.drop_column("api_keys", "limits")
