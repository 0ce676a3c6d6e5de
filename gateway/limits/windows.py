"""Sliding-window counting (two fixed windows, the previous one weighted by how much of it
still overlaps the last `window_s` seconds), as Cloudflare and most gateways do: no burst of
twice the limit at a window boundary, and two integers per window to exchange between processes.
"""

from __future__ import annotations

import math


def window_index(now: float, window_s: float) -> int:
    return int(now // window_s)


def estimate(previous: float, current: float, now: float, window_s: float) -> float:
    """The count over the last `window_s` seconds: all of the current window, and the share of
    the previous one that the sliding window still covers."""
    elapsed = (now % window_s) / window_s
    return previous * (1.0 - elapsed) + current


def seconds_until_fits(
    previous: float, current: float, cost: float, limit: float, now: float, window_s: float
) -> float:
    """How long until `cost` more fits under `limit`, if nothing else arrives meanwhile.

    Within the current window the previous window's share decays linearly; if the current
    window alone is too full, the wait runs into the next window, where the current count
    becomes the decaying one. A cost over the limit never fits: one whole window is returned.
    """
    if cost > limit:
        return window_s
    elapsed = (now % window_s) / window_s
    left = window_s * (1.0 - elapsed)
    if current + cost <= limit:
        if previous <= 0:
            return 0.0
        needed = 1.0 - (limit - current - cost) / previous  # the elapsed share at which it fits
        return max(0.0, (needed - elapsed) * window_s)
    if current <= 0:
        return left
    needed = 1.0 - (limit - cost) / current
    return left + max(0.0, needed) * window_s


def seconds_until_empty(previous: float, current: float, now: float, window_s: float) -> float:
    """How long until the sliding window holds nothing (OpenAI's `x-ratelimit-reset-*`)."""
    left = window_s - now % window_s
    if current > 0:
        return left + window_s
    return left if previous > 0 else 0.0


def duration_text(seconds: float) -> str:
    """OpenAI's duration format in `x-ratelimit-reset-*`: `20ms`, `1s`, `6m0s`, `1h2m3s`."""
    if seconds < 1.0:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    whole = math.ceil(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"
