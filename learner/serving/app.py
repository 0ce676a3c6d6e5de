"""The HTTP app: vLLM's routes over our engine, and the one function that builds a server.

Routes: `GET /v1/models`, `POST /v1/chat/completions`, `POST /v1/load_lora_adapter`,
`POST /v1/unload_lora_adapter`, `GET /health`, `GET /version`. Errors use vLLM's body
`{"error": {"message", "type", "param", "code"}}`; request validation errors are 400, as in
vLLM, not FastAPI's 422.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from learner.serving.adapters import LoraManager
from learner.serving.engine import GenerationEngine
from learner.serving.protocol import APIError, ChatCompletionRequest, LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
from learner.serving.serving_chat import OpenAIServingChat
from learner.serving.serving_models import OpenAIServingModels

log = logging.getLogger(__name__)

# What /version answers: this is not vLLM, and a client that needs to know can tell.
SERVER_VERSION = "apprentice-local-0.1"


@dataclass
class ServerState:
    engine: GenerationEngine
    models: OpenAIServingModels
    chat: OpenAIServingChat


def _error(exc: APIError) -> JSONResponse:
    return JSONResponse(content=exc.response().model_dump(), status_code=int(exc.status))


def build_app(state: ServerState, api_key: str | None = None) -> FastAPI:
    """A FastAPI app over a ready (not yet started) engine; the app starts and stops it."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.engine.start()
        try:
            yield
        finally:
            state.engine.stop()

    app = FastAPI(title="Apprentice local inference server", lifespan=lifespan)
    app.state.server = state
    _add_error_handlers(app)
    if api_key:
        _require_api_key(app, api_key)
    _add_routes(app, state)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error in vLLM's body; request validation errors as 400, as vLLM answers them."""

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        messages = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
            msg = str(err.get("msg", "")).removeprefix("Value error, ")
            messages.append(f"{where}: {msg}" if where else msg)
        return _error(APIError("; ".join(messages) or "invalid request", "BadRequestError"))

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception) -> JSONResponse:
        log.exception("request failed")
        return _error(APIError(str(exc) or type(exc).__name__, "InternalServerError", HTTPStatus.INTERNAL_SERVER_ERROR))


def _require_api_key(app: FastAPI, api_key: str) -> None:
    """`/v1` routes answer only `Authorization: Bearer <api_key>` (vLLM's `--api-key`); health and version stay open."""

    @app.middleware("http")
    async def authenticate(request: Request, call_next: Any) -> Any:
        if request.url.path.startswith("/v1"):
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                return JSONResponse(content={"error": "Unauthorized"}, status_code=401)
        return await call_next(request)


def _add_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": SERVER_VERSION}

    @app.get("/v1/models")
    async def show_available_models() -> JSONResponse:
        return JSONResponse(content=state.models.show_available_models().model_dump())

    @app.post("/v1/chat/completions")
    async def create_chat_completion(request: ChatCompletionRequest) -> Any:
        result = await state.chat.create_chat_completion(request)
        if isinstance(result, AsyncIterator):
            return StreamingResponse(result, media_type="text/event-stream")
        return JSONResponse(content=result.model_dump())

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: LoadLoRAAdapterRequest) -> Response:
        return Response(status_code=200, content=await state.models.load_lora_adapter(request))

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: UnloadLoRAAdapterRequest) -> Response:
        return Response(status_code=200, content=await state.models.unload_lora_adapter(request))


def create_server_state(
    model: str | None,
    served_model_name: str | None = None,
    device: Any = None,
    dtype: Any = None,
    max_batch_size: int = 16,
    max_lora_rank: int = 64,
    max_model_len: int | None = None,
    default_max_tokens: int | None = 1024,
    threads: int | None = None,
    lora_resolver_dir: str | None = None,
) -> ServerState:
    """Load the model and wire engine, adapter registry and handlers together.

    Adapters a request names that are not loaded are looked up in `lora_resolver_dir`, and in
    vLLM's `VLLM_LORA_RESOLVER_CACHE_DIR` when the environment turns vLLM's filesystem resolver
    on (`resolver.py`); both are checked before the model loads, as vLLM does at start.

    On CPU, torch gets `threads` threads (default: half the cores). With as many threads as
    cores, torch's thread pool collapses as soon as anything else runs (the gateway, the
    learner): 4 instead of 15 tokens/s for one sequence on a busy 2-core machine.
    """
    import torch

    from learner.models import load_base_model, pick_device, resolve_model_path
    from learner.serving.resolver import FilesystemResolver, resolver_from_environment

    resolvers = [FilesystemResolver(lora_resolver_dir)] if lora_resolver_dir else []
    if (from_environment := resolver_from_environment()) is not None:
        resolvers.append(from_environment)
    if pick_device(device).type == "cpu":
        torch.set_num_threads(threads or max(1, (os.cpu_count() or 2) // 2))
    path = resolve_model_path(model)
    loaded = load_base_model(path, device=device, dtype=dtype)
    config_len = getattr(loaded.model.config, "max_position_embeddings", None) or 2048
    max_len = min(max_model_len or config_len, config_len)
    lora = LoraManager(loaded.model, max_lora_rank=max_lora_rank)
    engine = GenerationEngine(
        lora, loaded.tokenizer, pick_device(device), max_batch_size=max_batch_size, max_model_len=max_len
    )
    models = OpenAIServingModels(
        engine,
        lora,
        served_model_name or str(model or path),
        str(path),
        max_len,
        model=str(model or path),
        resolvers=resolvers,
    )
    chat = OpenAIServingChat(engine, models, loaded.tokenizer, max_len, default_max_tokens=default_max_tokens)
    return ServerState(engine=engine, models=models, chat=chat)
