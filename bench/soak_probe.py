"""What the soak samples every minute: process memory and descriptors, directory sizes, and
PostgreSQL's table and index sizes with row counts.

Read from outside, the way an operator would see them (/proc, the filesystem, the database's
catalog), so that a leak shows up whatever the process does internally.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psutil


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants (uvicorn workers, say); empty once it has exited."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of the process tree: what the machine actually gives it."""
    total = 0
    for proc in process_tree(pid):
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


def tree_open_fds(pid: int) -> int:
    """Open file descriptors of the process tree, counted in /proc/<pid>/fd (sockets, files, pipes)."""
    total = 0
    for proc in process_tree(pid):
        try:
            total += len(os.listdir(f"/proc/{proc.pid}/fd"))
        except OSError:
            pass  # exited meanwhile
    return total


def directory_bytes(path: Path) -> int:
    """Bytes of the regular files under `path` (0 when it does not exist yet)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass  # shipped and removed meanwhile (journal segments)
    return total


RELATIONS_SQL = """
SELECT c.relname, c.relkind,
       pg_total_relation_size(c.oid) AS total_bytes,
       pg_relation_size(c.oid) AS own_bytes,
       t.relname AS table_name
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_index i ON i.indexrelid = c.oid
LEFT JOIN pg_class t ON t.oid = i.indrelid
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'i')
ORDER BY c.relname
"""


def database_sizes(conn: Any) -> dict[str, float]:
    """Per table: total bytes (heap, TOAST and indexes: pg_total_relation_size), heap bytes
    (pg_relation_size) and exact row count; per index: its bytes (pg_relation_size).
    Keys are series names: `table <name> total bytes`, `index <name> bytes`, ..."""
    series: dict[str, float] = {}
    tables = []
    for name, kind, total_bytes, own_bytes, table_name in conn.execute(RELATIONS_SQL).fetchall():
        if kind == "i":
            series[f"index {name} ({table_name}) bytes"] = float(own_bytes)
        else:
            tables.append(name)
            series[f"table {name} total bytes"] = float(total_bytes)
            series[f"table {name} heap bytes"] = float(own_bytes)
    (database_bytes,) = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    series["database total bytes"] = float(database_bytes)
    for name in tables:
        # Exact counts: the tables stay in the hundreds of thousands of rows over a soak, a
        # sequential count takes milliseconds, and n_live_tup lags behind autovacuum.
        (count,) = conn.execute(f'SELECT count(*) FROM "{name}"').fetchone()
        series[f"table {name} rows"] = float(count)
    return series
