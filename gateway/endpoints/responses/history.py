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
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from psycopg.rows import dict_row
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.endpoints.responses.translate import continued_messages
from gateway.store.connection import driver_connection

MAX_REMEMBERED = 20_000
STORE_WAIT_S = 3.0
STORE_POLL_S = 0.1

_STORED = """
SELECT c.native_request, c.request, c.response, coalesce(t.merged_into, c.trajectory_id) AS trajectory_id
FROM calls c LEFT JOIN trajectories t ON t.id = c.trajectory_id
WHERE c.response_id = %(id)s AND c.tenant = %(tenant)s AND c.protocol = 'responses' AND c.status_code = 200
  AND c.native_request IS NOT NULL
ORDER BY c.created_at DESC LIMIT 1
"""


@dataclass(frozen=True, slots=True)
class Previous:
    """What a call naming a previous response continues: its conversation and its trajectory.

    The trajectory is carried explicitly because the conversation alone does not always find it:
    the previous call's instructions are not part of what continues (they apply to one call), so
    a call with other instructions does not extend the previous call's messages."""

    conversation: list[dict[str, Any]]
    trajectory_id: uuid.UUID


class ResponseHistory:
    def __init__(self, engine: AsyncEngine, max_entries: int = MAX_REMEMBERED) -> None:
        self.engine = engine
        self.max_entries = max_entries
        self._conversations: OrderedDict[tuple[str, str], Previous] = OrderedDict()

    def remember(self, tenant: str, response_id: str, previous: Previous) -> None:
        self._conversations[(tenant, response_id)] = previous
        self._conversations.move_to_end((tenant, response_id))
        while len(self._conversations) > self.max_entries:
            self._conversations.popitem(last=False)

    async def previous(self, tenant: str, response_id: str) -> Previous | None:
        """The conversation and trajectory a call continuing `response_id` continues; None: no such response."""
        known = self._conversations.get((tenant, response_id))
        if known is not None:
            return known
        deadline = asyncio.get_running_loop().time() + STORE_WAIT_S
        while True:
            row = await self._stored(tenant, response_id)
            if row is not None:
                conversation = continued_messages(row["native_request"], row["request"], row["response"])
                found = Previous(conversation, row["trajectory_id"])
                self.remember(tenant, response_id, found)
                return found
            if asyncio.get_running_loop().time() >= deadline:
                return None
            await asyncio.sleep(STORE_POLL_S)

    async def _stored(self, tenant: str, response_id: str) -> dict[str, Any] | None:
        async with self.engine.connect() as connection:
            pg = await driver_connection(connection)
            async with pg.cursor(row_factory=dict_row) as cursor:
                await cursor.execute(_STORED, {"id": response_id, "tenant": tenant})
                return await cursor.fetchone()
