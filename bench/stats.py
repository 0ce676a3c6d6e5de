"""Summary statistics shared by the benchmarks, so that p50 and p99 mean the same in every table."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float:
    """The q-quantile (q in 0..1), interpolated linearly between the two nearest ranks (numpy's
    default), so that a p99 of a few hundred samples does not jump from one sample to the next;
    NaN when there are no values."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(values: Iterable[float]) -> float:
    """The median of the values that are numbers: a round that measured nothing (NaN) does not count."""
    numbers = [value for value in values if not math.isnan(value)]
    return statistics.median(numbers) if numbers else math.nan
