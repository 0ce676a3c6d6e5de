"""How `make test` shares the suite between its pytest-xdist workers (`-n 2 --dist loadscope`).

Much of a test's time is spent waiting on the processes it started (gateways, the fake upstream,
a training run), so two workers share a two-core machine well. Two rules:

- A module stays on one worker, so its module-scoped gateways and databases start once.
- Every module that uses the session's SmolLM2 server (`smollm2_server` in tests/conftest.py)
  runs on the same worker: one server serves them all, and two trainings on the real model never
  fight for the two cores. That group is the suite's longest, so the modules are put first in
  the collection (tests/conftest.py) and the worker that takes it starts at once while the other
  takes the rest.

xdist's own `--dist loadgroup` would read an `xdist_group` mark, but it writes the group into the
test's node id, which pytest 9 no longer reads from (`Node.nodeid` is built from `_id`): the
marks were ignored and the server's modules split across both workers. So the scheduler is
xdist's `loadscope` with the scope worked out here, from the node id the controller sees.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

# The fixtures that mean "this test uses the session's SmolLM2 server".
SERVER_FIXTURES = frozenset({"smollm2_server", "model_server"})
# The modules that use it: the controller sees only node ids, so they are listed, and every
# collection checks the list against the fixtures (`check_server_modules`).
SERVER_MODULES = frozenset(
    {
        "tests/learner/test_distillation.py",
        "tests/learner/test_judge_learning.py",
        "tests/learner/test_learning.py",
        "tests/learner/test_protocols_local_model.py",
        "tests/learner/test_responses_learning.py",
        "tests/test_dashboard_browser.py",
    }
)
SERVER_SCOPE = "smollm2-server"


def _module(item: pytest.Item, root: Path) -> str:
    return item.path.relative_to(root).as_posix()


def on_the_server(item: pytest.Item, root: Path) -> bool:
    return _module(item, root) in SERVER_MODULES


def check_server_modules(items: list[pytest.Item], root: Path) -> None:
    """Refuse a collection where a module uses the server and is not in SERVER_MODULES: under
    xdist it would start a second server on the other worker, beside the first's trainings."""
    missing = sorted(
        {_module(item, root) for item in items if SERVER_FIXTURES & set(item.fixturenames)} - SERVER_MODULES
    )
    if missing:
        raise pytest.UsageError(f"add {', '.join(missing)} to SERVER_MODULES in tests/support/scheduling.py")


def module_scheduling(config: pytest.Config, log: Any) -> Any:
    """xdist's loadscope scheduling with this suite's scopes, or None (xdist's own) for any other
    `--dist`."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return SERVER_SCOPE if module in SERVER_MODULES else module

    return ModuleScheduling(config, log)
