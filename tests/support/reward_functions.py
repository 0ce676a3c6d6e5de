"""Reward functions given as Python entry points in the reward-function tests (module:function)."""

from __future__ import annotations

from typing import Any


def answer_words(payload: dict[str, Any]) -> float:
    """A verifiable score: the answer's words, a tenth each, at most 1."""
    return min(len(str(payload["answer"].get("content") or "").split()) / 10.0, 1.0)


def broken(payload: dict[str, Any]) -> float:
    raise RuntimeError("this scorer always fails")
