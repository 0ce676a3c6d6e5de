"""What a power loss would leave on disk: each file's bytes and each directory's names as of
their last fsync, nothing written since.

A process killed after a rename leaves the page cache intact, so reading the files back proves
nothing about durability. `PowerLoss` records, at every `os.fsync`, what that call made durable
(a file's bytes, a directory's names, keyed by inode since renames keep inodes), stops the code
under test with `Crash` right after a chosen rename (the crash point), and rebuilds the tree a
machine would find on reboot if the rename itself had reached the disk (the worst case: the name
is there, its contents are whatever was fsynced).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


class Crash(BaseException):
    """The simulated power loss (a BaseException, like a kill: cleanup code does not run)."""


class PowerLoss:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.file_bytes: dict[int, bytes] = {}
        self.directory_names: dict[int, dict[str, int]] = {}
        self.renamed: Path | None = None
        real_fsync = os.fsync

        def recording_fsync(descriptor: Any) -> None:
            number = descriptor if isinstance(descriptor, int) else descriptor.fileno()
            real_fsync(number)
            path = Path(os.readlink(f"/proc/self/fd/{number}"))
            info = os.fstat(number)
            if stat.S_ISDIR(info.st_mode):
                self.directory_names[info.st_ino] = {entry.name: entry.inode() for entry in os.scandir(path)}
            else:
                self.file_bytes[info.st_ino] = path.read_bytes()

        monkeypatch.setattr(os, "fsync", recording_fsync)
        self._monkeypatch = monkeypatch

    def crash_after_rename(self, function_name: str = "replace") -> None:
        """Crash right after the next `os.<function_name>` (os.replace, os.rename) succeeds."""
        real: Callable[..., None] = getattr(os, function_name)

        def rename_then_crash(source: Any, target: Any, *args: Any, **kwargs: Any) -> None:
            real(source, target, *args, **kwargs)
            self.renamed = Path(target)
            raise Crash(f"power lost after {function_name}({source}, {target})")

        self._monkeypatch.setattr(os, function_name, rename_then_crash)

    def rebuild(self, directory: Path, into: Path) -> Path:
        """The tree at `directory` as the disk holds it after the crash, written under `into`.

        A name its directory never fsynced is absent; a file never fsynced is empty (its inode
        may exist, its data was only in the page cache)."""
        into.mkdir(parents=True)
        names = self.directory_names.get(os.stat(directory).st_ino, {})
        for name, inode in names.items():
            source = directory / name
            if source.is_dir():
                self.rebuild(source, into / name)
            else:
                (into / name).write_bytes(self.file_bytes.get(inode, b""))
        return into
