"""Whether an adapter version's files are whole, read without torch (the promotion job's check).

Why here and not only at the endpoint: an inference server answers a load of a broken
adapter with its own error (vLLM: 404 for a missing directory, 400 for a file it cannot
parse), and only after the version was chosen to serve. Checking the files where the learner
wrote them gives the gate a reason that names the file and what is wrong with it, before any
endpoint is touched. Only the process that runs the promotion job (the learner's host, which
shares the adapters volume with the inference servers) checks; a gateway without the volume
never does.

A safetensors file is checked the way its format defines it: an 8-byte little-endian header
length, a JSON header, and tensor data that reaches every offset the header names (a file
cut short by a kill or a full disk fails here). PEFT's `.bin` weights are only checked for
presence and size.
"""

from __future__ import annotations

import json
import stat
import struct
from pathlib import Path
from typing import Any

ADAPTER_CONFIG = "adapter_config.json"
SAFETENSORS = "adapter_model.safetensors"
PICKLED = "adapter_model.bin"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit


def adapter_files_problem(path: str | Path) -> str | None:
    """What is wrong with the PEFT adapter at `path`, in words; None when it looks whole."""
    directory = Path(path)
    try:  # one stat: a name being replaced is either absent or there, never "not a directory" by a race
        is_directory = stat.S_ISDIR(directory.stat().st_mode)
    except FileNotFoundError:
        return f"{directory} does not exist"
    if not is_directory:
        return f"{directory} is not a directory"
    problem = _config_problem(directory / ADAPTER_CONFIG)
    if problem is not None:
        return problem
    weights = directory / SAFETENSORS
    if weights.is_file():
        return _safetensors_problem(weights)
    pickled = directory / PICKLED
    if pickled.is_file():
        return f"{pickled} is empty" if pickled.stat().st_size == 0 else None
    return f"no {SAFETENSORS} or {PICKLED} in {directory}"


def _config_problem(config: Path) -> str | None:
    try:
        document: Any = json.loads(config.read_bytes())
    except FileNotFoundError:
        return f"{config} is missing"
    except (OSError, ValueError) as exc:
        return f"{config} is not readable JSON: {exc}"
    if not isinstance(document, dict):
        return f"{config} is not a JSON object"
    if str(document.get("peft_type", "LORA")).upper() != "LORA":
        return f"{config}: peft_type {document.get('peft_type')!r} is not LORA"
    if not isinstance(document.get("r", 8), int):
        return f"{config}: rank r={document.get('r')!r} is not an integer"
    return None


def _safetensors_problem(weights: Path) -> str | None:
    size = weights.stat().st_size
    try:
        with weights.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                return f"{weights} is truncated ({size} bytes: no header)"
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
                return f"{weights} is truncated or corrupt (header of {header_len} bytes in a file of {size})"
            header = json.loads(handle.read(header_len))
    except (OSError, ValueError) as exc:
        return f"{weights} has an unreadable header: {exc}"
    if not isinstance(header, dict):
        return f"{weights} has a header that is not a JSON object"
    ends = [
        entry["data_offsets"][1]
        for name, entry in header.items()
        if name != "__metadata__" and isinstance(entry, dict) and len(entry.get("data_offsets") or ()) == 2
    ]
    if not ends:
        return f"{weights} holds no tensors"
    needed = 8 + header_len + max(ends)
    if size < needed:
        return f"{weights} is truncated ({size} of {needed} bytes)"
    return None
