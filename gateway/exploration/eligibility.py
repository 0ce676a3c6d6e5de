"""Which served calls may be explored: one rule, read by the chat handler on the request path.

Never explored (docs/exploration.md):
- a call at temperature 0 (the client's or the policy's): greedy answers are one answer, and a
  client that asks for 0 wants determinism, not variety;
- a call with a client `seed`: the client pinned its sample;
- a call whose key opted out of training, or a policy with record_for_training off: their
  trajectories never train, so their extra answers would be spent for nothing;
- the LLM judge's own calls, and calls a teacher answered (not the policy's samples);
- a streamed call when `exploration.streamed` is off (by default streamed calls are explored
  after their stream has ended: the extra answers are never streamed, so no client waits).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from apprentice.settings import PolicySettings
from gateway.upstreams.routing import UpstreamTarget


@dataclass(frozen=True, slots=True)
class ServedCall:
    """What exploration needs of a call whose answer the client already has."""

    call_id: uuid.UUID
    policy: PolicySettings
    tenant: str
    api_key_id: uuid.UUID | None
    key_opted_out: bool
    judging: bool
    teacher: bool  # a teacher answered it (or would have): not the policy's own sample
    stream: bool
    model: str  # the name the client called (the policy's)
    group_id: str | None
    body: dict[str, Any]  # the client's request body, as recorded for the served call
    target: UpstreamTarget  # the endpoint that answered it (its prompt is in that cache now)
    temperature: float | None  # what the served answer was sampled at (the policy's, else the client's)


def skip_reason(call: ServedCall) -> str | None:
    """Why the call is not explored, or None when it may be (its share and budget aside)."""
    settings = call.policy.learning.exploration
    if call.teacher:
        return "teacher"
    if call.judging:
        return "judge"
    if not call.policy.record_for_training or call.key_opted_out:
        return "not_trained"
    if call.temperature == 0 or call.body.get("temperature") == 0:
        return "temperature_0"
    if call.body.get("seed") is not None:
        return "seed"
    if call.stream and not settings.streamed:
        return "streamed"
    return None
