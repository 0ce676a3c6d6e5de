"""The gateway's heap after start-up is frozen out of the garbage collector's full passes.

CPython's cyclic collector runs a full (generation 2) pass every so often under allocation, and a
full pass walks every tracked object in the process, on the event loop's thread: with the
gateway's ~190,000 objects after start-up (FastAPI's routes and models, SQLAlchemy's metadata,
pydantic's validators, the OpenAPI document) one pass took 60-130 ms, and every call and reward
in flight waited for it (measured with gc.callbacks during `bench.reward_ingest`'s mixed phase:
16 chat calls stalled together for 135-175 ms, the phase's p99).

Almost none of those objects ever become garbage: they live as long as the process. `gc.freeze()`
moves everything alive at that moment into a permanent generation that no pass visits (CPython
documents it for servers that fork workers; here it serves for that other effect), so a full pass
walks only what was allocated since: per-call objects and the caches that grew after start-up. Objects frozen here
that do become garbage are freed by reference counting as usual; only a reference cycle among
them would stay, which start-up state does not form in any measurable amount.
"""

from __future__ import annotations

import gc
import logging

from gateway.metrics import GC_FROZEN_OBJECTS

log = logging.getLogger(__name__)


def freeze_startup_heap() -> int:
    """Collect once, then freeze every surviving object; returns how many are frozen."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    GC_FROZEN_OBJECTS.set(frozen)
    log.debug("froze %d objects of the start-up heap out of the collector's passes", frozen)
    return frozen
