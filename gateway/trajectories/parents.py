"""The run a call continues when another gateway process served its previous call.

Stitching by content (stitching.py) knows the runs this process served. A run's next call that
reaches another process or replica (a load balancer that spreads requests, a client that opens a
new connection) carries its parent's continuation key but finds nothing in this process's index:
it is stored as a provisional trajectory and merged later by the shipper, which is enough for
training, but not for the canary, whose runs must stay on the version their first call was
assigned (the arm is by run, drawn at random: another process cannot recompute it).

So while a canary serves the policy, such a call asks the store for the parent call (one indexed
lookup by continuation key) and joins its run and version at once. The parent may not be stored
yet: an agent's next call can come within milliseconds of the answer. So while a canary serves,
the parent's process ships such a call's record as soon as it is journaled, before the answer's
last byte leaves (the chat handler's `_awaited_elsewhere`), rather than within
`journal.ship_interval_s`, and the lookup here is retried for `stitching.parent_wait_margin_s`.
A parent not found by then leaves the call provisional, and its run draws an arm of its own (a
miss: it dilutes the canary's comparison, it cannot bias it, since the run's first call recorded
the arm that counts). Without a canary nothing is looked up: the version is the promoted one
anyway.

The wait is paid in full by a call whose assistant messages no gateway served (a prompt with
few-shot examples written as assistant turns): nothing can tell it from a parent still on its
way, so keep the margin short. bench/canary_stickiness.py measures both sides.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.store.calls import find_parent_call
from gateway.trajectories.stitching import OpenTrajectory, TrajectoryAssignment

log = logging.getLogger(__name__)

RETRY_S = 0.02  # one indexed lookup a try; the parent is usually stored within tens of ms


async def continue_stored_run(
    engine: AsyncEngine,
    assignment: TrajectoryAssignment,
    *,
    tenant: str,
    margin_s: float,
    open_window_s: float,
) -> TrajectoryAssignment:
    """`assignment` joined to the stored run it continues, or unchanged when none is found in time."""
    parent_key = assignment.keys.parent_key
    if not assignment.stitch_pending or parent_key is None:
        return assignment
    deadline = time.monotonic() + margin_s
    while True:
        try:
            parent = await find_parent_call(engine, tenant, parent_key, open_window_s)
        except Exception:  # the store is down: serve the call, the shipper stitches it later
            log.warning("could not look up the run a call continues", exc_info=True)
            return assignment
        if parent is not None:
            continued = OpenTrajectory(parent.trajectory_id, parent.adapter_version_id)
            return TrajectoryAssignment(parent.trajectory_id, None, assignment.keys, False, continued=continued)
        if time.monotonic() + RETRY_S > deadline:
            return assignment
        await asyncio.sleep(RETRY_S)
