"""Judge one claimed group chunk: build the prompt, call, validate, retry, record.

A bad answer (see answer.py) is retried with the reason told to the judge, up to
`max_attempts` calls; a failed call counts as an attempt too. After the last attempt the
judgement is recorded as 'failed' with the last reason: the group stays without judge
rewards (never judged twice), and the admin API lists it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.settings import JudgeSettings, PolicySettings
from gateway import metrics
from gateway.judging import store
from gateway.judging.answer import RESPONSE_FORMAT, InvalidAnswer, Score, parse_answer
from gateway.judging.client import JudgeCallFailed, JudgeClient
from gateway.judging.transcript import Transcript, conversation, judge_prompt

log = logging.getLogger(__name__)

RETRY_PAUSE_S = 1.0


@dataclass(slots=True)
class Outcome:
    """What judging one chunk came to; `scores` maps trajectory id -> (score, explanation)."""

    claim: store.Claim
    judged: bool
    reason: str | None = None
    attempts: int = 0
    scores: dict[str, tuple[float, str]] = field(default_factory=dict)
    prompt: list[dict[str, str]] = field(default_factory=list)


def build_transcripts(claim: store.Claim, calls: dict[str, list[tuple[Any, Any]]]) -> list[Transcript]:
    return [
        Transcript(f"t{index + 1}", trajectory_id, conversation(calls.get(trajectory_id, [])))
        for index, trajectory_id in enumerate(claim.group.trajectory_ids)
    ]


async def judge_chunk(
    engine: AsyncEngine,
    client: JudgeClient,
    policy: PolicySettings,
    judge: JudgeSettings,
    claim: store.Claim,
    *,
    rubric: str,
    max_comment_chars: int,
    record: bool = True,
) -> Outcome:
    """Judge one claimed chunk; with record=False (a dry run) nothing but the calls is stored."""
    transcripts = build_transcripts(claim, await store.load_calls(engine, claim.group.trajectory_ids))
    by_label = {t.label: t.trajectory_id for t in transcripts}
    messages = judge_prompt(rubric, transcripts)
    outcome = Outcome(claim, judged=False, prompt=list(messages))
    lease_s = judge.timeout_s * 2
    for attempt in range(judge.max_attempts):
        outcome.attempts = attempt + 1
        try:
            reply = await client.complete(messages, RESPONSE_FORMAT, claim.judge_trajectory)
        except JudgeCallFailed as exc:
            outcome.reason = str(exc)
            metrics.JUDGE_CALLS.labels(policy.name, "error").inc()
            if record:
                await store.record_attempt(
                    engine, claim.judgement_id, prompt_tokens=0, completion_tokens=0, lease_s=lease_s
                )
            await asyncio.sleep(RETRY_PAUSE_S * (attempt + 1))
            continue
        metrics.JUDGE_TOKENS.labels(policy.name, "prompt").inc(reply.prompt_tokens)
        metrics.JUDGE_TOKENS.labels(policy.name, "completion").inc(reply.completion_tokens)
        if record:
            await store.record_attempt(
                engine,
                claim.judgement_id,
                prompt_tokens=reply.prompt_tokens,
                completion_tokens=reply.completion_tokens,
                lease_s=lease_s,
            )
        try:
            scores = parse_answer(reply.content, list(by_label))
        except InvalidAnswer as exc:
            metrics.JUDGE_CALLS.labels(policy.name, "invalid").inc()
            outcome.reason = f"invalid answer: {exc}"
            messages = [
                *messages,
                {"role": "assistant", "content": reply.content or ""},
                {"role": "user", "content": f"That answer cannot be used: {exc}. Answer again, JSON only."},
            ]
            continue
        metrics.JUDGE_CALLS.labels(policy.name, "valid").inc()
        outcome.judged, outcome.reason = True, None
        outcome.scores = {by_label[s.label]: (s.score, s.explanation) for s in scores.values()}
        if record:
            await store.record_scores(
                engine,
                claim,
                reward_name=judge.reward_name,
                scores=outcome.scores,
                answer=_answer_record(scores, by_label, outcome.attempts),
                max_comment_chars=max_comment_chars,
            )
        metrics.JUDGE_GROUPS.labels(policy.name, "judged").inc()
        return outcome
    if record:
        await store.finish(
            engine,
            claim.judgement_id,
            status="failed",
            reason=outcome.reason,
            answer={"attempts": outcome.attempts, "labels": by_label},
        )
    metrics.JUDGE_GROUPS.labels(policy.name, "failed").inc()
    log.warning("judge of %s: group %s not judged: %s", policy.name, claim.judgement_id, outcome.reason)
    return outcome


def _answer_record(scores: dict[str, Score], by_label: dict[str, str], attempts: int) -> dict[str, Any]:
    return {
        "attempts": attempts,
        "labels": by_label,
        "scores": [
            {"label": s.label, "trajectory_id": by_label[s.label], "score": s.score, "explanation": s.explanation}
            for s in scores.values()
        ],
    }
