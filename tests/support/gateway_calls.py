"""Calls and rewards through a running gateway (a GatewayProcess), for the reward and trajectory tests."""

from __future__ import annotations

import json

import httpx

from tests.conftest import count_rows, wait_for


def chat(
    gateway,
    content: str,
    *,
    client_id: str | None = None,
    group: str | None = None,
    model: str = "fake-model",
    key: str = "x",
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    if client_id:
        headers["X-Trajectory-Id"] = client_id
    if group:
        headers["X-Group-Id"] = group
    response = httpx.post(
        gateway.base_url + "/chat/completions",
        headers=headers,
        timeout=30,
        json={"model": model, "messages": [{"role": "user", "content": content}]},
    )
    assert response.status_code == 200, response.text
    return response


def post(gateway, body, *, key: str = "x", headers: dict | None = None) -> httpx.Response:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(
        gateway.base_url + "/rewards",
        content=data,
        timeout=30,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json", **(headers or {})},
    )


def shipped(db, n: int) -> None:
    wait_for(lambda: count_rows(db, "SELECT count(*) FROM calls") >= n, message=f"{n} calls stored")
