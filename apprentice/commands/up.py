"""`apprentice up`: the whole loop on one machine, with nothing configured.

It starts, in order: an embedded PostgreSQL (unless DATABASE_URL is set) with the schema
brought up to date; the local inference server with SmolLM2-135M-Instruct (fetched once);
the gateway, with a policy ready to learn; and the learner (training and promotion). It
prints the OPENAI_BASE_URL to use, and Ctrl-C stops everything cleanly. The generated config
and all data live under the data directory (.apprentice/), so the second start reuses them.

With --config FILE it runs that configuration instead: the gateway and the learner, the
embedded PostgreSQL if the file names no database, and the local inference server if the
file has a `local_model_server` section (the generated one has).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click
import yaml

from apprentice.commands.common import config_option, database_url, load, setup_logging
from apprentice.processes import ManagedProcess, ProcessFailed
from apprentice.settings import LocalModelServerSettings, Settings
from apprentice.store import schema
from apprentice.store.engine import stop_embedded_postgres

DEFAULT_POLICY = "apprentice"
DEFAULT_BASE_MODEL = LocalModelServerSettings.model_fields["model"].default
STOP_TIMEOUT_S = 45.0
SERVICE_START_TIMEOUT_S = 120.0


def default_config(data_dir: Path, port: int, model_port: int) -> dict[str, Any]:
    """The configuration written on first start; edit it and start again to change anything."""
    model_server = LocalModelServerSettings(model=DEFAULT_BASE_MODEL, port=model_port)
    config: dict[str, Any] = {
        "data_dir": str(data_dir),
        "host": "127.0.0.1",
        "port": port,
        "auth": {"mode": "open"},
        "journal": {"ship_interval_s": 0.2},
        "local_model_server": {"model": model_server.model, "host": model_server.host, "port": model_server.port},
        "policies": [
            {
                "name": DEFAULT_POLICY,
                "base_model": DEFAULT_BASE_MODEL,
                "endpoints": [model_server.url],
                # GRPO compares several answers to the same task: sample with variety.
                "temperature": 1.0,
                "reward_range": [0.0, 1.0],
                # Sized for a small model on a laptop CPU: each run is about one GRPO step (4 groups of
                # 8 answers, 32 samples per optimizer step), continuing the training lineage as soon
                # as 4 new rewarded groups wait, at the learning rate that moves a 135M model within
                # minutes. Rewards may arrive up to 10 s late and still join their group.
                "learning": {
                    "min_new_groups": 4,
                    "trigger_poll_s": 2,
                    "reward_wait_s": 10,
                    "min_group_size": 4,
                    "max_trajectories": 64,
                    "lr": 1e-4,
                    "micro_batch_size": 8,
                    "grad_accumulation": 4,
                    "lora_rank": 8,
                    "lora_alpha": 16,
                },
                # The canary serves half of new runs and always runs the newest gated version of the
                # lineage; the sequential test promotes it as soon as the lineage is significantly
                # better (valid however often it looks) and rejects the lineage if it is worse.
                "promotion": {
                    "mode": "automatic",
                    "auto_canary": True,
                    "canary_share": 0.5,
                    "min_samples": 16,
                    "confidence": 0.9,
                    "method": "sequential",
                    "settle_s": 10,
                    "timeout_s": 3600,
                },
            }
        ],
    }
    if os.environ.get("OPENAI_API_KEY"):
        config["model_list"] = [
            {"model_name": "*", "litellm_params": {"model": "openai/*", "api_key": "os.environ/OPENAI_API_KEY"}}
        ]
    return config


def apprentice_command(*args: str) -> list[str]:
    """argv for another `apprentice` command run by this interpreter."""
    return [sys.executable, "-m", "apprentice.cli", *args]


def model_server_process(server: LocalModelServerSettings, logs: Path, env: dict[str, str]) -> ManagedProcess:
    return ManagedProcess(
        "the local inference server",
        apprentice_command("serve-model", "--model", server.model, "--host", server.host, "--port", str(server.port)),
        logs / "model-server.log",
        env=env,
        ready_url=f"{server.url}/models",
    )


def service_processes(config_path: Path, settings: Settings, logs: Path, env: dict[str, str]) -> list[ManagedProcess]:
    """The gateway, then the learner (which also runs promotion)."""
    gateway_url = f"http://{settings.host}:{settings.port}"
    return [
        ManagedProcess(
            "the gateway",
            apprentice_command("gateway", "--config", str(config_path)),
            logs / "gateway.log",
            env=env,
            ready_url=f"{gateway_url}/healthz",
        ),
        ManagedProcess(
            "the learner", apprentice_command("learner", "--config", str(config_path)), logs / "learner.log", env=env
        ),
    ]


def reload_serving_adapters(settings: Settings, url: str) -> None:
    """A fresh inference server knows no adapters: load the promoted and canary versions
    before the gateway routes calls to them (the promotion job's reconciler, run once now)."""
    from apprentice.promotion.tick import run_promotion_tick  # imports httpx and SQLAlchemy only

    run_promotion_tick(settings, url)


def write_default_config(data_dir: str, port: int, model_port: int) -> Path:
    root = Path(data_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    generated = root / "apprentice.yaml"
    if not generated.exists():
        generated.write_text(
            "# Written by `apprentice up` on first start; edit and start again.\n"
            + yaml.safe_dump(default_config(root, port, model_port), sort_keys=False)
        )
    return generated


def ready_banner(settings: Settings, logs: Path) -> str:
    base_url = f"http://{settings.host}:{settings.port}/v1"
    policies = ", ".join(p.name for p in settings.policies) or "none"
    api_key = (
        "apprentice-local   # open mode: any value, loopback only"
        if settings.auth.mode == "open"
        else "<a key from `apprentice keys create`>"
    )
    return (
        f"\nApprentice is up.\n  export OPENAI_BASE_URL={base_url}\n  export OPENAI_API_KEY={api_key}\n"
        f"  policies (model names that learn): {policies}\n"
        f"  admin API: {base_url}/admin/policies   logs: {logs}\nPress Ctrl-C to stop.\n"
    )


@click.command("up")
@config_option
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    default=".apprentice",
    show_default=True,
    help="Where the generated config, the database, the journal and adapters live.",
)
@click.option("--port", type=int, default=8000, show_default=True, help="Gateway port (first start).")
@click.option(
    "--model-port", type=int, default=8001, show_default=True, help="Local inference server port (first start)."
)
def up_command(config_path: str | None, data_dir: str, port: int, model_port: int) -> None:
    """Run the whole loop locally: database, inference server, gateway and learner."""
    if config_path is None:
        config_path = str(write_default_config(data_dir, port, model_port))
    settings = load(config_path)
    setup_logging(settings.log_level)
    url = database_url(settings)  # starts the embedded PostgreSQL when none is configured
    schema.upgrade(url)
    logs = settings.data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {"APPRENTICE_DATABASE_URL": url, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}

    stopping = False

    def request_stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    started: list[ManagedProcess] = []

    def start(process: ManagedProcess, timeout: float) -> None:
        click.echo(f"starting {process.name} (log: {process.log_path})", err=True)
        started.append(process)
        process.start()
        process.wait_ready(timeout)

    try:
        server = settings.local_model_server
        if server is not None:
            start(model_server_process(server, logs, env), server.start_timeout_s)
            reload_serving_adapters(settings, url)
        for process in service_processes(Path(config_path), settings, logs, env):
            start(process, SERVICE_START_TIMEOUT_S)
        click.echo(ready_banner(settings, logs), err=True)
        while not stopping:
            for process in started:
                if not process.alive():
                    raise click.ClickException(
                        f"{process.name} stopped unexpectedly (exit {process.returncode}); see {process.log_path}"
                    )
            time.sleep(0.5)
    except ProcessFailed as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        click.echo("stopping ...", err=True)
        for process in reversed(started):
            process.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in reversed(started):
            process.wait_stopped(deadline)
        stop_embedded_postgres()
        click.echo("stopped.", err=True)
