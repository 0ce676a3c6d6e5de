"""Trajectories -> GRPO groups: which runs were attempts at the same task.

GRPO compares attempts at one task with each other, so grouping decides what "better" means.
A group is named by the client when it can (a group id given at call time or with the
reward); otherwise it is the task itself: the messages up to the first assistant turn and the
tools, as the first call sent them. Tenants never share a group.

Groups are then sorted into what trains and what does not, each counted for the run record:
- `waiting`: some members have no reward yet and the group is recent: late rewards should
  join their group rather than leave it too small later; it trains in a later run.
- `pooled`: fewer rewarded members than `min_group_size` (a prompt that never repeats is a
  group of one), and the group's reward may be compared across prompts (`may_pool`: the
  webhook's, never the judge's relative scores): its members train against their task family's
  baseline (advantages.family_advantages) instead of each other.
- `too_small`: fewer rewarded members than `min_group_size` and not pooled; they stay for a
  later run.
- `greedy`: sampled at temperature 0, or every completion identical: no variety, no signal.
  Reported so that the operator sets the policy's temperature.
- `equal_rewards`: all rewards equal: every advantage is zero, no signal (DAPO's dynamic
  sampling drops them too).
- `usable`: the rest.
Pure Python: no database, no torch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from apprentice.grouping import tenant_family_key, tenant_group_key

GREEDY_TEMPERATURE = 1e-5


@dataclass(frozen=True, slots=True)
class Member:
    """What grouping needs to know about one trajectory."""

    trajectory_id: str
    tenant: str
    reward: float | None  # None: no reward yet
    group_id: str | None = None  # the client's group id, if any
    task_key: str = ""  # task_key() of its first call
    greedy: bool = False  # some call was sampled at temperature 0
    completion_key: str = ""  # a fingerprint of what it answered, to spot identical completions
    last_call_at: float = 0.0  # unix seconds
    family: str = ""  # apprentice.grouping.task_family of its first call
    answers: int = 1  # assistant turns it trains (its answered calls): what a batch counts


@dataclass(slots=True)
class Group:
    key: str
    members: list[Member] = field(default_factory=list)

    @property
    def rewards(self) -> list[float]:
        return [m.reward for m in self.members if m.reward is not None]

    @property
    def rewarded(self) -> list[Member]:
        return [m for m in self.members if m.reward is not None]


@dataclass(slots=True)
class Grouping:
    usable: list[Group] = field(default_factory=list)
    equal_rewards: list[Group] = field(default_factory=list)
    greedy: list[Group] = field(default_factory=list)
    too_small: list[Group] = field(default_factory=list)
    waiting: list[Group] = field(default_factory=list)
    pooled: list[Group] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        names = ("usable", "pooled", "equal_rewards", "greedy", "too_small", "waiting")
        return {name: len(getattr(self, name)) for name in names}

    @property
    def trainable(self) -> bool:
        """Some group may carry a learning signal: within itself (usable) or against its family (pooled)."""
        return bool(self.usable or self.pooled)

    def set_aside(self) -> list[Group]:
        """Groups looked at and found to carry no signal: consumed, never trained."""
        return self.equal_rewards + self.greedy


def completion_key(parts: Iterable[Any]) -> str:
    """A fingerprint of a trajectory's answers (token ids or texts), to spot identical ones."""
    canonical = json.dumps(list(parts), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.blake2b(canonical.encode(), digest_size=16).hexdigest()


def group_key(member: Member) -> str:
    """Group by the client's id when given, else by the task; never across tenants."""
    return tenant_group_key(member.tenant, member.group_id, member.task_key)


def is_greedy(temperature: float | None) -> bool:
    """Temperature 0 means argmax decoding (None means the server default, 1.0)."""
    return temperature is not None and temperature < GREEDY_TEMPERATURE


def group_members(members: Iterable[Member]) -> list[Group]:
    """Members in groups, groups and members in first-seen order (deterministic)."""
    groups: dict[str, Group] = {}
    for member in members:
        key = group_key(member)
        groups.setdefault(key, Group(key)).members.append(member)
    return list(groups.values())


def classify(
    groups: Iterable[Group],
    min_group_size: int,
    now: float,
    reward_wait_s: float,
    may_pool: Callable[[Group], bool] | None = None,
) -> Grouping:
    """Sort groups into usable, pooled and the kinds that do not train (see the module docstring)."""
    out = Grouping()
    for group in groups:
        rewarded = group.rewarded
        unrewarded = len(group.members) - len(rewarded)
        newest = max(m.last_call_at for m in group.members)
        if unrewarded and now - newest < reward_wait_s:
            out.waiting.append(group)
            continue
        if len(rewarded) < min_group_size:
            if rewarded and may_pool is not None and may_pool(group):
                pooled = Group(group.key, rewarded)
                # One member cannot show identical answers; temperature 0 still says "no variety".
                (out.greedy if all(m.greedy for m in rewarded) else out.pooled).append(pooled)
            else:
                out.too_small.append(group)
            continue
        trained = Group(group.key, rewarded)
        if all(m.greedy for m in rewarded) or len({m.completion_key for m in rewarded}) == 1:
            out.greedy.append(trained)
        elif max(trained.rewards) - min(trained.rewards) <= 0.0:
            out.equal_rewards.append(trained)
        else:
            out.usable.append(trained)
    return out


def make_groups(
    members: Iterable[Member],
    min_group_size: int,
    now: float,
    reward_wait_s: float = 0.0,
    may_pool: Callable[[Group], bool] | None = None,
) -> Grouping:
    """Group trajectories and classify the groups: the whole of this module in one call."""
    return classify(group_members(members), min_group_size, now, reward_wait_s, may_pool)


def family_key(member: Member) -> str:
    """The member's task family within its tenant (apprentice.grouping.tenant_family_key)."""
    return tenant_family_key(member.tenant, member.family)
