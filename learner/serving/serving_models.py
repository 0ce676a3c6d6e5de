"""`/v1/models` and runtime LoRA loading, with vLLM's request bodies, answers and errors.

Mirrors vLLM's `OpenAIServingModels` (entrypoints/openai/models/serving.py):
- load: 200 plain text "Success: LoRA adapter 'NAME' added successfully."; both fields
  required (400 InvalidUserInput); a name already loaded without `load_inplace` (400
  InvalidUserInput); no adapter at the path (404 NotFoundError, "Loading lora NAME failed:
  No adapter found for PATH"); an adapter that does not fit the base (400 BadRequestError).
- unload: 200 "Success: LoRA adapter 'NAME' removed successfully."; unknown name (404
  NotFoundError, "The lora adapter 'NAME' cannot be found.").
- a chat request for a model that is neither the base nor a loaded adapter: 404
  NotFoundError "The model `NAME` does not exist." with param "model".
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from http import HTTPStatus

from learner.serving.adapters import AdapterIncompatibleError, AdapterNotFoundError, LoraManager
from learner.serving.engine import GenerationEngine
from learner.serving.protocol import APIError, LoadLoRAAdapterRequest, ModelCard, ModelList, UnloadLoRAAdapterRequest


class OpenAIServingModels:
    """The served names: the base model and every resident adapter."""

    def __init__(
        self, engine: GenerationEngine, lora: LoraManager, base_name: str, base_path: str, max_model_len: int
    ) -> None:
        self.engine = engine
        self.lora = lora
        self.base_name = base_name
        self.base_path = base_path
        self.max_model_len = max_model_len
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    def resolve(self, model: str | None) -> str | None:
        """The adapter a request names (None for the base), or vLLM's 404."""
        if not model or model == self.base_name:
            return None
        if model in self.lora.adapters:
            return model
        raise APIError(f"The model `{model}` does not exist.", "NotFoundError", HTTPStatus.NOT_FOUND, param="model")

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
                await self.engine.call(lambda: self.lora.load(name, path, inplace=request.load_inplace))
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
            await self.engine.call(lambda: self.lora.unload(name))
        return f"Success: LoRA adapter '{name}' removed successfully."
