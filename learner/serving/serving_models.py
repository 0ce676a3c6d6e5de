"""`/v1/models` and runtime LoRA loading, with vLLM's request bodies, answers and errors.

Mirrors vLLM's `OpenAIServingModels` (entrypoints/openai/models/serving.py):
- load: 200 plain text "Success: LoRA adapter 'NAME' added successfully."; both fields
  required (400 InvalidUserInput); a name already loaded without `load_inplace` (400
  InvalidUserInput); no adapter at the path (404 NotFoundError, "Loading lora NAME failed:
  No adapter found for PATH"); an adapter that does not fit the base (400 BadRequestError).
- unload: 200 "Success: LoRA adapter 'NAME' removed successfully."; unknown name (404
  NotFoundError, "The lora adapter 'NAME' cannot be found.").
- a chat request for a model that is neither the base nor a loaded adapter: 404
  NotFoundError "The model `NAME` does not exist." with param "model", unless a LoRA
  resolver finds it (`check_model`, `resolver.py`): then it is loaded once and served, or a
  400 BadRequestError "LoRA adapter 'NAME' was found but could not be loaded." when the load
  fails (vLLM's `resolve_lora`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from http import HTTPStatus

from learner.serving.adapters import AdapterIncompatibleError, AdapterNotFoundError, LoraManager
from learner.serving.engine import GenerationEngine
from learner.serving.protocol import APIError, LoadLoRAAdapterRequest, ModelCard, ModelList, UnloadLoRAAdapterRequest
from learner.serving.resolver import FilesystemResolver

log = logging.getLogger(__name__)


class OpenAIServingModels:
    """The served names: the base model and every resident adapter."""

    def __init__(
        self,
        engine: GenerationEngine,
        lora: LoraManager,
        base_name: str,
        base_path: str,
        max_model_len: int,
        *,
        model: str | None = None,
        resolvers: list[FilesystemResolver] | None = None,
    ) -> None:
        self.engine = engine
        self.lora = lora
        self.base_name = base_name
        self.base_path = base_path
        self.max_model_len = max_model_len
        # vLLM's `model_config.model`: the --model as given, what resolvers compare adapters with.
        self.model = model or base_path
        self.resolvers = resolvers or []
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    def resolve(self, model: str | None) -> str | None:
        """The adapter a request names (None for the base), or vLLM's 404."""
        if not model or model == self.base_name:
            return None
        if model in self.lora.adapters:
            return model
        raise APIError(f"The model `{model}` does not exist.", "NotFoundError", HTTPStatus.NOT_FOUND, param="model")

    async def check_model(self, model: str | None) -> str | None:
        """`resolve`, and for a name neither served nor loaded, the resolvers (vLLM's `_check_model`)."""
        if not model or model == self.base_name or model in self.lora.adapters or not self.resolvers:
            return self.resolve(model)
        if await self._resolve_lora(model):
            return model
        return self.resolve(model)  # vLLM's 404 for a name no resolver found

    async def _resolve_lora(self, name: str) -> bool:
        """Load `name` from the first resolver that finds it, once however many requests ask
        together; False when none finds it, APIError 400 when what was found does not load."""
        async with self._locks[name]:
            if name in self.lora.adapters:
                return True
            found = False
            for resolver in self.resolvers:
                path = await asyncio.to_thread(resolver.resolve, self.model, name)
                if path is None:
                    continue
                found = True
                try:
                    await self._load_resolved(name, path)
                except Exception as exc:  # as vLLM: log it and try the next resolver
                    log.warning("Failed to load LoRA '%s' resolved by %s: %s", name, resolver, exc)
                    continue
                log.info("Resolved and loaded LoRA adapter '%s' using %s", name, type(resolver).__name__)
                return True
        if found:
            raise APIError(f"LoRA adapter '{name}' was found but could not be loaded.", "BadRequestError")
        return False

    async def _load_resolved(self, name: str, path: str) -> None:
        await self.engine.call(
            lambda: self.lora.load(name, path),
            adapter=name,
            beside=lambda: self.lora.keeps_the_model(name, loading=True),
        )

    def show_available_models(self) -> ModelList:
        cards = [ModelCard(id=self.base_name, root=self.base_path, max_model_len=self.max_model_len)]
        cards += [
            ModelCard(id=info.name, root=info.path, parent=self.base_name, created=info.created)
            for info in list(self.lora.adapters.values())
        ]
        return ModelList(data=cards)

    async def load_lora_adapter(self, request: LoadLoRAAdapterRequest) -> str:
        name, path = request.lora_name, request.lora_path
        if not name or not path:
            raise APIError("Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        async with self._locks[name]:
            if not request.load_inplace and name in self.lora.adapters:
                raise APIError(
                    f"The lora adapter '{name}' has already been loaded. If you want to load the "
                    "adapter in place, set 'load_inplace' to True.",
                    "InvalidUserInput",
                )
            try:
                await self.engine.call(
                    lambda: self.lora.load(name, path, inplace=request.load_inplace),
                    adapter=name,
                    beside=lambda: self.lora.keeps_the_model(name, loading=True),
                )
            except AdapterNotFoundError as exc:
                raise APIError(str(exc), "NotFoundError", HTTPStatus.NOT_FOUND) from exc
            except AdapterIncompatibleError as exc:
                raise APIError(str(exc), "BadRequestError") from exc
            except Exception as exc:  # vLLM answers any other load failure with 400 too
                raise APIError(f"Loading lora {path} failed: {exc}", "BadRequestError") from exc
        return f"Success: LoRA adapter '{name}' added successfully."

    async def unload_lora_adapter(self, request: UnloadLoRAAdapterRequest) -> str:
        name = request.lora_name
        if not name:
            raise APIError("'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput")
        async with self._locks[name]:
            if name not in self.lora.adapters:
                raise APIError(f"The lora adapter '{name}' cannot be found.", "NotFoundError", HTTPStatus.NOT_FOUND)
            await self.engine.call(
                lambda: self.lora.unload(name),
                adapter=name,
                beside=lambda: self.lora.keeps_the_model(name, loading=False),
            )
        return f"Success: LoRA adapter '{name}' removed successfully."
