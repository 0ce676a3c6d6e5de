"""The adapter store's object target against a real S3-compatible server (moto's, on a free port).

The promotion side uploads published copies; the replica side runs `apprentice adapter-store
sync` as a real process into the directory vLLM's resolver reads. PostgreSQL for the tick's
step (`sync_adapter_store`), which keeps the bucket in step with what serves.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from apprentice.processes import ManagedProcess, free_port
from apprentice.promotion import clock, lifecycle, reconcile
from apprentice.promotion.adapter_store import MANIFEST, PRESENT, PUBLISHED, AdapterStore
from apprentice.promotion.object_store import ObjectStore
from apprentice.settings import PolicySettings
from apprentice.store.engine import make_async_engine
from learner.serving.resolver import FilesystemResolver
from tests.support.processes import REPO_ROOT
from tests.support.promotion import add_candidate
from tests.test_adapter_store import make_adapter

BASE = "/models/tiny"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    server = ManagedProcess(
        "moto S3 server",
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        tmp_path_factory.mktemp("moto") / "moto.log",
        ready_url=f"http://127.0.0.1:{port}/",
    )
    server.start()
    server.wait_ready(60)
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def bucket(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    import boto3

    name = f"adapters-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=name)
    return f"s3://{name}/store"


def published_copy(root: Path, name: str, seed: int, tmp_path: Path) -> tuple[Path, uuid.UUID]:
    """A version published to a directory store, as the promotion job does first."""
    version = uuid.uuid4()
    AdapterStore(root, BASE).publish(name, make_adapter(tmp_path / f"learner-{name}", seed=seed), version)
    return root / name, version


def sync(url: str, s3_server: str, directory: Path) -> subprocess.CompletedProcess[str]:
    """`apprentice adapter-store sync --once`, as a replica's init container runs it."""
    return subprocess.run(
        [sys.executable, "-m", "apprentice.cli", "adapter-store", "sync", "--from", url, "--to", str(directory)]
        + ["--endpoint-url", s3_server, "--once"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        env={**os.environ, **CREDENTIALS},
    )


def leftovers(root: Path) -> list[Path]:
    return [*root.glob(".apprentice-tmp-*"), *root.glob(".apprentice-trash-*")]


def test_replicas_mirror_the_bucket(s3_server: str, bucket: str, tmp_path: Path) -> None:
    objects = ObjectStore(bucket, endpoint_url=s3_server)
    promoter = tmp_path / "promoter-store"
    v1_dir, v1 = published_copy(promoter, "agent-v1", 1, tmp_path)
    v2_dir, v2 = published_copy(promoter, "agent-v2", 2, tmp_path)
    assert objects.upload("agent-v1", v1_dir) == PUBLISHED
    assert objects.upload("agent-v2", v2_dir) == PUBLISHED
    key = objects.key("agent-v1", "adapter_model.safetensors")
    before = objects.client.head_object(Bucket=objects.bucket, Key=key)["LastModified"]
    assert objects.upload("agent-v1", v1_dir) == PRESENT  # idempotent: nothing written again
    assert objects.client.head_object(Bucket=objects.bucket, Key=key)["LastModified"] == before
    assert objects.names() == {"agent-v1", "agent-v2"}

    replica = tmp_path / "replica-store"
    theirs = make_adapter(replica / "operators-own", seed=7, base=BASE)  # not ours: never touched
    first = sync(bucket, s3_server, replica)
    assert first.returncode == 0, first.stderr
    assert "downloaded agent-v1" in first.stdout and "downloaded agent-v2" in first.stdout
    resolver = FilesystemResolver(replica)
    for name, source, version in (("agent-v1", v1_dir, v1), ("agent-v2", v2_dir, v2)):
        assert resolver.resolve(BASE, name) == os.path.realpath(replica / name)
        assert (replica / name / "adapter_model.safetensors").read_bytes() == (
            source / "adapter_model.safetensors"
        ).read_bytes()
        assert AdapterStore(replica, BASE).is_current(name, version)
    again = sync(bucket, s3_server, replica)
    assert again.returncode == 0 and "downloaded" not in again.stdout  # already whole: nothing fetched

    assert objects.remove("agent-v2") is True and objects.remove("agent-v2") is False
    third = sync(bucket, s3_server, replica)
    assert third.returncode == 0 and "removed agent-v2" in third.stdout
    assert not (replica / "agent-v2").exists() and resolver.resolve(BASE, "agent-v2") is None
    assert (replica / "agent-v1").is_dir() and (theirs / "adapter_config.json").is_file()
    assert leftovers(replica) == []


def test_a_damaged_or_half_uploaded_adapter_never_lands(s3_server: str, bucket: str, tmp_path: Path) -> None:
    objects = ObjectStore(bucket, endpoint_url=s3_server)
    v1_dir, _ = published_copy(tmp_path / "promoter", "agent-v1", 1, tmp_path)
    objects.upload("agent-v1", v1_dir)
    # The weights object changed under the manifest (a damaged object, or a writer racing).
    objects.client.put_object(
        Bucket=objects.bucket, Key=objects.key("agent-v1", "adapter_model.safetensors"), Body=b"\x00" * 64
    )
    # A second upload cut short: its weights and manifest, but no config (written last).
    v2_dir, _ = published_copy(tmp_path / "promoter", "agent-v2", 2, tmp_path)
    for file in ("adapter_model.safetensors", MANIFEST):
        objects.client.put_object(
            Bucket=objects.bucket, Key=objects.key("agent-v2", file), Body=(v2_dir / file).read_bytes()
        )
    assert objects.names() == {"agent-v1"}

    replica = tmp_path / "replica"
    result = sync(bucket, s3_server, replica)
    assert result.returncode == 1
    assert "agent-v1" in result.stderr and "does not match its manifest" in result.stderr
    assert not (replica / "agent-v1").exists() and not (replica / "agent-v2").exists()
    assert leftovers(replica) == []


def test_the_promotion_job_keeps_the_bucket_in_step(
    s3_server: str, bucket: str, db, database_url: str, tmp_path: Path
) -> None:
    store_dir = tmp_path / "store"
    policy = PolicySettings(
        name="agent",
        base_model="trained-from",
        endpoints=["http://127.0.0.1:9/v1"],
        promotion={
            "unload_grace_s": 60,
            "adapter_store": {
                "path": str(store_dir),
                "base_model": BASE,
                "s3": {"url": bucket, "endpoint_url": s3_server},
            },
        },
    )
    v1 = add_candidate(db, "agent", 1, make_adapter(tmp_path / "v1", seed=1))
    v2 = add_candidate(db, "agent", 2, make_adapter(tmp_path / "v2", seed=2))
    objects = ObjectStore(bucket, endpoint_url=s3_server)

    async def scenario() -> dict[str, Any]:
        engine = make_async_engine(database_url)
        try:
            await lifecycle.promote(engine, v1, actor="admin")  # promoted elsewhere (no store step)
            first = await reconcile.sync_adapter_store(engine, policy)
            await lifecycle.promote(engine, v2, actor="admin")  # v1 retired
            within = await reconcile.sync_adapter_store(engine, policy)
            in_grace = objects.names()
            after = await reconcile.sync_adapter_store(
                engine, policy, now=await clock.database_now(engine) + timedelta(seconds=61)
            )
            return {"first": first, "within": within, "after": after, "in_grace": in_grace}
        finally:
            await engine.dispose()

    reports = asyncio.run(scenario())
    assert reports.pop("in_grace") == {"agent-v1", "agent-v2"}  # retired, but within the grace
    assert not any(r.errors for r in reports.values()), [r.errors for r in reports.values()]
    first = {(a["version"], a["action"]) for a in reports["first"].actions}
    assert first == {("agent-v1", "published"), ("agent-v1", "uploaded")}
    assert ("agent-v2", "uploaded") in {(a["version"], a["action"]) for a in reports["within"].actions}
    assert objects.names() == {"agent-v2"} and sorted(p.name for p in store_dir.iterdir()) == ["agent-v2"]
    unpublished = [a["detail"] for a in reports["after"].actions if a["action"] == "unpublished"]
    assert len(unpublished) == 2 and all("agent-v1" in d for d in unpublished)
