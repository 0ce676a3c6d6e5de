"""Reading a reward request: the body parsed and checked, each reward turned into what the store takes.

Every refusal names the field it is about (`rewards[3].reward` in a batch, `reward` alone), so that a
sender can fix the one item at fault; a batch is refused as a whole.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from gateway.endpoints.rewards.protocol import RewardBatchIn, RewardIn
from gateway.http.errors import GatewayError
from gateway.http.query_text import refuse_nul_in_json
from gateway.rewards.rules import RewardRules
from gateway.store.rewards import Checker, NewReward, SignatureUse
from gateway.trajectories.stitching import trajectory_id_for_client, uuid7

IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_IDEMPOTENCY_HEADER_CHARS = 200


@dataclass(frozen=True, slots=True)
class Sender:
    """Who posts the rewards: an API key, or a webhook secret whose signature is used up by the post."""

    tenant: str
    source: str  # "key" or "webhook:<secret name>"
    api_key_id: uuid.UUID | None
    signature: SignatureUse | None


@dataclass(frozen=True, slots=True)
class Intake:
    """What the rewards of one request share."""

    sender: Sender
    batch: bool
    header_key: str | None  # the Idempotency-Key header
    max_comment_chars: int
    instance_secret: bytes  # derives the gateway id of a client's trajectory id

    def field(self, index: int, name: str) -> str:
        """How an error names a field of the reward at `index`."""
        return f"rewards[{index}].{name}" if self.batch else name


def parse_rewards(body: bytes) -> tuple[list[RewardIn], bool]:
    """The rewards of a body (one reward, or a batch) and whether it was a batch."""
    try:
        data = json.loads(body)  # accepts NaN/Infinity literals so that the field can be named
    except (ValueError, UnicodeDecodeError) as exc:
        raise GatewayError(400, f"the body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise GatewayError(
            400, 'the body must be a JSON object: one reward, or {"rewards": [...]}', code="invalid_json"
        )
    batch = "rewards" in data
    if b"\\u0000" in body:  # JSON's only way to write NUL; PostgreSQL cannot store it in text
        refuse_nul_in_json(data)
    try:
        if batch:
            return RewardBatchIn.model_validate(data).rewards, True
        return [RewardIn.model_validate(data)], False
    except ValidationError as error:
        raise _validation_error(error, batch) from None


def refuse_large_batch(count: int, max_batch: int) -> None:
    if count > max_batch:
        raise GatewayError(
            413,
            f"rewards: {count} rewards in one request; at most {max_batch}",
            param="rewards",
            code="batch_too_large",
        )


def idempotency_header(value: str | None) -> str | None:
    if value is not None and not 0 < len(value) <= MAX_IDEMPOTENCY_HEADER_CHARS:
        raise GatewayError(
            400,
            f"{IDEMPOTENCY_HEADER} must be 1 to {MAX_IDEMPOTENCY_HEADER_CHARS} characters",
            param=IDEMPOTENCY_HEADER,
            code="invalid_value",
        )
    return value


def new_reward(reward: RewardIn, index: int, intake: Intake) -> NewReward:
    """The reward at `index` as the store takes it; refuses what only the gateway's settings forbid."""
    _check_comment(reward, index, intake)
    idempotency_key = _idempotency_key(reward, index, intake)
    kind, target, target_trajectory = _target(reward, index, intake)
    return NewReward(
        id=uuid7(),
        tenant=intake.sender.tenant,
        target_kind=kind,
        target=target,
        target_trajectory_id=target_trajectory,
        target_call=target if kind == "call" else None,
        name=reward.name,
        value=reward.reward,
        metrics=reward.metrics or {},
        comment=reward.comment,
        group_id=reward.group_id,
        idempotency_key=idempotency_key,
        source=intake.sender.source,
        api_key_id=intake.sender.api_key_id,
        observed_at=_unix_seconds(reward.timestamp),
    )


def policy_check(rules: RewardRules, rewards: list[RewardIn], intake: Intake) -> Checker:
    """What the store calls once it knows the policies of the rewards' trajectories: raises (400) on
    the first reward, in request order, that its policy refuses."""

    def check(resolved: list[tuple[int, str | None]]) -> None:
        for index, policy in sorted(resolved):
            reward = rewards[index]
            problem = rules.check(policy, reward.name, reward.reward, reward.metrics or {})
            if problem is not None:
                name = intake.field(index, problem.field)
                code = "reward_out_of_range" if problem.field == "reward" else "unknown_metric"
                raise GatewayError(400, f"{name}: {problem.message}", param=name, code=code)

    return check


def _check_comment(reward: RewardIn, index: int, intake: Intake) -> None:
    if reward.comment is not None and len(reward.comment) > intake.max_comment_chars:
        name = intake.field(index, "comment")
        raise GatewayError(
            400, f"{name}: longer than {intake.max_comment_chars} characters", param=name, code="invalid_value"
        )


def _idempotency_key(reward: RewardIn, index: int, intake: Intake) -> str | None:
    """The reward's own key; else the header's (item i of a batch: `<header>:<i>`)."""
    if intake.header_key is None:
        return reward.idempotency_key
    if reward.idempotency_key is None:
        return f"{intake.header_key}:{index}" if intake.batch else intake.header_key
    if not intake.batch and reward.idempotency_key != intake.header_key:
        raise GatewayError(
            400,
            f"idempotency_key differs from the {IDEMPOTENCY_HEADER} header",
            param="idempotency_key",
            code="invalid_value",
        )
    return reward.idempotency_key


def _target(reward: RewardIn, index: int, intake: Intake) -> tuple[str, str, uuid.UUID | None]:
    """(target kind, the id as sent, the trajectory it names when the request alone tells)."""
    if reward.trajectory_id is not None:
        # The id the X-Trajectory-Id header answered: the gateway's own, or the client's name
        # for its run (echoed back as it was sent); the tenant-keyed derivation resolves both.
        trajectory = trajectory_id_for_client(intake.instance_secret, intake.sender.tenant, reward.trajectory_id)
        return "trajectory", reward.trajectory_id, trajectory
    if reward.client_trajectory_id is not None:
        trajectory = trajectory_id_for_client(intake.instance_secret, intake.sender.tenant, reward.client_trajectory_id)
        return "trajectory", reward.client_trajectory_id, trajectory
    return "call", str(reward.call_id), None


def _unix_seconds(stamp: datetime | None) -> float | None:
    """`stamp` is aware: gateway/http/timestamps.py reads a time without an offset as UTC."""
    return None if stamp is None else stamp.timestamp()


def _validation_error(error: ValidationError, batch: bool) -> GatewayError:
    first = error.errors()[0]
    loc = tuple(first.get("loc", ()))
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    param = _param(loc)
    if "exactly one target" in message:
        param = (param + "." if param else "") + "trajectory_id"
    if not batch and param and param.startswith("rewards"):
        param = None
    return GatewayError(400, f"{param}: {message}" if param else message, param=param, code="invalid_value")


def _param(loc: tuple[Any, ...]) -> str | None:
    """A pydantic error location as the API names fields: `rewards[2].metrics.tests`."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part in ("function-after[_one_target()]",):
            continue
        else:
            text += ("." if text else "") + str(part)
    return text or None
