"""Real processes for tests: the gateway and the fake upstream, each on a free port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, timeout: float = 30.0, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before {url} answered")
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer within {timeout}s")


class ManagedProcess:
    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.args = args
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
                                        cwd=REPO_ROOT, start_new_session=True)

    def signal(self, sig: int) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, sig)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait (graceful shutdown); SIGKILL if it does not stop in time."""
        if self.process is None:
            return None
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.process.wait(5)
        self._log.close()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL the whole process group: no shutdown code runs."""
        if self.process is None:
            return
        self.signal(signal.SIGKILL)
        self.process.wait(10)
        self._log.close()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class FakeUpstreamProcess(ManagedProcess):
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        super().__init__([sys.executable, "-m", "tests.support.fake_upstream", "--port", str(self.port)],
                         workdir / f"fake-upstream-{self.port}.log")

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        super().start()
        wait_http(f"http://127.0.0.1:{self.port}/v1/models", process=self.process)


class GatewayProcess(ManagedProcess):
    """`apprentice gateway` with a config file written from a dict."""

    def __init__(self, workdir: Path, config: dict[str, Any], *, workers: int = 1, port: int | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.port = port or free_port()
        self.workdir = workdir
        self.config = config
        self.config_path = workdir / f"gateway-{self.port}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        super().__init__([sys.executable, "-m", "gateway.cli", "gateway", "--config", str(self.config_path),
                          "--port", str(self.port), "--workers", str(workers)],
                         workdir / f"gateway-{self.port}.log", env)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def start(self, timeout: float = 60.0) -> None:
        super().start()
        try:
            wait_http(self.url + "/healthz", timeout=timeout, process=self.process)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"{exc}\n--- gateway log ---\n{self.log_text()[-4000:]}") from exc


class ModelServerProcess(ManagedProcess):
    """`apprentice serve-model` (the local inference server) on a free port."""

    def __init__(self, workdir: Path, model_dir: Path, served_name: str, *extra_args: str,
                 start_timeout: float = 180.0) -> None:
        self.port = free_port()
        self.start_timeout = start_timeout
        super().__init__([sys.executable, "-m", "gateway.cli", "serve-model", "--model", str(model_dir),
                          "--served-model-name", served_name, "--port", str(self.port), "--max-lora-rank", "8",
                          "--log-level", "warning", *extra_args],
                         workdir / f"serve-model-{self.port}.log")

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        super().start()
        wait_http(f"http://127.0.0.1:{self.port}/health", timeout=self.start_timeout, process=self.process)
