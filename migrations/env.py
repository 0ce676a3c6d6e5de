"""Alembic environment: the only way Apprentice's schema changes.

The URL comes from `config.attributes["url"]` (set by `apprentice db upgrade`) or from
$APPRENTICE_DATABASE_URL / $DATABASE_URL when run through the `alembic` command.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine, pool

from apprentice.store.engine import sqlalchemy_url
from apprentice.store.tables import metadata

config = context.config
target_metadata = metadata


def _url() -> str:
    url = config.attributes.get("url") or os.environ.get("APPRENTICE_DATABASE_URL") or os.environ.get("DATABASE_URL")
    if not url:
        raise RuntimeError("no database URL: set DATABASE_URL or use `apprentice db upgrade`")
    return sqlalchemy_url(url)


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
