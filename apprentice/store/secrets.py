"""Secrets an installation makes for itself once, shared by every gateway process."""

from __future__ import annotations

import secrets

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.store.tables import instance_secrets


async def instance_secret(engine: AsyncEngine, name: str, nbytes: int = 32) -> bytes:
    """The named secret, created on first use; concurrent first starts agree on one value."""
    async with engine.begin() as connection:
        await connection.execute(
            insert(instance_secrets)
            .values(name=name, value=secrets.token_bytes(nbytes))
            .on_conflict_do_nothing(index_elements=["name"])
        )
        value: bytes = (
            await connection.execute(select(instance_secrets.c.value).where(instance_secrets.c.name == name))
        ).scalar_one()
        return value
