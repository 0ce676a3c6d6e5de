"""A small client for the Apprentice gateway: name agent runs and post their rewards.

    from openai import OpenAI
    import apprentice_client as ac

    client = OpenAI(http_client=ac.http_client())          # tags calls with the current run
    with ac.run(group_id="ticket-4711") as run:            # one agent run = one trajectory
        client.chat.completions.create(...)                 # any number of calls, any framework
    with ac.RewardClient() as rewards:
        rewards.post(ac.Reward.for_run(run, 1.0))           # idempotent, retried on 429/503

Depends on httpx only. See clients/python/README.md.
"""

from apprentice_client.hooks import add_run_headers, async_http_client, http_client, instrument
from apprentice_client.retry import RetryPolicy
from apprentice_client.rewards import (
    AsyncRewardClient,
    Attempt,
    Reward,
    RewardClient,
    RewardError,
    StoredReward,
)
from apprentice_client.runs import GROUP_HEADER, TRAJECTORY_HEADER, Run, current_run, new_trajectory_id, run
from apprentice_client.signing import SIGNATURE_HEADER, signature

__all__ = [
    "GROUP_HEADER",
    "SIGNATURE_HEADER",
    "TRAJECTORY_HEADER",
    "AsyncRewardClient",
    "Attempt",
    "Reward",
    "RewardClient",
    "RewardError",
    "RetryPolicy",
    "Run",
    "StoredReward",
    "add_run_headers",
    "async_http_client",
    "current_run",
    "http_client",
    "instrument",
    "new_trajectory_id",
    "run",
    "signature",
]
