"""Trajectory ids carry a tag that binds them to their tenant (no database needed to check it)."""

from __future__ import annotations

import uuid

from gateway.trajectories.stitching import issued_to, new_trajectory_id, trajectory_id_for_client

SECRET = b"s" * 32


def test_issued_ids_are_v7_time_ordered_and_verify_only_for_their_tenant():
    ids = [new_trajectory_id(SECRET, "acme") for _ in range(200)]
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert len(set(ids)) == 200
    assert all(issued_to(SECRET, "acme", i) for i in ids)
    assert not any(issued_to(SECRET, "globex", i) for i in ids)
    assert not any(issued_to(b"other-installation", "acme", i) for i in ids)
    assert not issued_to(SECRET, "acme", uuid.uuid4())


def test_client_names_map_per_tenant_and_echoes_round_trip():
    named = trajectory_id_for_client(SECRET, "acme", "run-42")
    assert named.version == 8 and issued_to(SECRET, "acme", named)
    assert trajectory_id_for_client(SECRET, "acme", "run-42") == named
    assert trajectory_id_for_client(SECRET, "globex", "run-42") != named
    assert trajectory_id_for_client(SECRET, "acme", str(named)) == named, "an echoed v8 id is kept"
    issued = new_trajectory_id(SECRET, "acme")
    assert trajectory_id_for_client(SECRET, "acme", str(issued)) == issued
    foreign = trajectory_id_for_client(SECRET, "globex", str(issued))
    assert foreign != issued and issued_to(SECRET, "globex", foreign)
