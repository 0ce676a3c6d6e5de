"""Gateway API keys: made by the CLI, stored hashed, refused clearly, never logged."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time

import httpx
import openai
import pytest
import yaml

from tests.conftest import count_rows, wait_for
from tests.support.processes import REPO_ROOT, cli


def test_keys_are_required_checked_hashed_and_revocable(start_gateway, database_url, db, tmp_path):
    created = cli(database_url, tmp_path, "keys", "create", "--name", "support-bot", "--tenant", "acme")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert key.startswith("apk-") and len(key) > 40
    stored = db.execute("SELECT key_hash, key_prefix, tenant FROM api_keys").fetchall()
    assert stored == [(hashlib.sha256(key.encode()).digest(), key[:12], "acme")]
    assert key not in str(db.execute("SELECT * FROM api_keys").fetchall())

    gateway = start_gateway(auth={"mode": "keys", "key_cache_ttl_s": 0.5})
    messages = [{"role": "user", "content": "hi"}]
    missing = httpx.post(gateway.base_url + "/chat/completions", json={"model": "fake-model", "messages": messages})
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "missing_api_key"
    with pytest.raises(openai.AuthenticationError) as wrong:
        openai.OpenAI(
            base_url=gateway.base_url, api_key="apk-wrong-key-000000000", max_retries=0
        ).chat.completions.create(model="fake-model", messages=messages)
    assert wrong.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gateway.base_url, api_key="apk-wrong", max_retries=0).models.list()

    client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
    client.chat.completions.create(model="fake-model", messages=messages)
    row = wait_for(lambda: db.execute("SELECT tenant, api_key_id FROM calls").fetchone())
    assert row[0] == "acme" and row[1] is not None

    listed = cli(database_url, tmp_path, "keys", "list")
    assert key[:12] in listed.stdout and key not in listed.stdout
    revoked = cli(database_url, tmp_path, "keys", "revoke", key[:12])
    assert revoked.returncode == 0, revoked.stderr
    time.sleep(1.5)  # the gateway's key cache refreshes every 0.5 s here
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="fake-model", messages=messages)
    assert count_rows(db, "SELECT count(*) FROM calls") == 1
    assert key not in gateway.log_text()


def test_admin_key_from_environment(start_gateway, db):
    gateway = start_gateway(
        auth={"mode": "keys", "admin_key": "os.environ/TEST_ADMIN_KEY"}, env={"TEST_ADMIN_KEY": "admin-secret-123456"}
    )
    client = openai.OpenAI(base_url=gateway.base_url, api_key="admin-secret-123456", max_retries=0)
    assert client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}]).choices
    assert "admin-secret-123456" not in gateway.log_text()


def test_open_mode_refuses_a_public_address(tmp_path, database_url):
    config = tmp_path / "open.yaml"
    config.write_text(
        yaml.safe_dump({"database_url": database_url, "data_dir": str(tmp_path / "d"), "auth": {"mode": "open"}})
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "apprentice.cli",
            "gateway",
            "--config",
            str(config),
            "--host",
            "0.0.0.0",
            "--port",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
    )
    assert result.returncode != 0 and "open mode is for local use only" in result.stderr


def test_gateway_refuses_an_out_of_date_schema(tmp_path, pg_admin_url):
    import uuid

    import psycopg
    from sqlalchemy.engine import make_url

    name = f"apprentice_empty_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    try:
        url = make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
        config = tmp_path / "old.yaml"
        config.write_text(yaml.safe_dump({"database_url": url, "data_dir": str(tmp_path / "d")}))
        result = subprocess.run(
            [sys.executable, "-m", "apprentice.cli", "gateway", "--config", str(config)],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            timeout=60,
        )
        assert result.returncode == 2
        assert "apprentice db upgrade" in result.stderr and "empty" in result.stderr
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
