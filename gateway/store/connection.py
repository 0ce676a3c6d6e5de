"""The psycopg connection under a SQLAlchemy one: the gateway's stores speak SQL to psycopg directly
(COPY, server-side parameters, dict rows) and use the engine only for its pool."""

from __future__ import annotations

from typing import Any

import psycopg
from sqlalchemy.ext.asyncio import AsyncConnection


async def driver_connection(connection: AsyncConnection) -> psycopg.AsyncConnection[Any]:
    raw = await connection.get_raw_connection()
    driver = raw.driver_connection
    assert isinstance(driver, psycopg.AsyncConnection)  # the engines are made for the psycopg driver
    return driver
