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
spread of the family's recent rewards as GRPO scales by its group's; the formula and its bias in
its docstring). Pure Python.
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


def family_spread(history: Sequence[tuple[str, float]], member: str, reward: float) -> float:
    """The root mean square deviation of the family's recent rewards with `member`'s own in them
    (W_i of `family_advantages`): what GRPO's std is to a group, with the family as the group."""
    window = [value for trajectory, value in history if trajectory != member] + [reward]
    mean = sum(window) / len(window)
    return math.sqrt(sum((value - mean) ** 2 for value in window) / len(window))


def family_advantages(
    rewards: Sequence[float],
    baselines: Sequence[float],
    spreads: Sequence[float],
    kind: AdvantageKind = "grpo",
    eps: float = STD_EPS,
) -> list[float]:
    """Advantages of trajectories that have no siblings to compare with, against their task family.

    For trajectory i with reward r_i, of a family whose other recent rewards are R_-i (the
    leave-one-out set: the family's most recent rewards, its own left out):

        b_i = mean(R_-i)                       RLOO's leave-one-out baseline (Ahmadian et al.,
                                               "Back to Basics", ACL 2024), across prompts
        c_i = r_i - b_i
        W_i = R_-i + [r_i]                     the family's window, the member in it
        s_i = sqrt(mean_{w in W_i} (w - mean(W_i))^2)
                                               the family's spread: GRPO's std with the family
                                               window as the group (Shao et al. 2024)
        A_i = c_i / (s_i + eps)   ("grpo")     A_i = c_i   ("dr_grpo": rewards keep their units)

    Bias, stated: b_i never includes r_i, so it does not depend on trajectory i's answer and
    E[grad log pi(answer) * b_i] = 0: the centring adds no bias, however stale or however
    different the family's other prompts are. What it does not remove is variance from prompt
    difficulty: an easy prompt's answer looks good whatever it does, so the signal is only as
    good as the family is homogeneous (a per-prompt baseline would remove that; there is no
    second answer to take it from). The rewards in R_-i come from older versions too, so as the
    policy improves b_i lags and advantages drift positive (more weight on what the policy
    already does well, never a wrong sign on average). s_i includes r_i, a bias of order
    1/|W_i| in the step size, as GRPO's std has, never in the direction.

    Why the family's spread and not the run's batch (REINFORCE++ normalises over the global
    batch, Hu, arXiv 2501.03262, 2025): a run's batch of pooled members is small and its make-up
    is chance. On a task the policy rarely solves (3% success), a batch of ten failures has
    c_i = -0.03 each and a batch root mean square of 0.03, so every failure got A_i = -1, as
    loud as a success, and most runs were nothing but that: measured on the unique-prompt
    traffic of bench/learning_efficiency, the lineage stayed at 2-5% for 500 answers. Scaled by
    the family's spread (0.17 at 3%), those failures weigh -0.18 and a success +5.7: each
    member's weight depends on its family's history, not on which other members share its run.
    A window of equal rewards has s_i = 0; its members have c_i = 0 (no signal) unless r_i
    differs, and then s_i > 0 since r_i is in W_i.
    """
    if not len(rewards) == len(baselines) == len(spreads):
        raise ValueError("one baseline and one spread per reward")
    centred = [r - b for r, b in zip(rewards, baselines, strict=True)]
    if not centred or kind == "dr_grpo":
        return centred
    if kind != "grpo":
        raise ValueError(f"unknown advantage kind {kind!r}")
    return [c / (s + eps) for c, s in zip(centred, spreads, strict=True)]
