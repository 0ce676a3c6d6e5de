"""The judge's structured answer: the JSON schema asked for, and its validation.

Invariants of an accepted answer (anything else is refused with the reason, and retried):
- a JSON object {"scores": [...]} (a ```json fence or text around the object is tolerated:
  small judges add them even when asked not to);
- every trajectory label of the prompt appears exactly once, and no other label;
- every score is a finite number (not a boolean, not NaN or Infinity) in [0, 1];
- every explanation is a string (an empty one is allowed).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

EXPLANATION_MAX_CHARS = 2000

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "scores": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "trajectory_id": {"type": "string"},
                    "explanation": {"type": "string"},
                    "score": {"type": "number", "minimum": 0, "maximum": 1},
                },
                "required": ["trajectory_id", "explanation", "score"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["scores"],
    "additionalProperties": False,
}

RESPONSE_FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {"name": "group_scores", "strict": True, "schema": SCHEMA},
}

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


class InvalidAnswer(ValueError):
    """The judge's answer cannot be used; the message says why (stored as the reason)."""


@dataclass(frozen=True, slots=True)
class Score:
    label: str
    score: float
    explanation: str


def _refuse_constant(name: str) -> Any:
    raise InvalidAnswer(f"score is {name}, not a finite number")


def _load(text: str) -> Any:
    candidates = [text.strip()]
    fenced = _FENCE.search(text)
    if fenced:
        candidates.append(fenced.group(1).strip())
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            return json.loads(candidate, parse_constant=_refuse_constant)
        except json.JSONDecodeError:
            continue
    raise InvalidAnswer("the answer is not JSON")


def _score(entry: Any, position: int) -> Score:
    if not isinstance(entry, dict):
        raise InvalidAnswer(f"scores[{position}] is not an object")
    label = entry.get("trajectory_id")
    if not isinstance(label, str):
        raise InvalidAnswer(f"scores[{position}].trajectory_id is missing or not a string")
    value = entry.get("score")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidAnswer(f"score of {label} is not a number")
    if not math.isfinite(value):
        raise InvalidAnswer(f"score of {label} is not finite")
    if not 0.0 <= value <= 1.0:
        raise InvalidAnswer(f"score of {label} is {value}, outside [0, 1]")
    explanation = entry.get("explanation", "")
    if not isinstance(explanation, str):
        raise InvalidAnswer(f"explanation of {label} is not a string")
    return Score(label, float(value), explanation.strip()[:EXPLANATION_MAX_CHARS])


def parse_answer(text: str | None, labels: list[str]) -> dict[str, Score]:
    """The scores by label, or InvalidAnswer (see the module docstring for what is accepted)."""
    if not text or not text.strip():
        raise InvalidAnswer("the answer is empty")
    data = _load(text)
    if not isinstance(data, dict) or not isinstance(data.get("scores"), list):
        raise InvalidAnswer('the answer is not an object with a "scores" list')
    scores: dict[str, Score] = {}
    for position, entry in enumerate(data["scores"]):
        score = _score(entry, position)
        if score.label in scores:
            raise InvalidAnswer(f"trajectory {score.label} is scored twice")
        scores[score.label] = score
    extra = sorted(set(scores) - set(labels))
    if extra:
        raise InvalidAnswer(f"unknown trajectory ids: {', '.join(extra)}")
    missing = [label for label in labels if label not in scores]
    if missing:
        raise InvalidAnswer(f"no score for: {', '.join(missing)}")
    return scores
