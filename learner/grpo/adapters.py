"""LoRA adapters as files: create or continue one for training, save it in a form vLLM loads.

vLLM (and `apprentice serve-model`, which checks adapters the same way) accepts PEFT's
`save_pretrained` output: `adapter_config.json` + `adapter_model.safetensors`, a rank within
its allowed set and `--max-lora-rank`, no `modules_to_save`, no DoRA. Only the LoRA matrices
are trained (no embeddings, no biases), so every adapter we write satisfies that; `save_adapter`
checks it anyway before the file can reach a server.

Writes are atomic and durable: files go to a temporary sibling directory, every file and the
directory are fsynced, and only then is it renamed into place (and the parent fsynced), so a run
killed while saving, or a machine that loses power just after, leaves no half-written adapter
under a real name (apprentice/durable_files.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from apprentice.durable_files import fsync_directory, fsync_tree
from apprentice.settings import VLLM_LORA_RANKS

TRAINABLE_ADAPTER = "default"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
TMP_PREFIX = ".tmp-"


class AdapterFormatError(ValueError):
    """The adapter would be refused by vLLM."""


def new_lora(base_model: Any, rank: int, alpha: float, target_modules: Sequence[str], dropout: float = 0.0) -> Any:
    """A fresh trainable LoRA on `base_model` (B = 0: it starts out as the base model exactly)."""
    from peft import LoraConfig, get_peft_model

    if rank not in VLLM_LORA_RANKS:
        raise AdapterFormatError(f"LoRA rank {rank} is not one vLLM accepts: {list(VLLM_LORA_RANKS)}")
    # peft annotates lora_alpha as int, but only ever divides it by r (and vLLM does the same with the
    # saved config): a float alpha, which the settings allow, is valid and is kept as given.
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,  # type: ignore[arg-type]
        lora_dropout=dropout,
        target_modules=list(target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base_model, config, adapter_name=TRAINABLE_ADAPTER)
    only_lora_trainable(model)
    return model


def continue_lora(base_model: Any, path: str | os.PathLike[str]) -> Any:
    """The adapter saved at `path`, loaded trainable: a run continues from the promoted version."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(base_model, str(path), adapter_name=TRAINABLE_ADAPTER, is_trainable=True)
    only_lora_trainable(model)
    return model


def only_lora_trainable(model: Any) -> None:
    """Exactly the trainable adapter's LoRA matrices require grad (peft's set_adapter also toggles these)."""
    marker = f".{TRAINABLE_ADAPTER}."
    for name, param in model.named_parameters():
        param.requires_grad = "lora_" in name and marker in name


@contextlib.contextmanager
def using_version(model: Any, name: str, path: str | os.PathLike[str]) -> Iterator[Any]:
    """Temporarily activate another saved version (e.g. to recompute behaviour logprobs)."""
    model.load_adapter(str(path), adapter_name=name, is_trainable=False)
    try:
        model.set_adapter(name)
        yield model
    finally:
        model.set_adapter(TRAINABLE_ADAPTER)
        model.delete_adapter(name)
        only_lora_trainable(model)


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    return json.loads((Path(path) / ADAPTER_CONFIG).read_text())


def check_vllm_format(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Raise AdapterFormatError if vLLM would refuse the adapter at `path`; return its config."""
    directory = Path(path)
    if not (directory / ADAPTER_WEIGHTS).is_file():
        raise AdapterFormatError(f"{directory} has no {ADAPTER_WEIGHTS}")
    config = read_config(directory)
    if str(config.get("peft_type", "")).upper() != "LORA":
        raise AdapterFormatError(f"peft_type {config.get('peft_type')!r} is not LORA")
    if config.get("modules_to_save"):
        raise AdapterFormatError(f"modules_to_save {config['modules_to_save']} is not supported by vLLM")
    if config.get("use_dora"):
        raise AdapterFormatError("DoRA adapters are not supported by vLLM")
    ranks = {int(config.get("r", 0)), *map(int, (config.get("rank_pattern") or {}).values())}
    if not ranks <= set(VLLM_LORA_RANKS):
        raise AdapterFormatError(f"ranks {sorted(ranks)} are not all in vLLM's allowed set {list(VLLM_LORA_RANKS)}")
    return config


def save_adapter(
    model: Any, out_dir: str | os.PathLike[str], base_model_name: str, state_dict: dict[str, Any] | None = None
) -> Path:
    """Save the trainable adapter to `out_dir` (which must not exist) atomically; return it.

    `state_dict`: the weights to save instead of the model's own, by the peft model's parameter
    names (a sharded FSDP model holds only shards; rank 0 saves the gathered whole weights)."""
    out = Path(out_dir)
    if out.exists():
        raise FileExistsError(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f"{TMP_PREFIX}{out.name}-{uuid.uuid4().hex[:8]}"
    try:
        extra = {} if state_dict is None else {"state_dict": state_dict}
        model.save_pretrained(
            str(tmp),
            selected_adapters=[TRAINABLE_ADAPTER],
            save_embedding_layers=False,
            safe_serialization=True,
            **extra,
        )
        config = read_config(tmp)
        # The name clients know the base by, not the local cache directory it was loaded from.
        config["base_model_name_or_path"] = base_model_name
        config["modules_to_save"] = None
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True))
        check_vllm_format(tmp)
        fsync_tree(tmp)
        os.replace(tmp, out)
        fsync_directory(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
