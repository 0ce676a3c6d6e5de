"""A key's opt-out of training: its calls are recorded (observability) but never trained on.

The flag is `api_keys.training_opt_out`; the shipper reads it as each call lands and makes the
call's trajectory `trainable = false` (gateway/store/calls.py), which the learner's selection
and the judge skip. Opting out also withdraws the key's trajectories that no run has trained
on yet: an opt-out is about the key's data, not only its future calls. Opting back in applies
to new calls only (withdrawn trajectories stay withdrawn: they may mix in opted-out calls).
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

_SET = text(
    """UPDATE api_keys SET training_opt_out = :opt_out
       WHERE (id::text = :key OR key_prefix = :key) AND revoked_at IS NULL
       RETURNING id"""
)

_WITHDRAW = text(
    """UPDATE trajectories t SET trainable = false
       WHERE t.trainable AND t.trained_in_run_id IS NULL
         AND EXISTS (SELECT 1 FROM calls c WHERE c.trajectory_id = t.id AND c.api_key_id = ANY(:ids))"""
)


async def set_training_opt_out(engine: AsyncEngine, key_id_or_prefix: str, opt_out: bool) -> tuple[int, int]:
    """Set the flag on the active key with this id or prefix; returns (keys changed,
    trajectories withdrawn from training)."""
    async with engine.begin() as connection:
        ids = [row.id for row in await connection.execute(_SET, {"opt_out": opt_out, "key": key_id_or_prefix})]
        withdrawn = 0
        if ids and opt_out:
            withdrawn = (await connection.execute(_WITHDRAW, {"ids": ids})).rowcount
    return len(ids), withdrawn
