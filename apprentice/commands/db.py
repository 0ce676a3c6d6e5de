"""`apprentice db upgrade | current | history`: the schema is changed by Alembic only; `history`
runs the partition maintenance of `calls` by hand (docs/history.md)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import click
import psycopg

from apprentice.commands.common import config_option, database_url, load
from apprentice.settings import HistorySettings
from apprentice.store import history, schema
from apprentice.store.engine import libpq_url


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


@db_group.command("history")
@config_option
@click.option(
    "--retention-days",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Drop partitions older than this (default: history.retention_days of the config; none: keep all).",
)
@click.option("--list", "list_only", is_flag=True, help="Only list the partitions of calls; change nothing.")
def history_command(config_path: str | None, retention_days: float | None, list_only: bool) -> None:
    """Create the partitions of calls ahead and apply retention now (what the gateway does hourly).

    Prints one JSON object: what was created and dropped, how many calls were dropped and kept.
    """
    settings = load(config_path)
    url = database_url(settings)
    history_settings = settings.history
    if retention_days is not None:
        history_settings = history_settings.model_copy(update={"retention_days": retention_days})
    click.echo(json.dumps(asyncio.run(_history(libpq_url(url), history_settings, list_only)), indent=2))


async def _history(url: str, settings: HistorySettings, list_only: bool) -> dict[str, Any]:
    async with await psycopg.AsyncConnection.connect(url) as connection:
        result: dict[str, Any] = {}
        if not list_only:
            result = (await history.maintain(connection, settings)).as_dict()
        result["partitions"] = [
            {"name": p.name, "from": p.lower.isoformat(), "to": p.upper.isoformat()}
            for p in await history.partitions(connection)
        ]
        return result
