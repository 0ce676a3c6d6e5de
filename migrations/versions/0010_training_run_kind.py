"""Training runs say what kind of training they did: GRPO ("rl") or distillation ("sft").

A distillation run (docs/distillation.md) trains the policy's LoRA by supervised fine-tuning on
a teacher's best rewarded answers; it extends the same lineage, through the same lifecycle and
gates, as an RL run. The kind is a column (not only a key in `config`) so that the admin API
and the dashboard list a policy's distilled versions with one indexed filter.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("training_runs", sa.Column("kind", sa.Text, nullable=False, server_default="rl"))
    op.create_check_constraint("training_runs_kind", "training_runs", "kind IN ('rl', 'sft')")


def downgrade() -> None:
    op.drop_constraint("training_runs_kind", "training_runs", type_="check")
    op.drop_column("training_runs", "kind")
