"""What makes trajectories attempts at the same task: the one definition of a group.

The learner groups trajectories for GRPO by it and the judge (gateway/judging) judges the
same groups, so both import it from here. A group is named by the client when it can (a group
id given at call time or with a reward); otherwise it is the task itself: the messages up to
the first assistant turn and the tools, as the first call sent them. Tenants never share one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

# Message fields that define a task; ids and other bookkeeping that differ between attempts do not.
_TASK_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id")


def _task_message(message: Any) -> Any:
    if not isinstance(message, dict):
        return message
    return {k: message[k] for k in _TASK_FIELDS if message.get(k) is not None}


def task_messages(messages: Sequence[Any]) -> list[Any]:
    """The messages before the first assistant turn: what every attempt at a task shares."""
    out = []
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "assistant":
            break
        out.append(_task_message(message))
    return out


def task_key(messages: Sequence[Any], tools: Any = None) -> str:
    """A stable hash of the task: the messages up to the first assistant turn, and the tools."""
    canonical = json.dumps(
        [task_messages(messages), tools or None], sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.blake2b(canonical.encode(), digest_size=16).hexdigest()


def tenant_group_key(tenant: str, group_id: str | None, task: str) -> str:
    """Group by the client's id when given, else by the task hash; never across tenants."""
    if group_id:
        return f"{tenant}\x00group\x00{group_id}"
    return f"{tenant}\x00task\x00{task}"


def group_name(group_id: str | None, task: str) -> str:
    """A group's printable name within its tenant: "group:<client id>" or "task:<task hash>"."""
    return f"group:{group_id}" if group_id else f"task:{task}"


# The client trajectory ids under which the LLM judge's own calls are recorded
# (gateway/judging): they are never judged and never trained on.
JUDGE_TRAJECTORY_PREFIX = "apprentice-judge:"


# ------------------------------------------------------------------ task families

# How a client names a run's task family: a request header, or a key of the body's `metadata`
# (removed before forwarding, like metadata.group_id).
FAMILY_HEADER = "X-Task-Family"
METADATA_FAMILY = "task_family"

# Roles whose messages set up a task rather than pose one instance of it.
_SETUP_ROLES = ("system", "developer")


def task_family(policy: str | None, messages: Sequence[Any], tools: Any = None, named: str | None = None) -> str:
    """The task family of a run: what its runs share besides the instance they were given.

    The one definition of a family (the learner's cross-prompt baseline, the gateway's recorder
    and the canary's strata all call this):
    - `named:<name>` when the client names it (the X-Task-Family header or metadata.task_family);
    - else `prompt:<hash>` of the system (and developer) messages before the first assistant
      turn and the tools, when there are any: runs of one agent share its instructions and tools
      whatever the user asked;
    - else `policy:<policy>`: with neither, all of a policy's runs are one family.
    A family is a name within a tenant: keys that compare families add the tenant
    (`tenant_family_key`). Prompts of one family need not repeat; that is the point.
    """
    if named:
        return f"named:{named}"
    setup = [m for m in task_messages(messages) if isinstance(m, dict) and m.get("role") in _SETUP_ROLES]
    if setup or tools:
        canonical = json.dumps([setup, tools or None], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return "prompt:" + hashlib.blake2b(canonical.encode(), digest_size=16).hexdigest()
    return f"policy:{policy or ''}"


def tenant_family_key(tenant: str, family: str) -> str:
    """A family across tenants: never shared, like groups."""
    return f"{tenant}\x00family\x00{family}"
