"""How one evaluation item's answer is scored: an expected answer, the judge, or a reward function.

A scoring is a JSON document stored with the set (the default of its items) or an item:

    {"method": "expected", "expected": "Paris", "match": "exact" | "contains" | "regex",
     "case_sensitive": false}
        1.0 when the answer matches, else 0.0. `exact` compares after trimming surrounding
        whitespace; `contains` looks for the text anywhere; `regex` is Python's `re.search`.
    {"method": "judge", "rubric": "...", "reference": "..."}
        the policy's judge model (policies[].judge: model, base_url, api_key), called through
        the gateway like the group judge, answers {"score": 0..1, "explanation": "..."} for this
        one answer; `reference` (optional) is a known good answer shown to the judge.
    {"method": "reward_function", "name": "..."}
        the operator's endpoint named in policies[].evaluation.reward_functions: POSTed
        {"policy", "set", "item_id", "version", "messages", "answer"}, signed with the
        Apprentice-Signature scheme of reward webhooks (apprentice/webhook_signing.py), it
        answers {"score": number} within its timeout.

A scoring that cannot produce a score (the judge or the function failed, timed out, answered
something else) raises ScoringFailed: the item has no score in that run, and the gate refuses
to compare on a run with missing scores rather than guess.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from apprentice.settings import PolicySettings, Settings, gateway_base_url, resolve_secret
from apprentice.webhook_signing import SIGNATURE_HEADER, sign

__all__ = [
    "PYTHON_REGEX_FORMAT",
    "ExpectedAnswer",
    "JudgeScoring",
    "RewardFunction",
    "Score",
    "Scorer",
    "Scoring",
    "ScoringFailed",
    "parse_scoring",
]


# The JSON Schema `format` of a pattern Python's `re` compiles. JSON Schema's own `regex` format is
# ECMA-262's dialect, which differs both ways (`(?P<n>x)`, `a{` and `]` are Python's only; `[^]`
# and `\p{L}` ECMA-262's only), so a document saying `regex` would misstate which patterns a 400
# refuses; tools that do not know this format read the field as a plain string.
PYTHON_REGEX_FORMAT = "python-regex"
_REGEX_WHEN_MATCHED: dict[str, Any] = {
    "if": {"properties": {"match": {"const": "regex"}}, "required": ["match"]},
    "then": {"properties": {"expected": {"format": PYTHON_REGEX_FORMAT}}},
}


class ExpectedAnswer(BaseModel):
    """The answer is compared with `expected`. With `match: regex`, `expected` is a Python regular
    expression (`re.search`), and one that does not compile is refused (400)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_REGEX_WHEN_MATCHED)

    method: Literal["expected"]
    expected: str = Field(min_length=1)
    match: Literal["exact", "contains", "regex"] = "exact"
    case_sensitive: bool = False

    @model_validator(mode="after")
    def _compiles(self) -> ExpectedAnswer:
        if self.match == "regex":
            try:
                self.pattern()
            except re.error as exc:
                raise ValueError(f"expected: not a regular expression: {exc}") from None
        return self

    def pattern(self) -> re.Pattern[str]:
        flags = 0 if self.case_sensitive else re.IGNORECASE
        return re.compile(self.expected, flags)


class JudgeScoring(BaseModel):
    model_config = ConfigDict(extra="forbid")

    method: Literal["judge"]
    rubric: str | None = None
    reference: str | None = None


class RewardFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    method: Literal["reward_function"]
    name: str = Field(min_length=1)


Scoring = Annotated[ExpectedAnswer | JudgeScoring | RewardFunction, Field(discriminator="method")]
_SCORING: TypeAdapter[ExpectedAnswer | JudgeScoring | RewardFunction] = TypeAdapter(Scoring)


def parse_scoring(document: dict[str, Any]) -> ExpectedAnswer | JudgeScoring | RewardFunction:
    """A stored or submitted scoring document, validated (pydantic's ValidationError when not)."""
    return _SCORING.validate_python(document)


class ScoringFailed(RuntimeError):
    """No score for this answer: the judge or the reward function failed; the message says why."""


@dataclass(frozen=True)
class Score:
    value: float
    detail: str


DEFAULT_RUBRIC = (
    "Judge how well the assistant's final answer serves the user's last request in the "
    "conversation: correct, complete, and following the instructions given. Give 1 for an "
    "answer that fully does, 0 for one that does not at all."
)
JUDGE_FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer_score",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {
                "explanation": {"type": "string"},
                "score": {"type": "number", "minimum": 0, "maximum": 1},
            },
            "required": ["explanation", "score"],
            "additionalProperties": False,
        },
    },
}
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def score_expected(scoring: ExpectedAnswer, answer: str) -> Score:
    if scoring.match == "regex":
        found = scoring.pattern().search(answer) is not None
    else:
        text, expected = (
            (answer, scoring.expected) if scoring.case_sensitive else (answer.lower(), scoring.expected.lower())
        )
        found = text.strip() == expected.strip() if scoring.match == "exact" else expected in text
    return Score(1.0 if found else 0.0, f"{scoring.match} match {'found' if found else 'not found'}")


def judge_messages(
    messages: list[dict[str, Any]], answer: str, scoring: JudgeScoring, rubric: str
) -> list[dict[str, str]]:
    """The judge's prompt for one answer: the rubric, the conversation, the answer, a reference."""
    conversation = json.dumps(messages, ensure_ascii=False, indent=1)
    parts = [f"Conversation (JSON messages):\n{conversation}", f"Assistant's answer:\n{answer}"]
    if scoring.reference:
        parts.append(f"A known good answer, for reference:\n{scoring.reference}")
    system = (
        f"{rubric}\n\nAnswer only with a JSON object "
        '{"explanation": "<one or two sentences>", "score": <number from 0 to 1>}.'
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]


def parse_judge_answer(content: str | None) -> Score:
    """The judge's {"explanation", "score"}; ScoringFailed when it is not that."""
    text = (content or "").strip()
    if (fence := _FENCE.search(text)) is not None:
        text = fence.group(1).strip()
    start, end = text.find("{"), text.rfind("}")
    try:
        document = json.loads(text[start : end + 1]) if start >= 0 else None
    except ValueError:
        document = None
    if not isinstance(document, dict):
        raise ScoringFailed(f"the judge answered no JSON object: {text[:200]!r}")
    score = document.get("score")
    if (
        isinstance(score, bool)
        or not isinstance(score, (int, float))
        or not math.isfinite(score)
        or not 0 <= score <= 1
    ):
        raise ScoringFailed(f"the judge's score is not a number in [0, 1]: {score!r}")
    return Score(float(score), str(document.get("explanation") or "")[:2000])


class Scorer:
    """Scores answers of one policy's items; holds the HTTP client the judge and functions use."""

    def __init__(self, settings: Settings, policy: PolicySettings, client: httpx.AsyncClient) -> None:
        self.settings = settings
        self.policy = policy
        self.client = client

    async def score(
        self,
        scoring: ExpectedAnswer | JudgeScoring | RewardFunction,
        messages: list[dict[str, Any]],
        answer: str,
        *,
        context: dict[str, Any],
    ) -> Score:
        if isinstance(scoring, ExpectedAnswer):
            return score_expected(scoring, answer)
        if isinstance(scoring, JudgeScoring):
            return await self._judge(scoring, messages, answer, context)
        return await self._reward_function(scoring, messages, answer, context)

    async def _judge(
        self, scoring: JudgeScoring, messages: list[dict[str, Any]], answer: str, context: dict[str, Any]
    ) -> Score:
        judge = self.policy.judge
        if judge is None:
            raise ScoringFailed(f"policy {self.policy.name!r} has no judge configured (policies[].judge)")
        rubric = scoring.rubric or (judge.rubric.strip() if judge.rubric and judge.rubric.strip() else DEFAULT_RUBRIC)
        body: dict[str, Any] = {
            "model": judge.model,
            "messages": judge_messages(messages, answer, scoring, rubric),
            "response_format": JUDGE_FORMAT,
            "temperature": judge.temperature,
        }
        if judge.max_tokens is not None:
            body["max_tokens"] = judge.max_tokens
        key = resolve_secret(judge.api_key)
        headers = {"X-Trajectory-Id": f"apprentice-eval:{context['run_id']}:{context['item_id']}"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        url = gateway_base_url(self.settings, judge) + "/chat/completions"
        try:
            response = await self.client.post(url, json=body, headers=headers, timeout=judge.timeout_s)
        except httpx.HTTPError as exc:
            raise ScoringFailed(f"judge call failed: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise ScoringFailed(f"judge call answered HTTP {response.status_code}: {response.text[:300]}")
        try:
            content = response.json()["choices"][0]["message"].get("content")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ScoringFailed(f"the judge's answer is not a chat completion: {exc}") from exc
        return parse_judge_answer(content)

    async def _reward_function(
        self, scoring: RewardFunction, messages: list[dict[str, Any]], answer: str, context: dict[str, Any]
    ) -> Score:
        function = self.policy.evaluation.reward_functions.get(scoring.name)
        if function is None:
            raise ScoringFailed(
                f"no reward function {scoring.name!r} in policies[{self.policy.name}].evaluation.reward_functions"
            )
        document = {
            "policy": self.policy.name,
            "set": context["set"],
            "item_id": str(context["item_id"]),
            "version": context["version"],
            "messages": messages,
            "answer": answer,
        }
        body = json.dumps(document, ensure_ascii=False).encode()
        headers = {"Content-Type": "application/json"}
        if function.secret is not None:
            secret = next((s for s in self.settings.rewards.webhook_secrets if s.name == function.secret), None)
            value = resolve_secret(secret.secret) if secret is not None else None
            if not value:
                raise ScoringFailed(f"reward function {scoring.name!r}: no webhook secret named {function.secret!r}")
            headers[SIGNATURE_HEADER] = sign(value, body)
        try:
            response = await self.client.post(function.url, content=body, headers=headers, timeout=function.timeout_s)
        except httpx.TimeoutException as exc:
            raise ScoringFailed(
                f"reward function {scoring.name!r} did not answer within {function.timeout_s:g}s"
            ) from exc
        except httpx.HTTPError as exc:
            raise ScoringFailed(f"reward function {scoring.name!r} failed: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise ScoringFailed(
                f"reward function {scoring.name!r} answered HTTP {response.status_code}: {response.text[:300]}"
            )
        try:
            value_out = response.json().get("score")
        except (ValueError, AttributeError) as exc:
            raise ScoringFailed(f"reward function {scoring.name!r} answered no JSON object: {exc}") from exc
        if isinstance(value_out, bool) or not isinstance(value_out, (int, float)) or not math.isfinite(value_out):
            raise ScoringFailed(
                f"reward function {scoring.name!r} answered a score that is not a number: {value_out!r}"
            )
        return Score(float(value_out), f"reward function {scoring.name}")
