"""The shared adapter store: serving adapter versions in the layout vLLM's filesystem resolver reads.

vLLM's `lora_filesystem_resolver` plugin (enabled with `VLLM_PLUGINS=lora_filesystem_resolver`,
`VLLM_LORA_RESOLVER_CACHE_DIR=<dir>` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`) answers a
request for a model name it does not serve by looking for `<dir>/<name>/adapter_config.json`
whose `peft_type` is `"LORA"` and whose `base_model_name_or_path` equals the server's `--model`,
and then loads that directory. Publishing every canary and promoted version there under the
name the gateway sends as `model` (the version's name) lets a replica that starts or restarts
serve them with no call from the promotion job.

Why a copy and not the learner's directory: the resolver's base-model check needs the name the
inference servers were started with, which is not always the one the learner trained from,
and the copy is written so that a replica never reads half an adapter:

- the source is checked first (`files.adapter_files_problem`): nothing corrupt is published;
- the copy is written under a temporary name in the target's own directory (`.apprentice-tmp-*`,
  one rename away, on the same filesystem), every file fsynced, `adapter_config.json` written
  last (a temporary directory without it is never a match for the resolver), checked again,
  then renamed into place and the directory fsynced;
- a manifest (`.apprentice-published.json`: the version id, the base model, each file's
  SHA-256) makes publishing idempotent (a whole copy of the same version is left alone) and
  marks what this store may remove: a directory without it (an operator's own adapter) is
  never deleted;
- removal renames the directory away first (`.apprentice-trash-*`), so the name disappears at
  once and a resolver never finds a directory half deleted.

Everything here is blocking file I/O; the promotion code calls it through `asyncio.to_thread`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import stat
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apprentice.durable_files import fsync_directory
from apprentice.promotion.files import ADAPTER_CONFIG, adapter_files_problem
from apprentice.promotion.loading import LoadError
from apprentice.settings import PolicySettings

log = logging.getLogger(__name__)

MANIFEST = ".apprentice-published.json"
TEMP_PREFIX = ".apprentice-tmp-"
TRASH_PREFIX = ".apprentice-trash-"
CHUNK = 1024 * 1024

PRESENT, PUBLISHED, REPLACED = "present", "published", "replaced"

__all__ = ["MANIFEST", "PRESENT", "PUBLISHED", "REPLACED", "AdapterStore", "PublishError"]


class PublishError(LoadError):
    """A version could not be published to the adapter store.

    A LoadError, so that every caller that handles a failed load (the promotion tick, the
    admin API's 502) handles this the same way: the version does not start serving.
    `permanent`: the source itself is unusable (retrying cannot help)."""

    def __init__(self, name: str, store: Path, reason: str, *, permanent: bool) -> None:
        super().__init__(name, {f"adapter store {store}": reason}, "publish", permanent=permanent)
        self.args = (f"could not publish adapter {name!r} to the adapter store {store}: {reason}",)


def _copy_file(source: Path, target: Path) -> str:
    """Copy `source` to `target` (fsynced); the SHA-256 of what was written."""
    digest = hashlib.sha256()
    with source.open("rb") as reader, target.open("xb") as writer:
        while chunk := reader.read(CHUNK):
            digest.update(chunk)
            writer.write(chunk)
        writer.flush()
        os.fsync(writer.fileno())
    return digest.hexdigest()


def _write_file(target: Path, data: bytes) -> str:
    with target.open("xb") as writer:
        writer.write(data)
        writer.flush()
        os.fsync(writer.fileno())
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class AdapterStore:
    """One store directory and the base-model name its adapters are published for."""

    root: Path
    base_model: str

    @classmethod
    def for_policy(cls, policy: PolicySettings) -> AdapterStore | None:
        """The policy's store (`promotion.adapter_store`); None when it has none."""
        settings = policy.promotion.adapter_store
        if settings is None:
            return None
        return cls(Path(settings.path), settings.base_model or policy.base_model)

    # ------------------------------------------------------------ names

    def location(self, name: str) -> Path:
        """Where adapter `name` lives: `<root>/<name>`, the path vLLM's resolver joins.

        A name with an empty part (absolute, `a//b`), or a part that starts with a dot (`.`,
        `..`, and this store's own temporary directories), is refused: a version's directory
        must be exactly where the resolver joins its name, inside the store."""
        parts = name.split("/")
        if "\\" in name or any(not part or part.startswith(".") for part in parts):
            raise ValueError(f"adapter name {name!r} cannot be a directory of the adapter store")
        return self.root.joinpath(*parts)

    def manifest(self, name: str) -> dict[str, Any] | None:
        """The manifest of the published copy of `name`; None when there is none (or unreadable)."""
        try:
            document = json.loads((self.location(name) / MANIFEST).read_bytes())
        except (OSError, ValueError):
            return None
        return document if isinstance(document, dict) else None

    def is_current(self, name: str, version_id: uuid.UUID | str) -> bool:
        """True when `<root>/<name>` is a whole copy of this version, published for this base model."""
        manifest = self.manifest(name)
        if manifest is None or manifest.get("version_id") != str(version_id):
            return False
        try:
            return manifest.get("base_model") == self.base_model and adapter_files_problem(self.location(name)) is None
        except OSError:  # removed while being read
            return False

    def holds(self, name: str) -> bool:
        """Whether anything is published under `name`."""
        return self.location(name).exists()

    # ------------------------------------------------------------ publish

    def publish(self, name: str, source: str | Path, version_id: uuid.UUID | str) -> str:
        """Publish the adapter at `source` as `<root>/<name>`: PRESENT (already there, whole),
        PUBLISHED, or REPLACED (another copy was under the name). Raises PublishError."""
        target = self.location(name)
        if self.is_current(name, version_id):
            return PRESENT
        if (problem := adapter_files_problem(source)) is not None:
            raise PublishError(name, self.root, f"the adapter's files are not whole: {problem}", permanent=True)
        source_dir = Path(source)
        try:
            config = json.loads((source_dir / ADAPTER_CONFIG).read_bytes())
            target.parent.mkdir(parents=True, exist_ok=True)
            temporary = target.parent / f"{TEMP_PREFIX}{target.name}-{uuid.uuid4().hex[:12]}"
            temporary.mkdir()
        except OSError as exc:
            raise PublishError(name, self.root, f"{type(exc).__name__}: {exc}", permanent=False) from exc
        try:
            self._write_copy(temporary, source_dir, config, name, version_id)
            if (problem := adapter_files_problem(temporary)) is not None:
                raise PublishError(name, self.root, f"the copy is not whole: {problem}", permanent=False)
            outcome = self._move_into_place(temporary, target, name, version_id)
        except OSError as exc:
            raise PublishError(name, self.root, f"{type(exc).__name__}: {exc}", permanent=False) from exc
        finally:
            shutil.rmtree(temporary, ignore_errors=True)
        log.info("adapter store: %s %s as %s (base model %s)", outcome, source_dir, target, self.base_model)
        return outcome

    def _write_copy(
        self, temporary: Path, source: Path, config: dict[str, Any], name: str, version_id: uuid.UUID | str
    ) -> None:
        """Every top-level file of the adapter, then the manifest, then adapter_config.json last."""
        digests: dict[str, str] = {}
        for item in sorted(source.iterdir()):
            if item.name in (ADAPTER_CONFIG, MANIFEST) or not item.is_file():
                continue
            digests[item.name] = _copy_file(item, temporary / item.name)
        published = {**config, "peft_type": "LORA", "base_model_name_or_path": self.base_model}
        config_bytes = json.dumps(published, indent=2, sort_keys=True).encode()
        digests[ADAPTER_CONFIG] = hashlib.sha256(config_bytes).hexdigest()
        manifest = {
            "name": name,
            "version_id": str(version_id),
            "base_model": self.base_model,
            "source": str(source),
            "files": digests,
            "published_at": time.time(),
        }
        _write_file(temporary / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True).encode())
        _write_file(temporary / ADAPTER_CONFIG, config_bytes)
        fsync_directory(temporary)

    def _move_into_place(
        self, temporary: Path, target: Path, name: str, version_id: uuid.UUID | str, attempts: int = 5
    ) -> str:
        """Rename the finished copy to `target`, moving a stale copy of ours out of the way first.

        Another publisher may put its copy in between (rename onto a non-empty directory fails):
        if that copy is this version it stands (PRESENT), otherwise the stale one goes again."""
        outcome = PUBLISHED
        for attempt in range(1, attempts + 1):
            if target.exists():
                if self.is_current(name, version_id):
                    return PRESENT
                foreign = _unpublished(target)
                if foreign is None:
                    continue  # another publisher moved it meanwhile: look again
                if foreign:
                    reason = f"{target} exists and was not published by Apprentice (no {MANIFEST}); not replaced"
                    raise PublishError(name, self.root, reason, permanent=True)
                # Ours but stale (another version, another base model, or damaged): out of the way first.
                self._discard(target)
                outcome = REPLACED
            try:
                temporary.rename(target)
            except OSError:
                if attempt == attempts:
                    raise
                continue
            fsync_directory(target.parent)
            return outcome
        raise OSError(f"{target} kept changing under other publishers for {attempts} attempts")

    # ------------------------------------------------------------ remove

    def remove(self, name: str) -> bool:
        """Remove the published copy of `name`; False when there was none. A directory this store
        did not publish (no manifest) is refused with PublishError, never deleted."""
        target = self.location(name)
        if not target.exists():
            return False
        if not (target / MANIFEST).is_file():
            reason = f"{target} was not published by Apprentice (no {MANIFEST}); not removed"
            raise PublishError(name, self.root, reason, permanent=True)
        try:
            self._discard(target)
        except OSError as exc:
            raise PublishError(name, self.root, f"{type(exc).__name__}: {exc}", permanent=False) from exc
        log.info("adapter store: removed %s", target)
        return True

    def _discard(self, target: Path) -> None:
        """Rename away (the name is gone at once), fsync the directory, then delete."""
        trash = target.parent / f"{TRASH_PREFIX}{target.name}-{uuid.uuid4().hex[:12]}"
        try:
            target.rename(trash)
        except FileNotFoundError:  # another process discarded it first
            return
        fsync_directory(target.parent)
        if trash.is_dir():
            shutil.rmtree(trash, ignore_errors=True)
        else:
            trash.unlink(missing_ok=True)

    def sweep(self, older_than_s: float = 3600.0) -> list[Path]:
        """Delete temporary and trash directories a killed publisher left, older than `older_than_s`."""
        if not self.root.is_dir():
            return []
        cutoff = time.time() - older_than_s
        removed = []
        for pattern in (f"{TEMP_PREFIX}*", f"{TRASH_PREFIX}*"):
            for leftover in self.root.rglob(pattern):
                with contextlib.suppress(OSError):
                    if leftover.lstat().st_mtime < cutoff:
                        shutil.rmtree(leftover, ignore_errors=True)
                        removed.append(leftover)
        return removed


def _unpublished(target: Path) -> bool | None:
    """Whether the directory at `target` is not one of ours (no manifest); None when it was moved or
    replaced while looked at (another publisher's rename), so that a copy in the middle of being
    swapped is never taken for someone else's. One directory stays one inode across the look."""
    try:
        before = target.stat()
        if not stat.S_ISDIR(before.st_mode):
            return False  # a file under the name: _discard clears it as it clears a stale copy
        has_manifest = (target / MANIFEST).exists()
        after = target.stat()
    except FileNotFoundError:
        return None
    if (before.st_ino, before.st_dev) != (after.st_ino, after.st_dev):
        return None
    return not has_manifest
