"""The adapter store's second target: S3-compatible object storage, and the replicas' sync.

Where a shared volume is hard to get (a Kubernetes cluster without ReadWriteMany storage,
replicas in several zones), the promotion job also uploads each published copy to
`s3://bucket/prefix/<name>/`, and each replica runs `apprentice adapter-store sync` (an init
container, then a sidecar) that mirrors the bucket into the local directory vLLM's filesystem
resolver reads. The directory store (`adapter_store.py`) stays the one writer of directories:
the sync downloads into a staging directory, checks every file against the manifest's SHA-256,
and publishes it through `AdapterStore.publish`, with its atomic rename.

Objects are written so that a reader never takes half an adapter for a whole one: an upload
deletes the old `adapter_config.json` first, writes the weights and the manifest, and the
config last; a removal deletes the config first. A name is listed only when its config and
manifest are both there, and a download whose bytes do not match the manifest is refused.

boto3 is the `s3` extra (`pip install 'apprentice[s3]'`), imported only when a store is
configured; credentials come from boto3's own chain (environment, profile, pod or instance
role), never from Apprentice's config.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from apprentice.promotion.adapter_store import MANIFEST, PRESENT, PUBLISHED, TEMP_PREFIX, AdapterStore, PublishError
from apprentice.promotion.files import ADAPTER_CONFIG
from apprentice.settings import PolicySettings

log = logging.getLogger(__name__)

__all__ = ["ObjectStore", "SyncReport", "sync_directory"]


def _split(url: str) -> tuple[str, str]:
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"an object store URL is s3://bucket[/prefix], not {url!r}")
    return parsed.netloc, parsed.path.strip("/")


class ObjectStore:
    """Published adapters under one bucket and prefix."""

    def __init__(
        self, url: str, *, endpoint_url: str | None = None, region: str | None = None, client: Any = None
    ) -> None:
        self.url = url.rstrip("/")
        self.bucket, self.prefix = _split(url)
        if client is None:
            import boto3  # type: ignore[import-untyped]

            client = boto3.client("s3", endpoint_url=endpoint_url, region_name=region)
        self.client = client

    @classmethod
    def for_policy(cls, policy: PolicySettings) -> ObjectStore | None:
        """The policy's object target (`promotion.adapter_store.s3`); None when it has none."""
        store = policy.promotion.adapter_store
        if store is None or store.s3 is None:
            return None
        return cls(store.s3.url, endpoint_url=store.s3.endpoint_url, region=store.s3.region)

    def key(self, name: str, file: str = "") -> str:
        return "/".join(part for part in (self.prefix, name, file) if part)

    def _error(self, name: str, exc: Exception, *, permanent: bool = False) -> PublishError:
        return PublishError(name, Path(self.url), f"{type(exc).__name__}: {exc}", permanent=permanent)

    # ------------------------------------------------------------ reads

    def manifest(self, name: str) -> dict[str, Any] | None:
        """The manifest of `name` in the bucket; None when there is none."""
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self.key(name, MANIFEST))["Body"].read()
        except self.client.exceptions.NoSuchKey:
            return None
        try:
            document = json.loads(body)
        except ValueError:
            return None
        return document if isinstance(document, dict) else None

    def _keys(self) -> list[str]:
        keys: list[str] = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=f"{self.prefix}/" if self.prefix else ""):
            keys += [item["Key"] for item in page.get("Contents", [])]
        return keys

    def names(self) -> set[str]:
        """Every name whose config and manifest are both in the bucket (a whole upload)."""
        start = len(self.prefix) + 1 if self.prefix else 0
        found: dict[str, set[str]] = {}
        for key in self._keys():
            name, _, file = key[start:].rpartition("/")
            if name and file in (ADAPTER_CONFIG, MANIFEST):
                found.setdefault(name, set()).add(file)
        return {name for name, files in found.items() if files == {ADAPTER_CONFIG, MANIFEST}}

    # ------------------------------------------------------------ writes

    def upload(self, name: str, directory: Path) -> str:
        """Upload the published copy at `directory` (it carries the manifest) as `name`:
        PRESENT when the bucket already holds this copy, else PUBLISHED."""
        local = json.loads((directory / MANIFEST).read_bytes())
        try:
            remote = self.manifest(name)
            if remote is not None and _same_copy(remote, local) and self._has_config(name):
                return PRESENT
            self.client.delete_object(Bucket=self.bucket, Key=self.key(name, ADAPTER_CONFIG))
            for file in sorted(local["files"]):
                if file != ADAPTER_CONFIG:
                    self._put(name, directory, file)
            self._put(name, directory, MANIFEST)
            self._put(name, directory, ADAPTER_CONFIG)
        except PublishError:
            raise
        except Exception as exc:  # botocore's errors: the network, credentials, the bucket
            raise self._error(name, exc) from exc
        log.info("adapter store: uploaded %s to %s", name, self.url)
        return PUBLISHED

    def _has_config(self, name: str) -> bool:
        """Whether `name`'s config is in the bucket (it is uploaded last: the upload was whole)."""
        try:
            self.client.head_object(Bucket=self.bucket, Key=self.key(name, ADAPTER_CONFIG))
        except self.client.exceptions.ClientError:
            return False
        return True

    def _put(self, name: str, directory: Path, file: str) -> None:
        with (directory / file).open("rb") as body:
            self.client.put_object(Bucket=self.bucket, Key=self.key(name, file), Body=body)

    def remove(self, name: str) -> bool:
        """Delete `name`'s objects, its config first; False when there were none."""
        prefix = self.key(name) + "/"
        try:
            keys = [key for key in self._keys() if key.startswith(prefix) and "/" not in key[len(prefix) :]]
            if not keys:
                return False
            config = self.key(name, ADAPTER_CONFIG)
            for key in sorted(keys, key=lambda k: k != config):
                self.client.delete_object(Bucket=self.bucket, Key=key)
        except Exception as exc:
            raise self._error(name, exc) from exc
        log.info("adapter store: removed %s from %s", name, self.url)
        return True

    def download(self, name: str, manifest: dict[str, Any], staging: Path) -> None:
        """Every file the manifest names, into `staging`, each checked against its SHA-256; the
        config last, so that a staging directory left by a kill never holds a config."""
        files = dict(manifest.get("files") or {})
        for file, expected in sorted(files.items(), key=lambda item: item[0] == ADAPTER_CONFIG):
            if "/" in file or file.startswith("."):
                raise PublishError(name, Path(self.url), f"the manifest names {file!r}", permanent=True)
            try:
                body = self.client.get_object(Bucket=self.bucket, Key=self.key(name, file))["Body"].read()
            except Exception as exc:
                raise self._error(name, exc) from exc
            if hashlib.sha256(body).hexdigest() != expected:
                reason = f"{file} does not match its manifest (SHA-256): changed while read, or damaged"
                raise PublishError(name, Path(self.url), reason, permanent=False)
            (staging / file).write_bytes(body)


def _same_copy(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(key) == b.get(key) for key in ("version_id", "base_model", "files"))


@dataclass
class SyncReport:
    """What one sync did: names downloaded, removed, and the errors (one per name)."""

    downloaded: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def local_names(root: Path) -> set[str]:
    """The names published in a directory store (each directory with a manifest)."""
    if not root.is_dir():
        return set()
    return {
        manifest.parent.relative_to(root).as_posix()
        for manifest in root.rglob(MANIFEST)
        if not any(part.startswith(".") for part in manifest.parent.relative_to(root).parts)
    }


def sync_directory(objects: ObjectStore, root: Path) -> SyncReport:
    """Make the directory store at `root` hold what the bucket holds (what vLLM then resolves).

    A name already whole locally for the same version and base model is left alone; another
    is downloaded, checked and published atomically; a local copy this store published whose
    name left the bucket is removed. Directories without a manifest are never touched."""
    report = SyncReport()
    root.mkdir(parents=True, exist_ok=True)
    try:
        remote = objects.names()
    except Exception as exc:
        report.errors.append(f"listing {objects.url}: {type(exc).__name__}: {exc}")
        return report
    for name in sorted(remote):
        try:
            manifest = objects.manifest(name)
            if manifest is None:  # removed since the listing
                continue
            store = AdapterStore(root, str(manifest.get("base_model")))
            if store.is_current(name, str(manifest.get("version_id"))):
                continue
            staging = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}download-", dir=root))
            try:
                objects.download(name, manifest, staging)
                store.publish(name, staging, str(manifest["version_id"]))
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            report.downloaded.append(name)
        except (PublishError, ValueError, KeyError) as exc:
            report.errors.append(f"{name}: {exc}")
    for name in sorted(local_names(root) - remote):
        try:
            if AdapterStore(root, "").remove(name):
                report.removed.append(name)
        except (PublishError, ValueError) as exc:
            report.errors.append(f"{name}: {exc}")
    AdapterStore(root, "").sweep()
    return report
