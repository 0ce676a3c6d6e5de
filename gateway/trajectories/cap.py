"""The trajectory length cap: a run that goes on past a number of calls or tokens is cut.

One endless client (an agent loop that never ends, a chat kept open for weeks) would otherwise
grow one trajectory without bound: no learner can train on it (it exceeds every sequence
length) and its reward, if one ever comes, says nothing about any one step. So a trajectory is
closed once it holds `max_calls_per_trajectory` calls or `max_tokens_per_trajectory` tokens,
and the run's next call starts a new one. A trajectory's tokens are its longest call's prompt
and completion: an agent sends its history with every call, so that is the conversation so far,
the sequence a learner must fit. (Summing the calls counted the history again at every turn: a
100-turn agent at 30,000 tokens of context summed to 3 million and was cut long before it
stopped fitting.)


- a run stitched by content continues the new trajectory from then on (its calls register
  their continuation keys under the new id; the adapter version stays the run's);
- a run the client names (X-Trajectory-Id) moves to the next segment of that name, whose id
  is derived from the name and the segment number like the first one's, so every process
  that cuts the same run cuts it to the same ids. X-Trajectory-Id still answers the client's
  name; X-Apprentice-Trajectory-Id answers the segment's id.

Counts are this process's, like the stitch index: without the database on the request path,
a named run spread over N processes gets up to N times the cap per segment, and a run stitched
by content whose calls alternate between processes is never cut (each process opens a new
trajectory per call, which the store merges): docs/limits.md gives the figures.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from dataclasses import dataclass, replace

from gateway.trajectories.stitching import (
    OpenTrajectory,
    TrajectoryAssignment,
    new_trajectory_id,
    trajectory_id_for_client,
)


@dataclass(slots=True)
class Length:
    calls: int = 0
    tokens: int = 0


def segment_name(client_trajectory_id: str, segment: int) -> str:
    """The name whose gateway id is a named run's `segment`-th continuation (0: the run's own id)."""
    return client_trajectory_id if segment == 0 else f"{client_trajectory_id}\x00segment {segment}"


class TrajectoryCap:
    """This process's lengths of the trajectories it serves (bounded LRU) and the current
    segment of each named run it cut."""

    def __init__(self, *, max_calls: int | None, max_tokens: int | None, max_entries: int) -> None:
        self.max_calls = max_calls
        self.max_tokens = max_tokens
        self.max_entries = max_entries
        self._lengths: OrderedDict[uuid.UUID, Length] = OrderedDict()
        self._segments: OrderedDict[uuid.UUID, tuple[int, uuid.UUID]] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.max_calls is not None or self.max_tokens is not None

    def full(self, trajectory_id: uuid.UUID) -> bool:
        length = self._lengths.get(trajectory_id)
        if length is None:
            return False
        return (self.max_calls is not None and length.calls >= self.max_calls) or (
            self.max_tokens is not None and length.tokens >= self.max_tokens
        )

    def admit(self, assignment: TrajectoryAssignment, *, secret: bytes, tenant: str) -> TrajectoryAssignment:
        """The assignment, moved to a new trajectory when its own is full; counts the call."""
        if not self.enabled:
            return assignment
        name = assignment.client_trajectory_id
        if name:
            base = assignment.trajectory_id
            segment, current = self._segments.get(base, (0, base))
            moved = False
            while self.full(current):
                segment += 1
                current = trajectory_id_for_client(secret, tenant, segment_name(name, segment))
                moved = True
            if moved:
                self._remember_segment(base, (segment, current))
            if current != assignment.trajectory_id:
                assignment = replace(assignment, trajectory_id=current)
        elif assignment.continued is not None and self.full(assignment.continued.trajectory_id):
            fresh = new_trajectory_id(secret, tenant)
            # Not stitch-pending: the store must not join it back into the closed trajectory.
            assignment = replace(
                assignment,
                trajectory_id=fresh,
                stitch_pending=False,
                continued=OpenTrajectory(fresh, assignment.continued.adapter_version_id),
            )
        self._length(assignment.trajectory_id).calls += 1
        return assignment

    def add_tokens(self, trajectory_id: uuid.UUID, tokens: int | None) -> None:
        """A finished call's prompt + completion tokens: the trajectory's length if it is its longest."""
        if tokens and self.enabled:
            length = self._length(trajectory_id)
            length.tokens = max(length.tokens, tokens)

    def _length(self, trajectory_id: uuid.UUID) -> Length:
        length = self._lengths.get(trajectory_id)
        if length is None:
            length = self._lengths[trajectory_id] = Length()
            while len(self._lengths) > self.max_entries:
                self._lengths.popitem(last=False)
        else:
            self._lengths.move_to_end(trajectory_id)
        return length

    def _remember_segment(self, base: uuid.UUID, segment: tuple[int, uuid.UUID]) -> None:
        self._segments[base] = segment
        self._segments.move_to_end(base)
        while len(self._segments) > self.max_entries:
            self._segments.popitem(last=False)
