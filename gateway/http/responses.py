"""Answers built from protocol models, serialized the way the gateway always has.

Routes return a `Response` themselves, so FastAPI does not validate the model a second time
against `response_model` (which then only documents the answer). The model is dumped to
Python values and serialized with orjson: datetimes keep their RFC 3339 offset form
(`+00:00`), exactly as the answers looked before they went through models.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

import orjson
from fastapi import Response
from pydantic import BaseModel


def _plain(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()  # orjson's form (`+00:00`)
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps(value: Any) -> bytes:
    """JSON of stored values. orjson, unless a value holds an integer past 64 bits: JSON allows
    any integer and a recorded body (jsonb) keeps it, so reading a row never fails on its content."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, default=_plain, ensure_ascii=False, separators=(",", ":")).encode()


def model_response(model: BaseModel, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps(model.model_dump()), media_type="application/json", headers=headers)
