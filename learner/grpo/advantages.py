"""Group-relative advantages: how much better each attempt did than its siblings.

GRPO replaces a learned value function with the group's mean reward as the baseline. Two
variants, chosen in config (`learning.advantage`):
- "grpo" (DeepSeekMath): (r - mean) / (std + eps). Scale-free across tasks, but it gives
  nearly-solved and nearly-failed groups (small std) the loudest voice.
- "dr_grpo" (Dr. GRPO, Liu et al. 2025): r - mean. Removes that difficulty bias; rewards keep
  their units.
The std is the sample std (n - 1), as TRL computes it. Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

AdvantageKind = Literal["grpo", "dr_grpo"]
STD_EPS = 1e-4


def group_advantages(rewards: Sequence[float], kind: AdvantageKind = "grpo", eps: float = STD_EPS) -> list[float]:
    """Advantages of one group's rewards, in order. Equal rewards give all zeros."""
    n = len(rewards)
    if n == 0:
        return []
    mean = sum(rewards) / n
    centred = [r - mean for r in rewards]
    if kind == "dr_grpo":
        return centred
    if kind != "grpo":
        raise ValueError(f"unknown advantage kind {kind!r}")
    std = math.sqrt(sum(c * c for c in centred) / (n - 1)) if n > 1 else 0.0
    return [c / (std + eps) for c in centred]
