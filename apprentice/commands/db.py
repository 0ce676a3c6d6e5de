"""`apprentice db upgrade | current`: the schema is changed by Alembic only."""

from __future__ import annotations

import click

from apprentice.commands.common import config_option, database_url, load
from apprentice.store import schema


@click.group("db")
def db_group() -> None:
    """Database schema commands."""


@db_group.command("upgrade")
@config_option
@click.option("--revision", default="head", show_default=True)
def upgrade_command(config_path: str | None, revision: str) -> None:
    """Bring the schema to the code's revision."""
    url = database_url(load(config_path))
    schema.upgrade(url, revision)
    click.echo(f"schema at revision {schema.current_revision(url)}")


@db_group.command("current")
@config_option
def current_command(config_path: str | None) -> None:
    """Print the schema revision of the database and of the code."""
    url = database_url(load(config_path))
    click.echo(f"database: {schema.current_revision(url) or 'empty'}; code: {schema.head_revision()}")
