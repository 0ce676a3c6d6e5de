"""Answers built from protocol models, serialized the way the gateway always has.

Routes return a `Response` themselves, so FastAPI does not validate the model a second time
against `response_model` (which then only documents the answer). The model is dumped to
Python values and serialized with orjson: datetimes keep their RFC 3339 offset form
(`+00:00`), exactly as the answers looked before they went through models.
"""

from __future__ import annotations

import orjson
from fastapi import Response
from pydantic import BaseModel


def model_response(model: BaseModel, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(model.model_dump()), media_type="application/json", headers=headers)
