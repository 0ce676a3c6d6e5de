"""Write one benchmark's results into its own section of docs/benchmarks.md.

Each benchmark owns a `## <title>` section; running it again replaces that section and
leaves the others as they are, so the file always holds the latest figures of each.
"""

from __future__ import annotations

import platform
import re
import subprocess
import time
from pathlib import Path

REPORT_PATH = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
HEADER = "# Benchmarks\n\nWritten by the scripts under `bench/`; each section names the command that made it.\n"


def machine_line() -> str:
    """Where and when the figures were measured: they mean little without it."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=REPORT_PATH.parent.parent,
            check=False,
        ).stdout.strip()
    except OSError:
        commit = "unknown"
    import os

    return (
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} CPU cores, "
        f"{platform.system()} {platform.machine()}, Python {platform.python_version()}, "
        f"commit {commit or 'unknown'}."
    )


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_section(title: str, body: str, path: Path = REPORT_PATH) -> None:
    """Replace (or append) the section `## title` with `body`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = path.read_text() if path.exists() else HEADER
    section = f"## {title}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text.rstrip("\n") + "\n")
