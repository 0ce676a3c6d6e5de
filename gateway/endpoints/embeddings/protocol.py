"""Wire types of `POST /v1/embeddings`, for the OpenAPI document.

The gateway does not read embeddings calls beyond their `model` (passthrough.py forwards them
to that model's deployment, or to `default_upstream`, and records nothing); these permissive
models describe OpenAI's request and answer as a client sees them through the gateway.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class EmbeddingsRequest(_Open):
    model: str = Field(
        min_length=1, description="Chooses the deployment; a name not in `model_list` goes to `default_upstream`."
    )
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = None
    user: str | None = None


class Embedding(_Open):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="A base64 string with `encoding_format: base64`.")


class EmbeddingsUsage(_Open):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(_Open):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage | None = None
