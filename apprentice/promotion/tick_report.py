"""What one pass of the promotion job did and what failed, as the tick and the reconciler add to it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["TickReport"]


@dataclass
class TickReport:
    actions: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # Actions recorded but logged at DEBUG: the lineage pass (every 5 s) says "still evaluating"
    # or "skipped" every few seconds, which would bury the transitions in the log.
    quiet: frozenset[str] = frozenset()

    def add(self, policy: str, version: str | None, action: str, detail: str = "", *, quiet: bool = False) -> None:
        self.actions.append({"policy": policy, "version": version, "action": action, "detail": detail})
        level = logging.DEBUG if quiet or action in self.quiet else logging.INFO
        log.log(level, "promotion: %s %s %s %s", policy, version or "-", action, detail)
