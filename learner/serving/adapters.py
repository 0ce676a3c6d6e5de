"""The LoRA registry: several PEFT adapters resident on one base model, chosen per request.

An adapter is checked against the base model *before* peft touches it, the way vLLM checks
it: every LoRA weight must belong to a linear module the base has, with the base's shapes,
and a rank within `max_lora_rank`. A rejected adapter therefore leaves the model exactly as
it was and the server keeps serving. Error messages follow vLLM's so that clients (the
promotion code) can treat a local server and vLLM alike.

Everything here that touches the model runs on the engine's thread, between decode steps.

One forward pass may serve several adapters and the base at once (`activate_rows`): peft's
mixed-batch inference (each LoRA layer's `adapter_names` argument, one name per row) runs each
row through its own adapter and leaves the rows of `BASE_ROW` on the base weights. No adapter
may therefore be called `BASE_ROW`: its rows would silently get the base model.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
BASE_ROW = "__base__"  # peft's adapter name for "no adapter" in a mixed batch (`adapter_names`)


class AdapterNotFoundError(Exception):
    """No PEFT adapter at the path: vLLM answers 404 NotFoundError with this message."""

    def __init__(self, name: str, path: str) -> None:
        super().__init__(f"Loading lora {name} failed: No adapter found for {path}")


class AdapterIncompatibleError(Exception):
    """The adapter exists but does not fit this base model: vLLM answers 400 BadRequestError."""


@dataclass
class AdapterInfo:
    """What /v1/models reports about a resident adapter."""

    name: str
    path: str
    rank: int
    int_id: int
    created: int = field(default_factory=lambda: int(time.time()))


def _linear_shapes(model: torch.nn.Module) -> dict[str, tuple[int, int]]:
    """Module path -> (in_features, out_features) of every linear layer of the plain base model."""
    import torch

    return {
        name: (module.in_features, module.out_features)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    }


def _read_adapter_tensors(path: Path) -> dict[str, torch.Tensor]:
    weights = next((path / f for f in ADAPTER_WEIGHTS if (path / f).is_file()), None)
    if weights is None:
        raise FileNotFoundError(path)
    if weights.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(weights))
    import torch

    return torch.load(weights, map_location="cpu", weights_only=True)


class LoraManager:
    """Owns the served model: the plain base model, wrapped in a PeftModel once adapters exist."""

    def __init__(self, base_model: Any, max_lora_rank: int = 64) -> None:
        self.model = base_model
        self.max_lora_rank = max_lora_rank
        self.adapters: dict[str, AdapterInfo] = {}
        self._linear = _linear_shapes(base_model)
        self._supported_suffixes = sorted({name.rsplit(".", 1)[-1] for name in self._linear} - {"lm_head"})
        self._next_id = 1
        # The model's LoRA layers, found once per set of adapters: every load, unload or failed
        # load resets it, since peft adds and removes layers then.
        self._lora_layers: list[Any] | None = None

    # ------------------------------------------------------------ checks

    def check(self, name: str, path: str) -> tuple[dict[str, Any], int]:
        """Validate the adapter at `path` against the base; return its config and rank."""
        directory = Path(path).expanduser()
        config_file = directory / ADAPTER_CONFIG
        if not config_file.is_file() or not any((directory / f).is_file() for f in ADAPTER_WEIGHTS):
            raise AdapterNotFoundError(name, path)
        try:
            config = json.loads(config_file.read_text())
        except (OSError, ValueError) as exc:
            raise AdapterIncompatibleError(f"Loading lora {path} failed: unreadable {ADAPTER_CONFIG}: {exc}") from exc
        if str(config.get("peft_type", "LORA")).upper() != "LORA":
            raise AdapterIncompatibleError(
                f"Loading lora {path} failed: peft_type {config.get('peft_type')} is not LORA"
            )
        if config.get("use_dora"):
            raise AdapterIncompatibleError(f"Loading lora {path} failed: DoRA adapters are not supported")
        if config.get("modules_to_save"):
            raise AdapterIncompatibleError(
                f"Loading lora {path} failed: modules_to_save {config['modules_to_save']} is not supported by vLLM"
            )
        ranks = [int(config.get("r", 8)), *map(int, (config.get("rank_pattern") or {}).values())]
        rank = max(ranks)
        if rank > self.max_lora_rank:
            raise AdapterIncompatibleError(f"LoRA rank {rank} is greater than max_lora_rank {self.max_lora_rank}.")
        self._check_weights(directory, path)
        return config, rank

    def _check_weights(self, directory: Path, path: str) -> None:
        """Every lora_A/lora_B tensor must sit on a base linear layer of matching shape."""
        try:
            tensors = _read_adapter_tensors(directory)
        except Exception as exc:  # a corrupt file is the client's problem, not a server error
            raise AdapterIncompatibleError(f"Loading lora {path} failed: {exc}") from exc
        unexpected: list[str] = []
        mismatched: list[str] = []
        for key, tensor in tensors.items():
            module, _, kind = key.rpartition(".lora_")
            if not module:
                unexpected.append(key)
                continue
            module = module.removeprefix("base_model.model.")
            shape = self._linear.get(module)
            if shape is None:
                unexpected.append(module)
                continue
            in_features, out_features = shape
            if kind.startswith("A") and tensor.shape[-1] != in_features:
                mismatched.append(f"{key}: {tuple(tensor.shape)} does not take in_features={in_features}")
            elif kind.startswith("B") and tensor.shape[0] != out_features:
                mismatched.append(f"{key}: {tuple(tensor.shape)} does not give out_features={out_features}")
        if unexpected:
            shown = sorted(set(unexpected))[:8]
            raise AdapterIncompatibleError(
                f"While loading {path}, expected target modules in {self._supported_suffixes} but received "
                f"{shown}. Please verify that the loaded LoRA module is correct"
            )
        if mismatched:
            raise AdapterIncompatibleError(
                f"Loading lora {path} failed: the adapter was trained on a different base model; "
                f"shape mismatch: {'; '.join(mismatched[:4])}"
            )
        if not tensors:
            raise AdapterIncompatibleError(f"Loading lora {path} failed: the adapter holds no LoRA weights")

    # ------------------------------------------------------------ mutations (engine thread)

    def keeps_the_model(self, name: str, *, loading: bool) -> bool:
        """Whether loading (or unloading) `name` now leaves the model the other rows run through
        as it is: peft already wraps the model and keeps wrapping it (not the first load, not
        the last unload), so only `name`'s own LoRA weights come or go. The engine then runs the
        change between two decode steps of a batch that does not use `name`, without a drain."""
        from peft import PeftModel

        if not isinstance(self.model, PeftModel):
            return False
        if loading and name not in self.adapters:
            return True
        return len(self.model.peft_config) > 1  # an unload, or an in-place reload (detach, then load)

    def load(self, name: str, path: str, inplace: bool = False) -> AdapterInfo:
        """Check, then attach the adapter under `name` (replacing it when `inplace`)."""
        self._lora_layers = None
        if name == BASE_ROW:
            raise AdapterIncompatibleError(f"Loading lora {path} failed: '{BASE_ROW}' is reserved for the base model")
        _, rank = self.check(name, path)
        from peft import PeftModel

        previous = self.adapters.get(name)
        if previous is not None:
            if not inplace:
                raise AdapterIncompatibleError(f"The lora adapter '{name}' has already been loaded.")
            self._detach(name)
        try:
            if isinstance(self.model, PeftModel):
                self.model.load_adapter(path, adapter_name=name, is_trainable=False)
            else:
                self.model = PeftModel.from_pretrained(self.model, path, adapter_name=name, is_trainable=False)
        except Exception as exc:
            self._discard_partial(name)
            raise AdapterIncompatibleError(f"Loading lora {path} failed: {exc}") from exc
        self.model.eval()
        int_id = previous.int_id if previous is not None else self._next_id
        self._next_id += previous is None
        info = AdapterInfo(name=name, path=path, rank=rank, int_id=int_id)
        self.adapters[name] = info
        log.info("Loaded LoRA adapter: name '%s', path '%s'", name, path)
        return info

    def unload(self, name: str) -> None:
        self._lora_layers = None
        self._detach(name)
        del self.adapters[name]
        log.info("Removed LoRA adapter: name '%s'", name)

    def _detach(self, name: str) -> None:
        from peft import PeftModel

        if not isinstance(self.model, PeftModel):
            return
        if len(self.model.peft_config) <= 1:
            # The last adapter: go back to the untouched base model.
            self.model = self.model.unload()
        else:
            self.model.delete_adapter(name)

    def _discard_partial(self, name: str) -> None:
        """peft registers an adapter before copying its weights; remove what a failed load left."""
        from peft import PeftModel

        if isinstance(self.model, PeftModel) and name in self.model.peft_config:
            if len(self.model.peft_config) <= 1:
                self.model = self.model.unload()
            else:
                self.model.delete_adapter(name)

    # ------------------------------------------------------------ use

    @contextlib.contextmanager
    def activate(self, name: str | None) -> Iterator[Any]:
        """Yield the model to call for `name` (None: the base, with every adapter disabled)."""
        from peft import PeftModel

        if not isinstance(self.model, PeftModel):
            if name is not None:
                raise KeyError(name)
            yield self.model
            return
        if name is None:
            with self.model.disable_adapter():
                yield self.model
            return
        if self.model.active_adapter != name:
            self.model.set_adapter(name)
        yield self.model

    @contextlib.contextmanager
    def activate_rows(self, names: Sequence[str | None]) -> Iterator[Any]:
        """Yield the model to call so that row i of the batch runs with adapter `names[i]` (None: the base).

        A batch of one adapter (or of the base alone) takes `activate`'s plain path, peft's fastest.
        A mixed batch gets peft's mixed-batch inference: every LoRA layer receives `adapter_names`,
        one per row (`BASE_ROW` for None), and adds each adapter's delta to its own rows only, so
        the whole batch shares one forward pass instead of taking turns. The names go to the
        layers through pre-forward hooks on a list of the LoRA layers kept between steps, which is
        what `PeftModel.forward(adapter_names=...)` does too, except that it walks all the model's
        modules (3000 for SmolLM2 with seven projections) twice per call: about a quarter of a
        decode step on CPU. Every name must be loaded (KeyError otherwise).
        """
        distinct = set(names)
        if len(distinct) <= 1:
            with self.activate(next(iter(distinct), None)) as model:
                yield model
            return
        unknown = sorted(n for n in distinct if n is not None and n not in self.adapters)
        if unknown:
            raise KeyError(", ".join(unknown))
        from peft import PeftModel

        assert isinstance(self.model, PeftModel)  # an adapter is loaded
        rows = [BASE_ROW if n is None else n for n in names]

        def give_rows(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
            return args, {**kwargs, "adapter_names": rows}

        handles = [layer.register_forward_pre_hook(give_rows, with_kwargs=True) for layer in self._layers()]
        try:
            yield self.model
        finally:
            for handle in handles:
                handle.remove()

    def _layers(self) -> list[Any]:
        """The model's LoRA layers (those that take `adapter_names`), found once per set of adapters."""
        if self._lora_layers is None:
            from peft.tuners.lora import LoraLayer

            self._lora_layers = [m for m in self.model.modules() if isinstance(m, LoraLayer)]
        return self._lora_layers
