"""Health, readiness and Prometheus metrics, with one worker and with two."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.conftest import count_rows, wait_for


def metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("workers", [1, 2])
def test_health_readiness_and_metrics(start_gateway, fake_upstream, db, workers):
    entries = [
        {"model_name": name, "litellm_params": {"model": f"openai/{upstream}", "api_base": fake_upstream.api_base}}
        for name, upstream in (("fake-model", "fake-model"), ("broken", "fail-502"))
    ]
    gateway = start_gateway(workers=workers, model_list=entries)
    assert httpx.get(gateway.url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(gateway.url + "/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["store"]["ok"] is True
    client = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
    for i in range(20):
        client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": f"m {i}"}], stream=bool(i % 2)
        )
    with pytest.raises(openai.APIStatusError):
        client.chat.completions.create(model="broken", messages=[{"role": "user", "content": "x"}])
    wait_for(lambda: count_rows(db, "SELECT count(*) FROM calls") == 21)
    text = wait_for(
        lambda: (
            (t := httpx.get(gateway.url + "/metrics").text) and metric(t, "apprentice_shipped_calls_total") >= 21 and t
        )
    )
    assert metric(text, 'apprentice_requests_total{endpoint="chat.completions",status="2xx"}') == 20
    assert metric(text, 'apprentice_request_latency_seconds_count{endpoint="chat.completions",stream="true"}') == 10
    assert metric(text, "apprentice_journaled_calls_total") == 21
    assert metric(text, 'apprentice_upstream_errors_total{kind="502",upstream="broken"}') == 1
    assert "apprentice_journal_backlog_bytes" in text
