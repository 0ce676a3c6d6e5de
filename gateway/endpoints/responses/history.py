"""The conversation a `previous_response_id` continues, for responses the gateway translated.

Our endpoints keep no state, so a Responses call that names a previous response is expanded
to the whole conversation before it reaches them: the previous call's chat messages (its
instructions left out: they apply to one call only) and its answer. The same messages make the
call continue the previous call's trajectory exactly, on any process: stitching hashes them
(gateway/trajectories/stitching.py).

Where the conversation comes from:
- this process's memory, for the responses it answered recently (bounded LRU);
- else PostgreSQL, where every process's calls land within about a second (the journal ships
  them); a response named before it landed is waited for up to `STORE_WAIT_S`.
A response of another tenant is never found: the lookup is keyed by tenant.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

from psycopg.rows import dict_row
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.endpoints.responses.translate import continued_messages
from gateway.store.connection import driver_connection

MAX_REMEMBERED = 20_000
STORE_WAIT_S = 3.0
STORE_POLL_S = 0.1

_STORED = """
SELECT native_request, request, response FROM calls
WHERE response_id = %(id)s AND tenant = %(tenant)s AND protocol = 'responses' AND status_code = 200
  AND native_request IS NOT NULL
ORDER BY created_at DESC LIMIT 1
"""


class ResponseHistory:
    def __init__(self, engine: AsyncEngine, max_entries: int = MAX_REMEMBERED) -> None:
        self.engine = engine
        self.max_entries = max_entries
        self._conversations: OrderedDict[tuple[str, str], list[dict[str, Any]]] = OrderedDict()

    def remember(self, tenant: str, response_id: str, conversation: list[dict[str, Any]]) -> None:
        self._conversations[(tenant, response_id)] = conversation
        self._conversations.move_to_end((tenant, response_id))
        while len(self._conversations) > self.max_entries:
            self._conversations.popitem(last=False)

    async def conversation(self, tenant: str, response_id: str) -> list[dict[str, Any]] | None:
        """The chat messages a call continuing `response_id` starts with; None: no such response."""
        known = self._conversations.get((tenant, response_id))
        if known is not None:
            return known
        deadline = asyncio.get_running_loop().time() + STORE_WAIT_S
        while True:
            row = await self._stored(tenant, response_id)
            if row is not None:
                conversation = continued_messages(row["native_request"], row["request"], row["response"])
                self.remember(tenant, response_id, conversation)
                return conversation
            if asyncio.get_running_loop().time() >= deadline:
                return None
            await asyncio.sleep(STORE_POLL_S)

    async def _stored(self, tenant: str, response_id: str) -> dict[str, Any] | None:
        async with self.engine.connect() as connection:
            pg = await driver_connection(connection)
            async with pg.cursor(row_factory=dict_row) as cursor:
                await cursor.execute(_STORED, {"id": response_id, "tenant": tenant})
                return await cursor.fetchone()
