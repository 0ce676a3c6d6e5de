"""Group-relative advantages: how much better each attempt did than its siblings.

GRPO replaces a learned value function with the group's mean reward as the baseline. Two
variants, chosen in config (`learning.advantage`):
- "grpo" (DeepSeekMath): (r - mean) / (std + eps). Scale-free across tasks, but it gives
  nearly-solved and nearly-failed groups (small std) the loudest voice.
- "dr_grpo" (Dr. GRPO, Liu et al. 2025): r - mean. Removes that difficulty bias; rewards keep
  their units.
The std is the sample std (n - 1), as TRL computes it. A trajectory with no siblings to compare
with (a prompt that never repeats) is measured against its task family instead:
`family_advantages` (RLOO's leave-one-out baseline across the family's prompts, scaled by the
family's reward spread; its formula and bias in its docstring). Pure Python.
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


def leave_one_out_baseline(history: Sequence[tuple[str, float]], exclude: str, min_others: int) -> float | None:
    """The mean of a family's recent rewards other than trajectory `exclude`'s (RLOO's baseline,
    taken across the family's prompts); None when fewer than `min_others` others exist."""
    others = [reward for trajectory, reward in history if trajectory != exclude]
    if len(others) < max(min_others, 1):
        return None
    return sum(others) / len(others)


def family_variance(history: Sequence[tuple[str, float]]) -> float:
    """The variance of a family's recent rewards (population variance; 0 for none): the spread the
    family's advantages are scaled by (`family_advantages`)."""
    if not history:
        return 0.0
    mean = sum(reward for _, reward in history) / len(history)
    return sum((reward - mean) ** 2 for _, reward in history) / len(history)


def family_advantages(
    rewards: Sequence[float],
    baselines: Sequence[float],
    variances: Sequence[float],
    kind: AdvantageKind = "grpo",
    eps: float = STD_EPS,
) -> list[float]:
    """Advantages of trajectories that have no siblings to compare with, against their task family.

    For trajectory i with reward r_i, of a family whose other recent rewards are R_-i (the
    leave-one-out set: the family's most recent rewards, its own left out), over the batch B of
    such trajectories in one run:

        b_i = mean(R_-i)                       RLOO's leave-one-out baseline (Ahmadian et al.,
                                               "Back to Basics", ACL 2024), across prompts
        c_i = r_i - b_i
        v_i = var(R_i)                         the variance of i's family's recent rewards R_i
                                               (its own among them; `family_variance`)
        s   = sqrt(mean_{j in B} v_j)          the batch's reward scale, from its families
        A_i = c_i / (s + eps)   ("grpo")       A_i = c_i   ("dr_grpo": rewards keep their units)

    Bias, stated: b_i never includes r_i, so it does not depend on trajectory i's answer and
    E[grad log pi(answer) * b_i] = 0: the centring adds no bias, however stale or however
    different the family's other prompts are. What it does not remove is variance from prompt
    difficulty: an easy prompt's answer looks good whatever it does, so the signal is only as
    good as the family is homogeneous (a per-prompt baseline would remove that; there is no
    second answer to take it from). The rewards in R_-i come from older versions too, so as the
    policy improves b_i lags and advantages drift positive (more weight on what the policy
    already does well, never a wrong sign on average). The scale s includes c_i itself, a
    bias of order 1/|B| in the step size (as GRPO's std and REINFORCE++'s normalisation have),
    never in the direction. Unlike REINFORCE++ the batch mean is not subtracted again: the
    family baseline is the centring, and subtracting the batch's own mean would make the batch
    one GRPO group of unrelated prompts.

    Why the scale is the families' spread and not the batch's: REINFORCE++ normalises by the
    batch's own spread (here it was sqrt(mean c_j^2)), which is right when the batch varies. On a
    rare-success task it often does not: at a 2% success rate half the batches of 32 hold no
    success, every c_j is -b (about -0.02), and dividing by their own root mean square made every
    answer's advantage -1, a full-size push away from everything the policy said, in half the
    runs (live, lowercase on prompts that never repeat: the lineage did not learn in four of five
    runs). Scaled by the family's spread (sqrt(0.02 x 0.98) = 0.14), the same batch gets -0.14
    each, and a success +7: GRPO's magnitudes for a group of such rewards. s includes r_i's own
    reward among the family's (a bias of order 1 / |R| in the step size, never in the direction);
    s = 0 only where every reward of the family is the same, and then every c_i is 0 too.
    """
    if not len(rewards) == len(baselines) == len(variances):
        raise ValueError("one baseline and one family variance per reward")
    centred = [r - b for r, b in zip(rewards, baselines, strict=True)]
    if not centred or kind == "dr_grpo":
        return centred
    if kind != "grpo":
        raise ValueError(f"unknown advantage kind {kind!r}")
    scale = math.sqrt(sum(variances) / len(variances))
    return [c / (scale + eps) for c in centred]
