"""`apprentice gateway`: run the gateway with uvicorn (one or several worker processes)."""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import sys
from typing import Literal, TypedDict

import click

from apprentice.commands.common import config_option, database_url, load, setup_logging
from apprentice.settings import Settings
from apprentice.store.schema import SchemaOutOfDate, check_schema

GRACEFUL_SHUTDOWN_S = 30
# Idle keep-alive connections are kept this long (uvicorn's default is 5 s). A server that closes
# an idle connection while a client (or a load balancer, whose idle timeouts are typically 60 s)
# sends a new request on it makes that request fail with a connection reset; keeping connections
# longer than the clients in front of it is the usual rule.
KEEP_ALIVE_S = 75


class UvicornOptions(TypedDict):
    """The keyword arguments of uvicorn.run shared by the one-process and the worker-process runs."""

    host: str
    port: int
    loop: str
    http: str
    access_log: bool
    log_level: str
    timeout_graceful_shutdown: int
    timeout_keep_alive: int
    lifespan: Literal["auto", "on", "off"]
    server_header: bool
    date_header: bool
    proxy_headers: bool


def _exit_normally(signum: int, frame: object) -> None:
    raise SystemExit(0)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def app_from_environment():  # noqa: ANN201 - uvicorn factory for worker processes
    """Each worker builds its app from the config and database URL the parent exported."""
    from apprentice.settings import load_settings
    from gateway.app import create_app

    settings = load_settings()
    return create_app(settings, os.environ["APPRENTICE_DATABASE_URL"], check_schema_on_start=False)


def serve(
    settings: Settings,
    *,
    host: str | None = None,
    port: int | None = None,
    workers: int | None = None,
    allow_open_remote: bool = False,
) -> None:
    """Check the set-up, then run uvicorn until SIGINT/SIGTERM (graceful: in-flight calls finish)."""
    host = host or settings.host
    port = port or settings.port
    workers = workers or settings.workers
    # The address is part of the settings the app reads (the judge calls the gateway there);
    # worker processes rebuild the settings from the environment, so it goes there too.
    settings.host, settings.port = host, port
    os.environ["APPRENTICE_HOST"], os.environ["APPRENTICE_PORT"] = host, str(port)
    if settings.auth.mode == "open" and not is_loopback(host) and not allow_open_remote:
        raise click.ClickException(
            f"auth.mode is 'open' (no API keys) and the gateway would listen on {host}: open mode is for "
            "local use only. Listen on 127.0.0.1, or use auth.mode: keys (see `apprentice keys create`)."
        )
    if settings.auth.mode == "keys" and settings.auth.admin_key is None:
        click.echo(
            "note: no auth.admin_key configured; admin keys can be made with `apprentice keys create --admin`", err=True
        )
    url = database_url(settings)
    try:
        check_schema(url)
    except SchemaOutOfDate as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)

    import uvicorn

    # uvicorn re-raises SIGINT/SIGTERM after its graceful shutdown; with the default handler
    # that kills the process before atexit runs, leaving an embedded PostgreSQL behind. A
    # graceful stop is a normal exit.
    for stop_signal in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop_signal, _exit_normally)

    options = UvicornOptions(
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level=settings.log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        timeout_keep_alive=KEEP_ALIVE_S,
        lifespan="on",
        server_header=False,
        date_header=False,
        proxy_headers=False,
    )
    click.echo(f"Apprentice gateway on http://{host}:{port}/v1 ({workers} worker(s))", err=True)
    if workers > 1:
        # Workers rebuild the settings from the config file and environment exported by load().
        metrics_dir = settings.data_dir / f"prometheus-{port}"
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir.resolve())
        uvicorn.run("gateway.commands.serve:app_from_environment", factory=True, workers=workers, **options)
    else:
        from gateway.app import create_app

        uvicorn.run(create_app(settings, url, check_schema_on_start=False), **options)


@click.command("gateway")
@config_option
@click.option("--host", default=None, help="Listen address (default from config: 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Listen port (default from config: 8000).")
@click.option("--workers", type=int, default=None, help="Worker processes (default from config: 1).")
@click.option("--allow-open-remote", is_flag=True, help="Allow auth.mode 'open' on a non-loopback address.")
def gateway_command(
    config_path: str | None, host: str | None, port: int | None, workers: int | None, allow_open_remote: bool
) -> None:
    """Run the OpenAI-compatible gateway."""
    settings = load(config_path)
    setup_logging(settings.log_level)
    serve(settings, host=host, port=port, workers=workers, allow_open_remote=allow_open_remote)
