"""Faults on the learning side (issue 15): the learner SIGKILLed during a run and during the
adapter save, and PostgreSQL going away during a run.

Real PostgreSQL, the tiny random model as the base, real training. The learner that is killed
runs in its own process (`DRIVER`), held at the moment to kill by a patch that writes a marker
file and sleeps; the test kills it with SIGKILL there. The database outage goes through a TCP
proxy in front of the shared server (tests/support/tcp_proxy.py), never the server itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from learner.jobs import run as run_module
from learner.jobs.run import run_once
from tests.conftest import wait_for
from tests.support.runs import populate, settings_for, trained
from tests.support.tcp_proxy import CuttableProxy

ROOT = Path(__file__).resolve().parents[2]

# The learner, held where the test kills it: while training, with the adapter written under its
# temporary name (before the rename), or renamed into place with the final transaction open.
DRIVER = r"""
import os, sys, time
from pathlib import Path

stage, marker, database_url, data_dir, base = sys.argv[1:6]


def hold(what):
    Path(marker).write_text(str(what))
    time.sleep(600)


from learner.jobs import run as run_module

if stage == "train":
    run_module._train = lambda run, *args, **kwargs: hold(run.run_id)
elif stage == "save":
    from learner.grpo import adapters

    real_replace = os.replace

    def held_replace(source, target):
        if Path(source).name.startswith(adapters.TMP_PREFIX):
            hold(source)
        return real_replace(source, target)

    os.replace = held_replace
elif stage == "commit":
    from apprentice.promotion import lifecycle

    real_record = lifecycle.record_candidate

    def held_record(connection, candidate):
        real_record(connection, candidate)  # the rows are written, the transaction is not committed
        hold(candidate.path)

    lifecycle.record_candidate = held_record

from tests.support.runs import settings_for

print(run_module.run_once(settings_for(database_url, Path(data_dir), base), "p"), flush=True)
"""


def adapters_of(data_dir: Path) -> list[str]:
    directory = data_dir / "adapters" / "p"
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


def kill_learner_at(stage: str, database_url: str, data_dir: Path, base: str, tmp_path: Path) -> str:
    """Start a learner run in its own process, wait until it is held at `stage`, SIGKILL it."""
    marker = tmp_path / f"held-{stage}"
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    log = (tmp_path / f"learner-{stage}.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, str(driver), stage, str(marker), database_url, str(data_dir), base],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(
            lambda: marker.exists() or process.poll() is not None, timeout=150, interval=0.2, message=f"held: {stage}"
        )
        assert process.poll() is None, (tmp_path / f"learner-{stage}.log").read_text()[-3000:]
        held = marker.read_text()
        process.send_signal(signal.SIGKILL)
        assert process.wait(30) == -signal.SIGKILL
        return held
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
        log.close()


def run_after_kill(database_url: str, data_dir: Path, base: str):
    """The next run; PostgreSQL drops the killed learner's session (and its lock) within moments."""
    settings = settings_for(database_url, data_dir, base)
    outcome = wait_for(
        lambda: (o := run_once(settings, "p")).status != "busy" and o, timeout=30, interval=0.5, message="lock freed"
    )
    return outcome


@pytest.mark.parametrize("stage", ["train", "save", "commit"])
def test_a_learner_killed_leaves_no_version_and_the_next_run_retries(
    stage,
    database_url,
    db,
    base,
    tmp_path,
):
    ids = populate(db, base)
    data_dir = tmp_path / "data"
    held = kill_learner_at(stage, database_url, data_dir, base, tmp_path)

    # Nothing half-done is visible: the run row says running (its process is gone), no version
    # row, no transition, no trajectory marked trained.
    assert db.execute("SELECT status FROM training_runs").fetchall() == [("running",)]
    assert db.execute("SELECT count(*) FROM adapter_versions").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM adapter_transitions").fetchone()[0] == 0
    assert trained(db, ids["useful"] + ids["equal"]) == [None] * 7
    leftovers = adapters_of(data_dir)
    if stage == "train":
        assert leftovers == []
    elif stage == "save":  # whole files under the temporary name only: never under a version's name
        assert len(leftovers) == 1 and leftovers[0].startswith(".tmp-p-v1-") and Path(held).name == leftovers[0]
    else:  # renamed into place, but the version row died with the transaction
        assert leftovers == ["p-v1"] and held.endswith("p-v1")

    retry = run_after_kill(database_url, data_dir, base)
    assert retry.status == "succeeded", retry.error
    assert retry.version_name == "p-v1"
    # The leftovers are gone; the one directory is the new version's, complete.
    assert adapters_of(data_dir) == ["p-v1"]
    version = Path(db.execute("SELECT path FROM adapter_versions").fetchone()[0])
    assert (version / "adapter_config.json").is_file() and (version / "adapter_model.safetensors").is_file()
    assert trained(db, ids["useful"]) == [retry.run_id] * 4, "the retry trained on the same data"
    runs = dict(db.execute("SELECT status, error FROM training_runs").fetchall())
    assert runs.keys() == {"failed", "succeeded"}
    assert "interrupted" in runs["failed"], "the killed run is closed, and says why"


def test_postgresql_gone_during_a_run_leaves_the_previous_state_and_says_so(
    database_url,
    db,
    base,
    tmp_path,
    monkeypatch,
):
    ids = populate(db, base)
    url = make_url(database_url)
    proxy = CuttableProxy(url.host or "127.0.0.1", url.port or 5432).start()
    via_proxy = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    real_train = run_module._train
    restored: list[float] = []

    def train_through_an_outage(run, *args, **kwargs):
        proxy.cut()  # every connection through the proxy drops, as in a restart of the server
        result = real_train(run, *args, **kwargs)

        def restore_later() -> None:  # back while the learner tries to say what happened
            time.sleep(1.0)
            proxy.restore()
            restored.append(time.monotonic())

        import threading

        threading.Thread(target=restore_later, daemon=True).start()
        return result

    monkeypatch.setattr(run_module, "_train", train_through_an_outage)
    try:
        outcome = run_once(settings_for(via_proxy, tmp_path, base), "p")  # never raises for a failed run
    finally:
        monkeypatch.setattr(run_module, "_train", real_train)
    try:
        assert outcome.status == "failed"
        assert outcome.error.startswith("database connection lost: ") and "the next run retries" in outcome.error
        # The previous state: no version, nothing marked, no files; the run row says what happened.
        assert db.execute("SELECT count(*) FROM adapter_versions").fetchone()[0] == 0
        assert trained(db, ids["useful"]) == [None] * 4
        assert adapters_of(tmp_path) == []
        status, error = db.execute("SELECT status, error FROM training_runs").fetchone()
        assert status == "failed" and error == outcome.error

        retry = run_once(settings_for(via_proxy, tmp_path, base), "p")
        assert retry.status == "succeeded" and retry.version_name == "p-v1", retry.error
        assert trained(db, ids["useful"]) == [retry.run_id] * 4
    finally:
        proxy.close()
