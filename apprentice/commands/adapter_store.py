"""`apprentice adapter-store sync`: mirror the adapter store's bucket into a replica's directory.

Run by each inference replica that does not mount the shared adapter store: once as an init
container (`--once`: the serving adapters are there before vLLM starts), then as a sidecar
every `--interval` seconds. The directory is what vLLM's `VLLM_LORA_RESOLVER_CACHE_DIR` points
at. Needs the `s3` extra (boto3); credentials come from boto3's chain (environment, profile,
pod or instance role).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import click


@click.group("adapter-store")
def adapter_store_group() -> None:
    """The shared adapter store that inference replicas resolve LoRA adapters from."""


@adapter_store_group.command("sync")
@click.option("--from", "url", required=True, envvar="APPRENTICE_ADAPTER_STORE_URL", help="s3://bucket/prefix")
@click.option(
    "--to",
    "directory",
    required=True,
    type=click.Path(file_okay=False),
    envvar="VLLM_LORA_RESOLVER_CACHE_DIR",
    help="The directory vLLM resolves adapters from (default: $VLLM_LORA_RESOLVER_CACHE_DIR).",
)
@click.option("--endpoint-url", default=None, envvar="AWS_ENDPOINT_URL_S3", help="An S3-compatible server (MinIO...).")
@click.option("--region", default=None, envvar="AWS_REGION")
@click.option("--once", is_flag=True, help="One pass, then exit (non-zero when anything failed): an init container.")
@click.option("--interval", default=15.0, show_default=True, type=float, help="Seconds between passes (a sidecar).")
def sync_command(
    url: str, directory: str, endpoint_url: str | None, region: str | None, once: bool, interval: float
) -> None:
    """Download what the bucket holds into DIRECTORY and remove what it no longer holds."""
    from apprentice.promotion.object_store import ObjectStore, sync_directory

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        objects = ObjectStore(url, endpoint_url=endpoint_url, region=region)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--from") from exc
    except ImportError as exc:
        message = "the adapter store's object target needs boto3: pip install 'apprentice[s3]'"
        raise click.ClickException(message) from exc
    root = Path(directory)
    while True:
        report = sync_directory(objects, root)
        for name in report.downloaded:
            click.echo(f"downloaded {name}")
        for name in report.removed:
            click.echo(f"removed {name}")
        for error in report.errors:
            click.echo(f"error: {error}", err=True)
        if once:
            if report.errors:
                raise SystemExit(1)
            return
        time.sleep(interval)
