"""Child processes: the one supervisor that `apprentice up`, the tests and the benchmarks use.

Each child runs in a session of its own (`start_new_session`), so a signal sent to its
process group reaches the workers it forks too (uvicorn's, say), and a stop leaves nothing
behind. Its output goes to a log file that is appended to, never truncated, so a restart
keeps the history that explains it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import IO

import httpx


class ProcessFailed(RuntimeError):
    """A child exited, or did not become ready, when it should have been serving."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def wait_http(
    url: str, timeout: float = 30.0, process: subprocess.Popen[bytes] | None = None, interval: float = 0.05
) -> None:
    """Wait until `url` answers with a status below 500; fail early if `process` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise ProcessFailed(f"process exited with {process.returncode} before {url} answered")
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(interval)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f}s")


class ManagedProcess:
    """One child process in its own session, logging to a file.

    `ready_url`, when given, is what `wait_ready` polls; without one a child counts as ready
    as soon as it runs.
    """

    def __init__(
        self,
        name: str,
        args: list[str],
        log_path: Path,
        *,
        env: dict[str, str] | None = None,
        inherit_env: bool = True,
        cwd: Path | None = None,
        ready_url: str | None = None,
    ) -> None:
        self.name = name
        self.args = args
        self.log_path = log_path
        # `env` adds to this process's environment, or replaces it with inherit_env=False.
        self.env = {**(os.environ if inherit_env else {}), **(env or {})}
        self.cwd = cwd
        self.ready_url = ready_url
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.process is None:
            raise ProcessFailed(f"{self.name} was never started")
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            self.args,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float) -> None:
        """Return once the child serves `ready_url`; raise ProcessFailed (naming the log) if it
        exits or is not ready in time."""
        if self.process is None:
            raise ProcessFailed(f"{self.name} was never started")
        if self.ready_url is None:
            if self.process.poll() is not None:
                raise ProcessFailed(f"{self.name} exited during start; see {self.log_path}")
            return
        try:
            wait_http(self.ready_url, timeout=timeout, process=self.process, interval=0.1)
        except ProcessFailed as exc:
            raise ProcessFailed(f"{self.name} exited during start; see {self.log_path}") from exc
        except TimeoutError as exc:
            raise ProcessFailed(f"{self.name} did not become ready in {timeout:.0f}s; see {self.log_path}") from exc

    def signal(self, sig: int) -> None:
        """Send `sig` to the child's whole process group, if it still runs."""
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        """Ask for a graceful shutdown (SIGTERM) without waiting; see `wait_stopped`."""
        self.signal(signal.SIGTERM)

    def wait_stopped(self, deadline: float) -> int | None:
        """Wait until the monotonic `deadline`, then SIGKILL the group if it still runs."""
        if self.process is None:
            return None
        try:
            self.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.process.wait(5)
        self._kill_leftovers()
        self._close_log()
        return self.process.returncode

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait (graceful shutdown); SIGKILL if it does not stop in time."""
        self.terminate()
        return self.wait_stopped(time.monotonic() + timeout)

    def kill(self) -> None:
        """SIGKILL the whole process group: no shutdown code runs."""
        if self.process is None:
            return
        self.signal(signal.SIGKILL)
        self.process.wait(10)
        self._close_log()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _kill_leftovers(self) -> None:
        """The leader exited; workers it left in its session may still run."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
