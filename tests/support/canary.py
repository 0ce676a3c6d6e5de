"""Canary units for the promotion tests: two arms' rewards as the sequential test reads them."""

from __future__ import annotations

from collections.abc import Sequence

from apprentice.promotion.sequential import Unit


def interleaved_units(canary: Sequence[float], incumbent: Sequence[float], *, stratum: str = "task") -> list[Unit]:
    """The two arms' rewards as units of one task, assigned in turn (the canary's first), each
    with the probability of its arm that the arms' sizes imply."""
    share = len(canary) / (len(canary) + len(incumbent)) if canary and incumbent else 0.5
    units: list[Unit] = []
    for index in range(max(len(canary), len(incumbent))):
        if index < len(canary):
            units.append(Unit(True, share, stratum, canary[index]))
        if index < len(incumbent):
            units.append(Unit(False, share, stratum, incumbent[index]))
    return units
