"""Does a series level off? Growth per minute in the first half of a soak against the second.

Each half's growth is the least-squares slope of its samples (one a minute), which one noisy
sample cannot swing the way a difference of end points can. The rule, stated once here and
printed with the results:

- resources (memory, descriptors, journal, latency): **levels off** when what the series would
  gain over the second half at the second half's slope stays within its tolerance
  (max(absolute floor, a share of its level)); otherwise **grows**;
- data (table and index sizes, row counts, adapter files), which a steady rate of traffic makes
  grow linearly by design: **linear** when the second half's slope is at most 1.25 times the
  first half's (plus the tolerance spread over the half), **accelerates** otherwise (bloat,
  dead tuples that vacuum does not reclaim).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

RULE = (
    "Slopes are least-squares fits of each half's per-minute samples. Resources (RSS, descriptors, "
    "journal, added latency) level off when slope(second half) x half length <= tolerance, "
    "tolerance = max(floor, share x median level): RSS 4 MiB / 1%, descriptors 2 / 1%, journal "
    "1 MiB / 10%, latency 0.25 ms / 25%; else they grow. Data (tables, indexes, rows, adapter files) "
    "grow with steady traffic by design: linear when slope(second) <= 1.25 x slope(first) + "
    "tolerance / half length, else it accelerates."
)


@dataclass(frozen=True)
class Kind:
    """How a series is judged: its unit, whether growth is expected, and its tolerance."""

    unit: str
    data: bool
    floor: float
    share: float


BYTES = 1024 * 1024
KINDS = {
    "rss": Kind("MiB", False, 4 * BYTES, 0.01),
    "fds": Kind("fds", False, 2, 0.01),
    "journal": Kind("MiB", False, 1 * BYTES, 0.10),
    "latency": Kind("ms", False, 0.25, 0.25),
    "bytes": Kind("MiB", True, 64 * 1024, 0.01),
    "rows": Kind("rows", True, 10, 0.01),
}


def kind_of(name: str) -> Kind:
    if name.endswith("rss bytes"):
        return KINDS["rss"]
    if name.endswith("open fds"):
        return KINDS["fds"]
    if name.startswith("journal"):
        return KINDS["journal"]
    if name.endswith(" ms"):
        return KINDS["latency"]
    if name.endswith(" rows"):
        return KINDS["rows"]
    return KINDS["bytes"]


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares growth per minute; NaN with fewer than two points or no spread in time."""
    points = [(t, v) for t, v in points if not math.isnan(v)]
    if len(points) < 2 or len({t for t, _ in points}) < 2:
        return math.nan
    return statistics.linear_regression([t for t, _ in points], [v for _, v in points]).slope


@dataclass(frozen=True)
class Trend:
    name: str
    kind: Kind
    first: float  # value at the first sample
    last: float
    first_half: float  # growth per minute
    second_half: float
    verdict: str


def judge(name: str, points: list[tuple[float, float]], minutes: float) -> Trend:
    """`points` are (minute, value); the halves share the middle sample when there is one."""
    kind = kind_of(name)
    middle = minutes / 2
    first = slope([p for p in points if p[0] <= middle])
    second = slope([p for p in points if p[0] >= middle])
    values = [v for _, v in points if not math.isnan(v)]
    level = abs(statistics.median(values)) if values else 0.0
    tolerance = max(kind.floor, kind.share * level)
    half = max(minutes - middle, 1e-9)
    if math.isnan(first) or math.isnan(second):
        verdict = "too few samples"
    elif kind.data:
        verdict = "linear" if second <= 1.25 * max(first, 0.0) + tolerance / half else "accelerates"
    else:
        verdict = "levels off" if second * half <= tolerance else "grows"
    return Trend(
        name,
        kind,
        values[0] if values else math.nan,
        values[-1] if values else math.nan,
        first,
        second,
        verdict,
    )


def scaled(kind: Kind, value: float) -> float:
    """A value in the unit the report shows (bytes as MiB)."""
    return value / BYTES if kind.unit == "MiB" else value
