"""Real processes for tests: the gateway and the fake upstream, each on a free port."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from apprentice.processes import ManagedProcess, ProcessFailed, free_port, wait_http

REPO_ROOT = Path(__file__).resolve().parents[2]

__all__ = [
    "REPO_ROOT",
    "FakeUpstreamProcess",
    "GatewayProcess",
    "ManagedProcess",
    "ModelServerProcess",
    "ProcessFailed",
    "cli",
    "free_port",
    "wait_http",
]


class FakeUpstreamProcess(ManagedProcess):
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        super().__init__(
            "fake upstream",
            [sys.executable, "-m", "tests.support.fake_upstream", "--port", str(self.port)],
            workdir / f"fake-upstream-{self.port}.log",
            cwd=REPO_ROOT,
            ready_url=f"http://127.0.0.1:{self.port}/v1/models",
        )

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def chat_only_api_base(self) -> str:
        """The same upstream as a server that speaks chat completions only (no /v1/responses)."""
        return f"http://127.0.0.1:{self.port}/chat-only/v1"

    def start(self) -> None:
        super().start()
        self.wait_ready(30.0)


class GatewayProcess(ManagedProcess):
    """`apprentice gateway` with a config file written from a dict."""

    def __init__(
        self,
        workdir: Path,
        config: dict[str, Any],
        *,
        workers: int = 1,
        port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = port or free_port()
        self.workdir = workdir
        self.config = config
        self.config_path = workdir / f"gateway-{self.port}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        super().__init__(
            "gateway",
            [
                sys.executable,
                "-m",
                "apprentice.cli",
                "gateway",
                "--config",
                str(self.config_path),
                "--port",
                str(self.port),
                "--workers",
                str(workers),
            ],
            workdir / f"gateway-{self.port}.log",
            env=env,
            cwd=REPO_ROOT,
        )

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

    def __init__(
        self,
        workdir: Path,
        model_dir: Path,
        served_name: str,
        *extra_args: str,
        start_timeout: float = 180.0,
        host: str = "127.0.0.1",
        port: int | None = None,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.start_timeout = start_timeout
        super().__init__(
            "local inference server",
            [
                sys.executable,
                "-m",
                "apprentice.cli",
                "serve-model",
                "--model",
                str(model_dir),
                "--served-model-name",
                served_name,
                "--host",
                host,
                "--port",
                str(self.port),
                "--max-lora-rank",
                "8",
                "--log-level",
                "warning",
                *extra_args,
            ],
            workdir / f"serve-model-{host}-{self.port}.log",
            cwd=REPO_ROOT,
            ready_url=f"http://{host}:{self.port}/health",
        )

    @property
    def api_base(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> None:
        super().start()
        self.wait_ready(self.start_timeout)


def cli(database_url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`apprentice ARGS --config` on a config naming only the database (keys, db commands)."""
    config = tmp_path / "cli.yaml"
    config.write_text(yaml.safe_dump({"database_url": database_url, "data_dir": str(tmp_path / "cli-data")}))
    return subprocess.run(
        [sys.executable, "-m", "apprentice.cli", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
    )
