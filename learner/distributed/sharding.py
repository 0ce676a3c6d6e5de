"""Which rank trains which samples of an optimizer step.

Whole samples (a trajectory with all its segments; for distillation, whole segments) go to one
rank: a sample's tokens share one advantage and one aggregation weight, and keeping them together
keeps each rank's share a set of complete rows. The split is a pure function of the step's
samples and their sizes, so every rank computes every rank's share itself, with no message:
rank r knows which rows rank r' holds, how many micro-batches it will run, and that the shares
cover the step exactly once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def split_step(samples: Sequence[int], sizes: Mapping[int, int], world_size: int) -> list[list[int]]:
    """The step's samples as `world_size` shares balanced by size (tokens through the model).

    Longest first, each to the rank with the least so far (the lowest rank on ties), then each
    share in the step's own order. A rank may get nothing when the step has fewer samples than
    there are ranks; it still takes part in the step's gradient reduction (with a zero loss).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, not {world_size}")
    load = [0] * world_size
    owner: dict[int, int] = {}
    for sample in sorted(samples, key=lambda s: (-sizes[s], s)):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        owner[sample] = rank
        load[rank] += sizes[sample]
    shares: list[list[int]] = [[] for _ in range(world_size)]
    for sample in samples:
        shares[owner[sample]].append(sample)
    return shares
