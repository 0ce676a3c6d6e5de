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
