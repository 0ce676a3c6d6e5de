"""The canary split is uniform over the run ids the gateway really issues and clients echo back."""

from __future__ import annotations

from gateway.policies.versions import bucket
from gateway.trajectories.stitching import new_trajectory_id, request_keys, trajectory_id_for_client

SECRET = b"k" * 32


def share_below(keys: list[bytes], share: float) -> float:
    return sum(bucket(key) < share for key in keys) / len(keys)


def test_echoed_gateway_ids_split_at_the_configured_share():
    echoed = [new_trajectory_id(SECRET, "acme").bytes for _ in range(4000)]
    for share in (0.1, 0.5):
        assert abs(share_below(echoed, share) - share) < 0.03


def test_client_names_and_message_roots_split_at_the_configured_share():
    named = [trajectory_id_for_client(SECRET, "acme", f"run-{i}").bytes for i in range(4000)]
    roots = [request_keys("acme", "m", [{"role": "user", "content": f"task {i}"}]).root_key for i in range(4000)]
    for keys in (named, roots):
        assert abs(share_below(keys, 0.2) - 0.2) < 0.03


def test_the_same_key_always_lands_in_the_same_arm():
    key = new_trajectory_id(SECRET, "acme").bytes
    assert len({bucket(key) for _ in range(10)}) == 1
