"""The benches' one harness: how a bench starts processes (the fake upstream, gateways, the local
inference server, `apprentice up`), makes and drops its scratch databases, and logs.

Every bench uses these, so that a bench measures the product as the others do: the same clean
environment (no DATABASE_URL or APPRENTICE_* from the caller's shell, LiteLLM's local cost map),
the same `apprentice db upgrade`, the same readiness checks, everything stopped and dropped on the
way out. Processes whose CPU time a bench reads are `MeasuredProcess`es.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import yaml

from apprentice.processes import ManagedProcess, free_port

REPO = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
ADMIN_URL = os.environ.get("APPRENTICE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
SCHEDSTAT = os.path.exists("/proc/self/schedstat")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def bench_env(hidden: tuple[str, ...] = ("APPRENTICE_",)) -> dict[str, str]:
    """The environment a bench's servers run in: this one without DATABASE_URL and the variables
    starting with `hidden` (they would change what a target does), with LiteLLM's local cost map."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL" and not k.startswith(hidden)}
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    return env


# --------------------------------------------------------------------------- processes


class MeasuredProcess(ManagedProcess):
    """A server started by a bench (at once), whose CPU time and memory are read, children included.

    `env`, when given, is the child's whole environment rather than additions to this one (see
    `bench_env`).
    """

    STOP_TIMEOUT_S = 15.0

    def __init__(
        self, name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None, cwd: Path = REPO
    ) -> None:
        super().__init__(name, argv, log_path, cwd=cwd)
        if env is not None:
            self.env = env
        self.start()

    def processes(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def cpu_seconds(self) -> tuple[float, float]:
        """CPU time (user+system) of the process and its descendants, twice: from Linux's
        per-thread schedstat (nanoseconds; live threads only) and from psutil (clock ticks of
        10 ms, but counting threads that already exited). See `cpu_delta`."""
        fine = coarse = 0.0
        for proc in self.processes():
            try:
                times = proc.cpu_times()
                coarse += times.user + times.system
            except psutil.Error:
                continue
            if not SCHEDSTAT:
                continue
            try:
                tasks = list(os.scandir(f"/proc/{proc.pid}/task"))
            except OSError:
                continue  # exited meanwhile
            for task in tasks:
                try:
                    with open(f"{task.path}/schedstat", "rb") as handle:
                        fine += int(handle.read().split()[0]) / 1e9
                except (OSError, ValueError, IndexError):
                    continue
        return (fine if SCHEDSTAT else coarse), coarse

    def rss_bytes(self) -> int:
        total = 0
        for proc in self.processes():
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                pass
        return total

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM to its session, SIGKILL after `timeout`; workers left behind are killed too."""
        return super().stop(timeout)


def cpu_delta(before: tuple[float, float], after: tuple[float, float]) -> float:
    """The precise figure, unless the coarse one says that threads which exited meanwhile took
    noticeably more (their time leaves the per-thread sum)."""
    fine, coarse = after[0] - before[0], after[1] - before[1]
    return coarse if coarse > fine * 1.1 + 0.03 else fine


def apprentice_argv() -> list[str]:
    script = Path(sys.executable).parent / "apprentice"
    return [str(script)] if script.exists() else [sys.executable, "-m", "apprentice.cli"]


def gateway_unavailable() -> str | None:
    """Why `apprentice gateway` cannot run in this checkout, or None when it can."""
    for sub in (["gateway", "--help"], ["db", "upgrade", "--help"]):
        try:
            done = subprocess.run(apprentice_argv() + sub, capture_output=True, text=True, timeout=120, cwd=REPO)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"`apprentice {' '.join(sub)}` could not run: {exc}"
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            return f"`apprentice {' '.join(sub)}` exited {done.returncode}: {' | '.join(detail)}"
    return None


def start_upstream(workdir: Path, *, measured: bool = False) -> tuple[ManagedProcess, str]:
    """The tests' fake upstream (tests.support.fake_upstream) on a free port: (process, its /v1 URL)."""
    port = free_port()
    argv = [sys.executable, "-m", "tests.support.fake_upstream", "--host", HOST, "--port", str(port)]
    url = f"http://{HOST}:{port}/v1"
    process: ManagedProcess
    if measured:
        process = MeasuredProcess("upstream", argv, workdir / "upstream.log")
    else:
        process = ManagedProcess("fake upstream", argv, workdir / "upstream.log", cwd=REPO, ready_url=f"{url}/models")
        process.start()
    process.ready_url = f"{url}/models"
    process.wait_ready(30)
    return process, url


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def db_upgrade(config: Path, env: dict[str, str] | None = None) -> None:
    """`apprentice db upgrade --config` (the migrations of the config's database), as an operator runs it."""
    done = subprocess.run(
        apprentice_argv() + ["db", "upgrade", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env=env or bench_env(),
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"`apprentice db upgrade --config {config}` exited {done.returncode}:\n"
            f"{(done.stderr or done.stdout)[-2000:]}"
        )


def start_gateway(
    config: Path,
    workdir: Path,
    *,
    name: str = "gateway",
    workers: int = 1,
    env: dict[str, str] | None = None,
    measured: bool = False,
    ready_timeout: float | None = 180.0,
) -> tuple[ManagedProcess, str]:
    """`apprentice gateway --config` on a free port: (process, its root URL, without /v1).

    Waits for /healthz unless ready_timeout is None (a bench that times the start itself)."""
    port = free_port()
    root = f"http://{HOST}:{port}"
    slug = name.replace(" ", "-")
    argv = apprentice_argv() + ["gateway", "--config", str(config), "--host", HOST, "--port", str(port)]
    if workers != 1:
        argv += ["--workers", str(workers)]
    process: ManagedProcess
    if measured:
        process = MeasuredProcess(name, argv, workdir / f"{slug}.log", env=env or bench_env())
    else:
        process = ManagedProcess(name, argv, workdir / f"{slug}.log", cwd=REPO)
        process.env = env or bench_env()
        process.start()
    process.ready_url = f"{root}/healthz"
    if ready_timeout is not None:
        process.wait_ready(ready_timeout)
    return process, root


def start_model_server(
    model_dir: Path | str, workdir: Path, served_name: str, *args: str, ready_timeout: float = 180.0
) -> tuple[ManagedProcess, str]:
    """`apprentice serve-model` on a free port: (process, its /v1 URL)."""
    port = free_port()
    argv = [
        *apprentice_argv(),
        "serve-model",
        "--model",
        str(model_dir),
        "--served-model-name",
        served_name,
        "--host",
        HOST,
        "--port",
        str(port),
        "--log-level",
        "warning",
        *args,
    ]
    process = ManagedProcess(
        "local inference server", argv, workdir / f"serve-model-{port}.log", cwd=REPO, ready_url=None
    )
    process.env = bench_env()
    process.start()
    process.ready_url = f"http://{HOST}:{port}/health"
    process.wait_ready(ready_timeout)
    return process, f"http://{HOST}:{port}/v1"


def start_up(
    config: Path, workdir: Path, *, env: dict[str, str] | None = None, timeout_s: float = 900
) -> ManagedProcess:
    """`apprentice up --config`, returned once it logs "Apprentice is up" (its database, inference
    server, gateway and learner started)."""
    up = ManagedProcess(
        "apprentice up",
        [sys.executable, "-m", "apprentice.cli", "up", "--config", str(config)],
        workdir / "up.log",
        env=env or bench_env(),
        inherit_env=False,
        cwd=REPO,
    )
    up.start()
    deadline = time.monotonic() + timeout_s
    while "Apprentice is up" not in up.log_text():
        if not up.alive() or time.monotonic() > deadline:
            up.stop()
            raise RuntimeError(f"apprentice up did not start:\n{up.log_text()[-3000:]}")
        time.sleep(0.5)
    return up


# --------------------------------------------------------------------------- databases


def pg_connect(url: str, **kwargs: Any) -> Any:
    import psycopg

    return psycopg.connect(url, connect_timeout=5, **kwargs)


def database_url(admin_url: str, name: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


def recreate_database(admin_url: str, name: str) -> str:
    """An empty database `name` (dropped first if it exists); returns its URL."""
    with pg_connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return database_url(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    try:
        with pg_connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except Exception as exc:  # noqa: BLE001 - cleanup must not hide the results
        log(f"could not drop database {name}: {exc}")


@contextlib.contextmanager
def scratch_database(prefix: str, admin_url: str = ADMIN_URL, *, migrate: bool = True) -> Iterator[str]:
    """A new database `<prefix>_<random>` (migrated to head unless migrate=False), dropped on exit."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    url = recreate_database(admin_url, name)
    try:
        if migrate:
            from apprentice.store.schema import upgrade

            upgrade(url)
        yield url
    finally:
        drop_database(admin_url, name)
