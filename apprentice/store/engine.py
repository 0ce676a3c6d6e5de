"""Connections to PostgreSQL: the configured server, or an embedded one (pgserver).

With no DATABASE_URL, `ensure_database_url` starts PostgreSQL under `<data_dir>/pgdata` so
that `apprentice up` needs nothing installed by hand. The process that starts it keeps it
running; worker processes receive the resulting URL through the environment.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import create_engine
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

if TYPE_CHECKING:  # pgserver is imported at run time only where the embedded mode is used
    from pgserver import PostgresServer

log = logging.getLogger(__name__)

_embedded_servers: dict[Path, PostgresServer] = {}


def sqlalchemy_url(url: str) -> str:
    """Accept plain `postgresql://` URLs and select the psycopg 3 driver."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres", "postgresql+psycopg2", "postgresql+asyncpg"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def libpq_url(url: str) -> str:
    """The same database as a libpq URL, for raw psycopg connections."""
    parsed = make_url(url).set(drivername="postgresql")
    return parsed.render_as_string(hide_password=False)


def redact(url: str) -> str:
    """A URL that is safe to log: never print a password."""
    return make_url(url).render_as_string(hide_password=True)


def start_embedded_postgres(data_dir: Path) -> str:
    """Start (or join) the embedded PostgreSQL under data_dir/pgdata and return its URL."""
    pgdata = (data_dir / "pgdata").resolve()
    if pgdata not in _embedded_servers:
        pgdata.parent.mkdir(parents=True, exist_ok=True)
        from pgserver.postgres_server import get_server  # imported here: only the embedded mode needs it

        log.info("starting embedded PostgreSQL in %s", pgdata)
        _embedded_servers[pgdata] = get_server(pgdata, cleanup_mode="stop")
    return _embedded_servers[pgdata].get_uri()


def stop_embedded_postgres() -> None:
    for server in _embedded_servers.values():
        server.cleanup()
    _embedded_servers.clear()


def ensure_database_url(database_url: str | None, data_dir: Path) -> str:
    """The configured URL, or the embedded server's; exported so that workers share it."""
    url = database_url or os.environ.get("DATABASE_URL") or start_embedded_postgres(data_dir)
    os.environ["APPRENTICE_DATABASE_URL"] = url
    return url


def make_async_engine(url: str, **kwargs: Any) -> AsyncEngine:
    # No pre-ping: it costs a round trip per checkout, and every user of the pool (shipper,
    # key refresh, readiness) already retries when a connection turns out to be dead.
    options: dict[str, Any] = {"pool_size": 5, "max_overflow": 5, "pool_pre_ping": False}
    options.update(kwargs)
    return create_async_engine(sqlalchemy_url(url), **options)


def make_sync_engine(url: str, **kwargs: Any) -> Engine:
    options: dict[str, Any] = {"pool_pre_ping": True}
    options.update(kwargs)
    return create_engine(sqlalchemy_url(url), **options)
