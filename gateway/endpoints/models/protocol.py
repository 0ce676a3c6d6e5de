"""Wire types of `GET /v1/models` (operations.py), for the OpenAPI document."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ModelCard(BaseModel):
    id: str = Field(description="A `model_list` name or a policy: what `model` accepts.")
    object: Literal["model"] = "model"
    created: int
    owned_by: str = Field(description="`apprentice-policy` for a policy (trained here), else `apprentice`.")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
