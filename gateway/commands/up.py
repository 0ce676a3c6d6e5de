"""`apprentice up`: the whole loop on one machine, with nothing configured.

It starts, in order: an embedded PostgreSQL (unless DATABASE_URL is set) with the schema
brought up to date; the local inference server with SmolLM2-135M-Instruct (fetched once);
the gateway, with a policy ready to learn; and the learner (training and promotion). It
prints the OPENAI_BASE_URL to use, and Ctrl-C stops everything cleanly. The generated config
and all data live under the data directory (.apprentice/), so the second start reuses them.

With --config FILE it runs that configuration instead (gateway and learner), starting only
the embedded PostgreSQL if the file names no database.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import httpx
import yaml

from gateway.commands.common import config_option, database_url, load, setup_logging
from gateway.config import Settings
from gateway.store import schema
from gateway.store.engine import stop_embedded_postgres

DEFAULT_POLICY = "apprentice"
DEFAULT_BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
STOP_TIMEOUT_S = 45.0
MODEL_START_TIMEOUT_S = 900.0  # the first start downloads and converts the model


def default_config(data_dir: Path, port: int, model_port: int) -> dict[str, Any]:
    """The configuration written on first start; edit it and start again to change anything."""
    config: dict[str, Any] = {
        "data_dir": str(data_dir),
        "host": "127.0.0.1",
        "port": port,
        "auth": {"mode": "open"},
        "journal": {"ship_interval_s": 0.2},
        "policies": [{
            "name": DEFAULT_POLICY,
            "base_model": DEFAULT_BASE_MODEL,
            "endpoints": [f"http://127.0.0.1:{model_port}/v1"],
            # GRPO compares several answers to the same task: sample with variety.
            "temperature": 1.0,
            "reward_range": [0.0, 1.0],
            # Sized for a small model on a laptop CPU: train as soon as a few rewarded groups
            # wait, at the learning rate that moves a 135M model within minutes.
            # A run takes the newest 96 rewarded trajectories, so it ends in about a minute on a CPU.
            "learning": {"min_new_groups": 8, "trigger_poll_s": 10, "reward_wait_s": 5, "min_group_size": 4,
                         "max_trajectories": 96, "lr": 3e-4, "micro_batch_size": 8, "grad_accumulation": 2,
                         "lora_rank": 8, "lora_alpha": 16},
            # Candidates that pass the gates serve half of new runs until the comparison decides;
            # one that is no better within five minutes gives its place to the next candidate.
            "promotion": {"mode": "automatic", "auto_canary": True, "canary_share": 0.5, "min_samples": 24,
                          "confidence": 0.9, "timeout_s": 300},
        }],
    }
    if os.environ.get("OPENAI_API_KEY"):
        config["model_list"] = [{"model_name": "*",
                                 "litellm_params": {"model": "openai/*", "api_key": "os.environ/OPENAI_API_KEY"}}]
    return config


@dataclass
class Child:
    name: str
    args: list[str]
    ready_url: str | None
    log_path: Path
    process: subprocess.Popen | None = field(default=None, repr=False)

    def start(self, env: dict[str, str]) -> None:
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise click.ClickException(f"{self.name} exited during start; see {self.log_path}")
            if self.ready_url is None:
                return
            try:
                if httpx.get(self.ready_url, timeout=2).status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise click.ClickException(f"{self.name} did not become ready in {timeout:.0f}s; see {self.log_path}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)

    def wait_stopped(self, deadline: float) -> None:
        if self.process is None:
            return
        try:
            self.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)


def _apprentice(*args: str) -> list[str]:
    return [sys.executable, "-m", "gateway.cli", *args]


def _children(config_path: Path, config: dict[str, Any], logs: Path, start_model_server: bool) -> list[Child]:
    children = []
    if start_model_server:
        endpoint = config["policies"][0]["endpoints"][0]
        port = endpoint.rsplit(":", 1)[1].split("/")[0]
        children.append(Child("the local inference server",
                              _apprentice("serve-model", "--model", DEFAULT_BASE_MODEL, "--port", port),
                              f"{endpoint}/models", logs / "model-server.log"))
    gateway_url = f"http://{config.get('host', '127.0.0.1')}:{config.get('port', 8000)}"
    children.append(Child("the gateway", _apprentice("gateway", "--config", str(config_path)),
                          f"{gateway_url}/healthz", logs / "gateway.log"))
    children.append(Child("the learner", _apprentice("learner", "--config", str(config_path)), None,
                          logs / "learner.log"))
    return children


def reload_serving_adapters(settings: Settings, url: str) -> None:
    """A fresh inference server knows no adapters: load the promoted and canary versions
    before the gateway routes calls to them (the promotion job's reconciler, run once now)."""
    from learner.promotion.service import run_promotion_tick  # no torch: promotion only talks HTTP

    run_promotion_tick(settings, url)


@click.command("up")
@config_option
@click.option("--data-dir", type=click.Path(file_okay=False), default=".apprentice", show_default=True,
              help="Where the generated config, the database, the journal and adapters live.")
@click.option("--port", type=int, default=8000, show_default=True, help="Gateway port (first start).")
@click.option("--model-port", type=int, default=8001, show_default=True,
              help="Local inference server port (first start).")
def up_command(config_path: str | None, data_dir: str, port: int, model_port: int) -> None:
    """Run the whole loop locally: database, inference server, gateway and learner."""
    start_model_server = config_path is None
    if config_path is None:
        root = Path(data_dir).resolve()
        root.mkdir(parents=True, exist_ok=True)
        generated = root / "apprentice.yaml"
        if not generated.exists():
            generated.write_text("# Written by `apprentice up` on first start; edit and start again.\n"
                                 + yaml.safe_dump(default_config(root, port, model_port), sort_keys=False))
        config_path = str(generated)
    settings = load(config_path)
    setup_logging(settings.log_level)
    config = yaml.safe_load(Path(config_path).read_text()) or {}
    url = database_url(settings)  # starts the embedded PostgreSQL when none is configured
    schema.upgrade(url)
    logs = settings.data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "APPRENTICE_DATABASE_URL": url, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}

    children = _children(Path(config_path), config, logs, start_model_server)
    stopping = False

    def request_stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        for child in children:
            click.echo(f"starting {child.name} (log: {child.log_path})", err=True)
            child.start(env)
            child.wait_ready(MODEL_START_TIMEOUT_S if "inference" in child.name else 120.0)
            if "inference" in child.name:
                reload_serving_adapters(settings, url)
        base_url = f"http://{settings.host}:{settings.port}/v1"
        policies = ", ".join(p.name for p in settings.policies) or "none"
        click.echo(f"\nApprentice is up.\n  export OPENAI_BASE_URL={base_url}\n"
                   f"  export OPENAI_API_KEY={'apprentice-local   # open mode: any value, loopback only' if settings.auth.mode == 'open' else '<a key from `apprentice keys create`>'}\n"
                   f"  policies (model names that learn): {policies}\n"
                   f"  admin API: {base_url}/admin/policies   logs: {logs}\nPress Ctrl-C to stop.\n", err=True)
        while not stopping:
            for child in children:
                if child.process is not None and child.process.poll() is not None:
                    raise click.ClickException(f"{child.name} stopped unexpectedly (exit {child.process.returncode}); "
                                               f"see {child.log_path}")
            time.sleep(0.5)
    finally:
        click.echo("stopping ...", err=True)
        for child in reversed(children):
            child.stop()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for child in reversed(children):
            child.wait_stopped(deadline)
        stop_embedded_postgres()
        click.echo("stopped.", err=True)
