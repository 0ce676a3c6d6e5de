"""The run context: which agent run (trajectory) and task group the calls made inside it belong to.

The gateway groups calls into a trajectory by the `X-Trajectory-Id` request header and into a
task group by `X-Group-Id` (gateway/endpoints/chat_completions/request.py reads both, and the
Responses and Messages endpoints the same). Agent frameworks hide the HTTP requests they send,
so the run is held in a context variable instead of being passed to each call: every request a
hooked HTTP client sends while the run is current carries its headers (see `hooks.py`).

Why a `ContextVar`: each asyncio task and each `contextvars.copy_context()` sees its own value,
so concurrent runs sharing one SDK client never get each other's ids.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

TRAJECTORY_HEADER = "X-Trajectory-Id"
GROUP_HEADER = "X-Group-Id"
# The gateway refuses longer names (400): refused here first, where the mistake is made.
MAX_NAME_CHARS = 256

_current: ContextVar[Run | None] = ContextVar("apprentice_run", default=None)


def _checked_name(value: str, what: str) -> str:
    text = value.strip()
    if not text:
        raise ValueError(f"{what} must be a non-empty string")
    if len(text) > MAX_NAME_CHARS:
        raise ValueError(f"{what} is longer than {MAX_NAME_CHARS} characters")
    if not text.isascii() or any(ch in text for ch in "\r\n\0"):
        raise ValueError(f"{what} must be printable ASCII (it travels as an HTTP header)")
    return text


@dataclass(frozen=True)
class Run:
    """One agent run: its trajectory id (the client's own name for it) and its task group."""

    trajectory_id: str
    group_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "trajectory_id", _checked_name(self.trajectory_id, "trajectory_id"))
        if self.group_id is not None:
            object.__setattr__(self, "group_id", _checked_name(self.group_id, "group_id"))

    def headers(self) -> dict[str, str]:
        """The request headers that put a call into this run (and its group)."""
        headers = {TRAJECTORY_HEADER: self.trajectory_id}
        if self.group_id is not None:
            headers[GROUP_HEADER] = self.group_id
        return headers


def new_trajectory_id(prefix: str = "run") -> str:
    """A fresh, unique trajectory id: `<prefix>-<32 hex digits>`."""
    return f"{prefix}-{uuid.uuid4().hex}"


@contextmanager
def run(trajectory_id: str | None = None, *, group_id: str | None = None) -> Iterator[Run]:
    """Make `Run(trajectory_id, group_id)` current for the block (a fresh id when none is given).

    Works in plain and in async code (`with run(...)` inside a coroutine applies to that task
    only). Runs nest: the innermost one is current, and the outer one is current again after it.
    """
    current = Run(trajectory_id or new_trajectory_id(), group_id)
    token = _current.set(current)
    try:
        yield current
    finally:
        _current.reset(token)


def current_run() -> Run | None:
    """The run current in this context, or None outside every `run(...)` block."""
    return _current.get()
