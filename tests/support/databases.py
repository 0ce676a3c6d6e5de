"""Fresh test databases made ahead and dropped behind, off the tests' critical path.

Each test that asks for `database_url` gets a database of its own, cloned from the migrated
template; that stays. What changes is when the clone and the drop happen: a worker thread keeps
two clones ready before the next test asks (with one, a clone slowed by a concurrent drop was
often not ready in time), and another drops a test's database after the test has
returned, while the next test runs. Measured on the 2-core CI machine under load (load average
13, PostgreSQL 15): CREATE DATABASE ... TEMPLATE took 0.3-0.5 s and DROP DATABASE ... WITH
(FORCE) 0.8-6 s (the drop waits for the checkpointer), both paid inside every such test before.

DROP ... WITH (FORCE) ends whatever still holds the database (a process a test left behind), as
the synchronous drop did. At the end of the session `close` waits for every drop.
"""

from __future__ import annotations

import threading
import uuid
from collections import deque

import psycopg


class DatabasePool:
    """Two worker threads: one keeps `ahead` clones ready, the other drops what the tests gave back
    (a slow drop never holds up the next clone)."""

    def __init__(self, admin_url: str, template: str, ahead: int = 2) -> None:
        self.admin_url, self.template, self.ahead = admin_url, template, ahead
        self._ready: deque[str] = deque()
        self._drops: deque[str] = deque()
        self._wanted = 0  # takers waiting now
        self._closing = False
        self._failure: BaseException | None = None
        self._cond = threading.Condition()
        self._threads = [
            threading.Thread(target=self._create, name="test-database-clones", daemon=True),
            threading.Thread(target=self._drop, name="test-database-drops", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def take(self, timeout: float = 120.0) -> str:
        """The name of a fresh database, cloned from the template, that no one else uses."""
        with self._cond:
            self._wanted += 1
            self._cond.notify_all()
            try:
                if not self._cond.wait_for(lambda: self._ready or self._failure, timeout):
                    raise TimeoutError(f"no test database after {timeout}s")
                if not self._ready and self._failure is not None:
                    raise RuntimeError("the test database pool failed") from self._failure
                return self._ready.popleft()
            finally:
                self._wanted -= 1

    def give_back(self, name: str) -> None:
        """Drop `name` (WITH FORCE) soon, in the worker."""
        with self._cond:
            self._drops.append(name)
            self._cond.notify_all()

    def close(self) -> None:
        """Wait for every drop; drop the clones nobody took."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._threads[0].join()
        with self._cond:
            self._drops.extend(self._ready)
            self._ready.clear()
            self._cond.notify_all()
        self._threads[1].join()
        if self._failure is not None:
            raise RuntimeError("the test database pool failed") from self._failure

    def _run(self, statement: str) -> bool:
        """One connection per statement: a test that cuts PostgreSQL costs one statement, not the pool."""
        try:
            with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10) as connection:
                connection.execute(statement)
            return True
        except BaseException as exc:  # a taker raises it; close() raises the first
            with self._cond:
                self._failure = self._failure or exc
                self._cond.notify_all()
            return False

    def _create(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda: self._closing or len(self._ready) < max(self.ahead, self._wanted) or self._failure
                )
                if self._closing or self._failure:
                    return
            name = f"apprentice_test_{uuid.uuid4().hex[:12]}"
            if not self._run(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"'):
                return
            with self._cond:
                self._ready.append(name)
                self._cond.notify_all()

    def _drop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._drops or (self._closing and not self._threads[0].is_alive()))
                if not self._drops:
                    return
                name = self._drops.popleft()
            self._run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
