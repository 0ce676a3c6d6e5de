"""Files that survive a crash: fsync before a rename makes them visible under a real name.

A rename is atomic for readers, but not durable on its own: after a power loss or a kernel
crash, the new name can point at files whose data never reached the disk (empty or cut short),
because the page cache is written back in no particular order. Fsyncing every file, then the
directory that holds them, before the rename, and the parent directory after it, makes the
renamed directory whole or absent after a crash, never half written. The learner's adapter
files (learner/grpo/adapters.py) and the adapter store's copies
(apprentice/promotion/adapter_store.py) both go through here.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_directory", "fsync_file", "fsync_tree"]


def fsync_file(path: Path) -> None:
    """Flush one file's data and metadata to the disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_directory(path: Path) -> None:
    """Flush a directory's entries (the names created, renamed or removed in it) to the disk."""
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_tree(root: Path) -> None:
    """Fsync every file under `root`, then every directory, deepest first, `root` last."""
    directories: list[Path] = []
    for current, subdirectories, files in os.walk(root):
        base = Path(current)
        for name in files:
            fsync_file(base / name)
        directories.append(base)
        del subdirectories  # os.walk descends into them by itself
    for directory in reversed(directories):
        fsync_directory(directory)
