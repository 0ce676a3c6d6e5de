"""The gateway's start-up heap is frozen out of the garbage collector's full passes (gateway/heap.py).

A full pass walks every tracked object on the event loop's thread; unfrozen, the ~190,000 objects
a started gateway holds made each pass 60-130 ms, a stall of every call and reward in flight
(bench.reward_ingest's mixed phase). Seen from outside, in every worker process: /metrics reports
how many objects the collector skips, the least over the live processes (0 while one has not frozen yet).
"""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import wait_for
from tests.test_operations import metric

# A gateway's start-up heap is well above this (about 190,000 objects in one process); a process
# that froze nothing, or froze before the app was built, reports far less.
AT_LEAST_FROZEN = 50_000


@pytest.mark.parametrize("workers", [1, 2])
def test_every_gateway_process_freezes_its_start_up_heap(start_gateway, workers):
    gateway = start_gateway(workers=workers)

    def frozen() -> float:
        return metric(httpx.get(gateway.url + "/metrics").text, "apprentice_gc_frozen_objects")

    # /healthz answers once one process is up; a second one still starting has frozen nothing yet
    # (the least over the live processes is 0 until it has).
    wait_for(lambda: frozen() >= AT_LEAST_FROZEN, timeout=60, message="every process's start-up heap frozen")
