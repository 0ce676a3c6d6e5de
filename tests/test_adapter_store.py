"""The shared adapter store on its own: layout, atomic publishing, idempotency, removal.

Real files in a temporary directory; the resolver these copies are for is vLLM's filesystem
resolver, mirrored by `learner/serving/resolver.py` (torch-free), which checks each copy here.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import time
import uuid
from pathlib import Path

import pytest

from apprentice.promotion.adapter_store import MANIFEST, PRESENT, PUBLISHED, REPLACED, AdapterStore, PublishError
from apprentice.promotion.files import adapter_files_problem
from apprentice.settings import PolicySettings
from learner.serving.resolver import FilesystemResolver

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"


def make_adapter(directory: Path, seed: int = 1, base: str = "/trainer/models/smol", size: int = 4096) -> Path:
    """A PEFT-shaped adapter: a LoRA config naming the trainer's base, one tensor of `size` floats."""
    directory.mkdir(parents=True)
    config = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "base_model_name_or_path": base, "target_modules": ["q"]}
    (directory / "adapter_config.json").write_text(json.dumps(config))
    header = json.dumps({"q.lora_A.weight": {"dtype": "F32", "shape": [size], "data_offsets": [0, 4 * size]}})
    payload = bytes((seed + i) % 251 for i in range(4 * size))
    (directory / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header.encode() + payload)
    (directory / "README.md").write_text(f"adapter {seed}\n")
    return directory


def leftovers(root: Path) -> list[Path]:
    """Temporary and trash directories (what a publish or a removal must not leave behind)."""
    return [*root.rglob(".apprentice-tmp-*"), *root.rglob(".apprentice-trash-*")]


@pytest.fixture
def store(tmp_path: Path) -> AdapterStore:
    return AdapterStore(tmp_path / "store", BASE)


def test_publish_writes_the_layout_the_resolver_reads(store: AdapterStore, tmp_path: Path) -> None:
    source = make_adapter(tmp_path / "learner" / "agent-v1")
    version = uuid.uuid4()
    assert store.publish("agent-v1", source, version) == PUBLISHED

    target = store.root / "agent-v1"
    config = json.loads((target / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == BASE and config["peft_type"] == "LORA"
    assert config["r"] == 8 and config["target_modules"] == ["q"]  # the rest of the config as trained
    weights = (target / "adapter_model.safetensors").read_bytes()
    assert weights == (source / "adapter_model.safetensors").read_bytes()
    assert (target / "README.md").read_text() == "adapter 1\n"
    manifest = json.loads((target / MANIFEST).read_text())
    assert manifest["version_id"] == str(version) and manifest["base_model"] == BASE
    assert set(manifest["files"]) == {"adapter_config.json", "adapter_model.safetensors", "README.md"}
    # The learner's own copy is untouched, and nothing temporary is left.
    assert json.loads((source / "adapter_config.json").read_text())["base_model_name_or_path"] == "/trainer/models/smol"
    assert leftovers(store.root) == []
    # vLLM's resolver finds it for the base the servers run, and for no other.
    resolver = FilesystemResolver(store.root)
    assert resolver.resolve(BASE, "agent-v1") == os.path.realpath(target)
    assert resolver.resolve("/trainer/models/smol", "agent-v1") is None
    assert store.is_current("agent-v1", version)


def test_publishing_again_is_idempotent(store: AdapterStore, tmp_path: Path) -> None:
    source = make_adapter(tmp_path / "v1")
    version = uuid.uuid4()
    assert store.publish("agent-v1", source, version) == PUBLISHED
    target = store.root / "agent-v1"
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in target.iterdir()}
    directory_inode = target.stat().st_ino
    for _ in range(3):
        assert store.publish("agent-v1", source, version) == PRESENT
    assert target.stat().st_ino == directory_inode
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in target.iterdir()} == before


def test_a_stale_or_damaged_copy_is_replaced(store: AdapterStore, tmp_path: Path) -> None:
    first, second = make_adapter(tmp_path / "a", seed=1), make_adapter(tmp_path / "b", seed=2)
    old, new = uuid.uuid4(), uuid.uuid4()
    store.publish("agent-v1", first, old)
    # The name now stands for another version (a database restored from a backup, a reused name).
    assert store.publish("agent-v1", second, new) == REPLACED
    target = store.root / "agent-v1"
    assert (target / "adapter_model.safetensors").read_bytes() == (second / "adapter_model.safetensors").read_bytes()
    assert store.is_current("agent-v1", new) and not store.is_current("agent-v1", old)

    # The servers' base model changed in the settings: published again for the new name.
    moved = AdapterStore(store.root, "/models/smol")
    assert moved.publish("agent-v1", second, new) == REPLACED
    assert json.loads((target / "adapter_config.json").read_text())["base_model_name_or_path"] == "/models/smol"

    # The copy was damaged on the volume (cut short): publishing repairs it.
    weights = target / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert not moved.is_current("agent-v1", new)
    assert moved.publish("agent-v1", second, new) == REPLACED
    assert adapter_files_problem(target) is None
    assert leftovers(store.root) == []


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (
            lambda d: (d / "adapter_model.safetensors").write_bytes(b"\x10\x00"),
            "adapter_model.safetensors is truncated",
        ),
        (
            lambda d: (d / "adapter_config.json").write_text('{"r": 8, "peft'),
            "adapter_config.json is not readable JSON",
        ),
        (lambda d: (d / "adapter_model.safetensors").unlink(), "no adapter_model.safetensors"),
        (lambda d: (d / "adapter_config.json").write_text('{"peft_type": "IA3"}'), "is not LORA"),
    ],
)
def test_corrupt_files_are_never_published(store: AdapterStore, tmp_path: Path, damage, words: str) -> None:
    source = make_adapter(tmp_path / "v1")
    damage(source)
    with pytest.raises(PublishError) as refused:
        store.publish("agent-v1", source, uuid.uuid4())
    assert refused.value.permanent and words in str(refused.value) and "agent-v1" in str(refused.value)
    assert not (store.root / "agent-v1").exists()
    assert leftovers(store.root) == []


def test_a_missing_source_is_refused(store: AdapterStore, tmp_path: Path) -> None:
    with pytest.raises(PublishError, match="does not exist"):
        store.publish("agent-v1", tmp_path / "never-written", uuid.uuid4())
    assert not (store.root / "agent-v1").exists()


def test_remove_takes_the_name_away_and_is_idempotent(store: AdapterStore, tmp_path: Path) -> None:
    store.publish("agent-v1", make_adapter(tmp_path / "v1"), uuid.uuid4())
    assert store.holds("agent-v1")
    assert store.remove("agent-v1") is True
    assert not (store.root / "agent-v1").exists() and not store.holds("agent-v1")
    assert store.remove("agent-v1") is False
    assert leftovers(store.root) == []
    assert FilesystemResolver(store.root).resolve(BASE, "agent-v1") is None


def test_an_operators_own_directory_is_never_replaced_or_removed(store: AdapterStore, tmp_path: Path) -> None:
    theirs = make_adapter(store.root / "agent-v1", seed=9)
    before = (theirs / "adapter_model.safetensors").read_bytes()
    with pytest.raises(PublishError, match="not published by Apprentice"):
        store.publish("agent-v1", make_adapter(tmp_path / "v1"), uuid.uuid4())
    with pytest.raises(PublishError, match="not removed"):
        store.remove("agent-v1")
    assert (theirs / "adapter_model.safetensors").read_bytes() == before
    assert leftovers(store.root) == []


@pytest.mark.parametrize(
    "name", ["", "/etc/agent-v1", "../agent-v1", "a/../../b", ".apprentice-tmp-x", "a/./b", "a//b", "a\\b"]
)
def test_names_the_resolver_could_not_reach_are_refused(store: AdapterStore, name: str) -> None:
    with pytest.raises(ValueError, match="cannot be a directory of the adapter store"):
        store.location(name)


def test_a_policy_name_with_a_slash_publishes_a_nested_directory(store: AdapterStore, tmp_path: Path) -> None:
    """vLLM joins the name to its directory as is: `acme/agent-v1` is `<dir>/acme/agent-v1`."""
    store.publish("acme/agent-v1", make_adapter(tmp_path / "v1"), uuid.uuid4())
    assert FilesystemResolver(store.root).resolve(BASE, "acme/agent-v1") == os.path.realpath(
        store.root / "acme" / "agent-v1"
    )
    assert store.remove("acme/agent-v1") and leftovers(store.root) == []


def test_a_killed_publishers_temporary_directory_is_never_resolved_and_is_swept(
    store: AdapterStore, tmp_path: Path
) -> None:
    """A publisher killed mid-copy leaves `.apprentice-tmp-*` without adapter_config.json (it is
    written last): no resolver matches it, and the sweep deletes it once it is old."""
    store.root.mkdir()
    stale = store.root / ".apprentice-tmp-agent-v1-0123456789ab"
    stale.mkdir()
    (stale / "adapter_model.safetensors").write_bytes(b"\x00" * 10)
    fresh = store.root / ".apprentice-tmp-agent-v2-0123456789ab"
    fresh.mkdir()
    assert FilesystemResolver(store.root).resolve(BASE, stale.name) is None
    old = time.time() - 7200
    os.utime(stale, (old, old))
    assert store.sweep(older_than_s=3600) == [stale]
    assert not stale.exists() and fresh.exists()  # one still being written is left alone


def test_concurrent_publishers_and_readers_never_see_half_an_adapter(store: AdapterStore, tmp_path: Path) -> None:
    """Two processes' worth of publishers race on one name while a reader polls it as a resolver
    would: the name is either absent or a whole adapter, never a partial one."""
    sources = [make_adapter(tmp_path / f"s{i}", seed=i, size=256 * 1024) for i in range(2)]
    versions = [uuid.uuid4(), uuid.uuid4()]
    problems: list[str] = []
    stop = threading.Event()

    reads = 0

    def read() -> None:
        nonlocal reads
        target = store.root / "agent-v1"
        while not stop.is_set():
            try:
                before = target.stat().st_ino  # the copy under the name when the reads start
                config = json.loads((target / "adapter_config.json").read_bytes())
                problem = adapter_files_problem(target)
                same_copy = target.stat().st_ino == before
            except FileNotFoundError:  # absent, or removed while read: never a partial adapter
                continue
            except (OSError, ValueError) as exc:  # a half-written config
                problems.append(repr(exc))
                continue
            if not same_copy:
                continue  # swapped for another whole copy between the reads: they read two copies
            reads += 1
            if problem is not None:  # the same copy stayed in place throughout: a partial adapter
                problems.append(problem)
            if config.get("base_model_name_or_path") != BASE:
                problems.append(f"config not rewritten: {config}")

    def publish(index: int) -> None:
        try:
            for turn in range(6):
                which = (index + turn) % 2
                store.publish("agent-v1", sources[which], versions[which])
        except Exception as exc:  # noqa: BLE001 - the test fails on it below
            problems.append(f"publisher {index}: {exc!r}")

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=publish, args=(i,)) for i in range(2)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    stop.set()
    reader.join()
    assert problems == []
    assert reads > 0
    assert adapter_files_problem(store.root / "agent-v1") is None
    assert leftovers(store.root) == []


def test_the_store_of_a_policy_comes_from_its_promotion_settings(tmp_path: Path) -> None:
    plain = PolicySettings(name="agent", base_model=BASE, endpoints=["http://x/v1"])
    assert AdapterStore.for_policy(plain) is None
    policy = PolicySettings(
        name="agent", base_model=BASE, endpoints=["http://x/v1"], promotion={"adapter_store": {"path": str(tmp_path)}}
    )
    assert AdapterStore.for_policy(policy) == AdapterStore(tmp_path, BASE)
    served = PolicySettings(
        name="agent",
        base_model=BASE,
        endpoints=["http://x/v1"],
        promotion={"adapter_store": {"path": str(tmp_path), "base_model": "/models/smol"}},
    )
    assert AdapterStore.for_policy(served) == AdapterStore(tmp_path, "/models/smol")
    with pytest.raises(ValueError, match="extra"):
        PolicySettings(
            name="agent", base_model=BASE, promotion={"adapter_store": {"path": str(tmp_path), "bucket": "x"}}
        )


def test_a_version_name_the_store_cannot_hold_fails_its_publish_permanently(tmp_path: Path) -> None:
    """A policy named `.hidden` has versions `.hidden-vN`, which no store directory may be: the
    version must not start serving (a permanent PublishError, which callers treat as a failed
    load), rather than a ValueError that aborts the promotion job's pass for the policy."""
    import asyncio
    import uuid
    from datetime import datetime, timezone

    from apprentice.promotion.adapter_store import PublishError
    from apprentice.promotion.lifecycle import VersionStatus
    from apprentice.promotion.rows import AdapterVersion
    from apprentice.promotion.serving import _publish

    policy = PolicySettings(
        name=".hidden",
        base_model=BASE,
        endpoints=["http://x/v1"],
        promotion={"adapter_store": {"path": str(tmp_path / "store")}},
    )
    now = datetime.now(timezone.utc)
    version = AdapterVersion(
        id=uuid.uuid4(), policy=".hidden", version=1, name=".hidden-v1", status=VersionStatus.CANDIDATE,
        base_model=BASE, path=str(make_adapter(tmp_path / "learner" / ".hidden-v1")), parent_version_id=None,
        training_run_id=None, rank=8, alpha=16.0, target_modules=None, canary_share=None, gates={}, evaluation={},
        files_deleted_at=None, created_at=now, updated_at=now,
    )  # fmt: skip
    with pytest.raises(PublishError) as raised:
        asyncio.run(_publish(policy, version))
    assert raised.value.permanent and "cannot be a directory of the adapter store" in str(raised.value)


def test_a_published_copy_survives_a_power_loss_right_after_its_rename(
    store: AdapterStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.power_loss import Crash, PowerLoss

    source = make_adapter(tmp_path / "learner" / "agent-v1")
    disk = PowerLoss(monkeypatch)
    disk.crash_after_rename("rename")
    with pytest.raises(Crash):
        store.publish("agent-v1", source, uuid.uuid4())

    assert disk.renamed == store.root / "agent-v1"
    after_reboot = disk.rebuild(disk.renamed, tmp_path / "after-reboot")
    assert adapter_files_problem(after_reboot) is None
    assert sorted(p.name for p in after_reboot.iterdir()) == sorted(p.name for p in disk.renamed.iterdir())
    for item in disk.renamed.iterdir():
        assert (after_reboot / item.name).read_bytes() == item.read_bytes(), item.name
