"""Schema versions: upgrade with Alembic, and refuse to serve on an out-of-date schema."""

from __future__ import annotations

import os
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from apprentice.store.engine import make_sync_engine

UPGRADE_HINT = "apprentice db upgrade"


class SchemaOutOfDate(RuntimeError):
    """The database's schema revision is not the code's head revision."""


def migrations_dir() -> Path:
    override = os.environ.get("APPRENTICE_MIGRATIONS_DIR")
    return Path(override) if override else Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.attributes["url"] = url
    return config


def head_revision() -> str:
    heads = ScriptDirectory.from_config(alembic_config("postgresql://unused")).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"migrations have {len(heads)} heads ({heads}); merge them")
    return heads[0]


def current_revision(url: str) -> str | None:
    engine = make_sync_engine(url, pool_pre_ping=False)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def check_schema(url: str) -> None:
    """Raise SchemaOutOfDate, naming the command that fixes it, unless the schema is at head."""
    current, head = current_revision(url), head_revision()
    if current != head:
        state = "empty (no schema yet)" if current is None else f"at revision {current}"
        raise SchemaOutOfDate(
            f"the database schema is {state}, this version of Apprentice needs revision {head}: "
            f"run `{UPGRADE_HINT}` (with the same config / DATABASE_URL) and start again"
        )
