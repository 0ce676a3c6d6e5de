"""Shared fixtures: a real PostgreSQL, the fake upstream, and gateway processes.

PostgreSQL: $APPRENTICE_TEST_PG_URL, else the server on 127.0.0.1:5432 (user postgres),
else an embedded one started with pgserver. Each test that needs a database gets a fresh one,
cloned from a template migrated once per session by Alembic.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.databases import DatabasePool
from tests.support.processes import FakeUpstreamProcess, GatewayProcess, ModelServerProcess
from tests.support.scheduling import check_server_modules, module_scheduling, on_the_server

# Fixtures that live in support modules (module-scoped: each module that asks gets its own).
pytest_plugins = ["tests.support.promotion"]

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# torch's OpenMP threads sleep when they wait instead of spinning (set here, before any process
# of the suite imports torch; the model servers and bench runs it starts inherit it). The two
# xdist workers run torch in several processes at once (a SmolLM2 server, a training run, a
# bench's quick mode) on two cores, and spinning threads of one hold the cores that another's
# barrier waits on: two `bench.learner_step --quick` side by side took 145 s each spinning
# (alone 15 s) and 19.5 s each waiting passively; the whole suite went from 23 min 23 s to
# 16 min 49 s, run after run on one evening (the real-model learning tests from 341 s to 135 s).
# Alone, a passive wait costs each small parallel region a wake-up (learner_step's tiny
# steps 1.3-1.8x slower), which the suite, never alone on its cores, does not see.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

LOCAL_PG = "postgresql://postgres@127.0.0.1:5432/postgres"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules on the SmolLM2 server first, so that pytest-xdist's worker that takes them starts
    at once (tests/support/scheduling.py); and none of them missing from the list that keeps
    them on one worker."""
    check_server_modules(items, config.rootpath)
    items.sort(key=lambda item: not on_the_server(item, config.rootpath))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test`'s scheduling between its workers (`--dist loadscope`): by module, the SmolLM2
    server's modules on one worker (tests/support/scheduling.py)."""
    return module_scheduling(config, log)


def _reachable(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


def _with_database(url: str, name: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).set(database=name).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def pg_admin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = os.environ.get("APPRENTICE_TEST_PG_URL") or LOCAL_PG
    if _reachable(url):
        yield url
        return
    import pgserver

    server = pgserver.get_server(tmp_path_factory.mktemp("pgdata"), cleanup_mode="delete")
    yield server.get_uri()
    server.cleanup()


def _admin(url: str) -> psycopg.Connection:
    return psycopg.connect(url, autocommit=True)


@pytest.fixture(scope="session")
def template_database(pg_admin_url: str) -> Iterator[str]:
    """A database migrated to head once; tests clone it."""
    from apprentice.store.schema import upgrade

    name = f"apprentice_tmpl_{uuid.uuid4().hex[:10]}"
    with _admin(pg_admin_url) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    upgrade(_with_database(pg_admin_url, name))
    yield name
    with _admin(pg_admin_url) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def database_pool(pg_admin_url: str, template_database: str) -> Iterator[DatabasePool]:
    """Clones of the template made ahead and dropped behind the tests (tests/support/databases.py)."""
    pool = DatabasePool(pg_admin_url, template_database)
    yield pool
    pool.close()


@pytest.fixture
def database_url(pg_admin_url: str, template_database: str, database_pool: DatabasePool) -> Iterator[str]:
    """A fresh, migrated database for one test."""
    name = database_pool.take()
    yield _with_database(pg_admin_url, name)
    database_pool.give_back(name)


@pytest.fixture(scope="module")
def module_database(pg_admin_url: str, database_pool: DatabasePool) -> Iterator[str]:
    """A fresh migrated database for a whole module, for modules that start their processes once."""
    name = database_pool.take()
    yield _with_database(pg_admin_url, name)
    database_pool.give_back(name)


@pytest.fixture
def db(database_url: str) -> Iterator[psycopg.Connection]:
    """A plain connection to the test's database, for assertions."""
    with psycopg.connect(database_url, autocommit=True) as connection:
        yield connection


def wait_for(
    predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05, message: str = "condition"
) -> Any:
    """Poll until predicate() is truthy; return its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message} (last value: {value!r})")
        time.sleep(interval)


def count_rows(connection: psycopg.Connection, query: str, *params: Any) -> int:
    return connection.execute(query, params).fetchone()[0]


@pytest.fixture(scope="session")
def fake_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeUpstreamProcess]:
    process = FakeUpstreamProcess(tmp_path_factory.mktemp("upstream"))
    process.start()
    yield process
    process.stop()


def gateway_config(url: str, data_dir: Path, api_base: str, **overrides: Any) -> dict[str, Any]:
    """A config dict for a gateway in front of the fake upstream."""
    config: dict[str, Any] = {
        "database_url": url,
        "data_dir": str(data_dir),
        "auth": {"mode": "open"},
        "journal": {"ship_interval_s": 0.05},
        "model_list": [
            {
                "model_name": "fake-model",
                "litellm_params": {"model": "openai/fake-model", "api_base": api_base, "api_key": "sk-upstream-secret"},
            },
        ],
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


@pytest.fixture(scope="session")
def gateway_reaper() -> Iterator[ThreadPoolExecutor]:
    """Where the gateways a test started finish their graceful shutdown, while the next test runs.

    Measured: a gateway's SIGTERM-to-exit took 0.7-0.9 s on an idle machine and 7-22 s at load 40,
    inside the teardown of every test that started one. The session waits for them all at its end."""
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="gateway-stop") as pool:
        yield pool


@pytest.fixture
def start_gateway(
    tmp_path: Path, database_url: str, fake_upstream: FakeUpstreamProcess, gateway_reaper: ThreadPoolExecutor
) -> Iterator[Callable[..., GatewayProcess]]:
    """start_gateway(workers=1, port=None, data_dir=None, **config_overrides) -> a running gateway."""
    started: list[GatewayProcess] = []

    def start(
        *,
        workers: int = 1,
        port: int | None = None,
        data_dir: Path | None = None,
        env: dict[str, str] | None = None,
        **overrides: Any,
    ) -> GatewayProcess:
        config = gateway_config(database_url, data_dir or tmp_path / "data", fake_upstream.api_base, **overrides)
        process = GatewayProcess(tmp_path, config, workers=workers, port=port, env=env)
        process.start()
        started.append(process)
        return process

    yield start
    deadline = time.monotonic() + 30
    for process in started:  # all asked at once; they shut down side by side, SIGKILLed after 30 s
        process.terminate()
        gateway_reaper.submit(process.wait_stopped, deadline)


# ---- the real SmolLM2 (learning tests, the protocols on the local model, the dashboard) ----


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from learner.models import fetch_default_model

    return fetch_default_model()


@pytest.fixture(scope="session")
def smollm2_server(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelServerProcess]:
    """One `apprentice serve-model` on the real SmolLM2 for the whole session, shared by the
    learning tests (each used to start its own: about 8 s a start on this machine, idle). Safe to
    share: each test has its own database and data dir, and a candidate promoted under a name
    another test already loaded (writer-v1) has another path, so the promotion replaces it in place."""
    from tests.support.learning import BASE, SERVER_ARGS

    server = ModelServerProcess(tmp_path_factory.mktemp("smollm2-server"), smollm2_dir, BASE, *SERVER_ARGS)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def model_server(smollm2_server: ModelServerProcess) -> ModelServerProcess:
    """The session's SmolLM2 server, under the name the learning tests used for their own."""
    return smollm2_server
