"""An adapter's files are missing or corrupt when it is to be loaded (issue 15).

The local inference server (the tiny model, real PEFT adapters) and PostgreSQL; the test
process plays the learner and runs the promotion job. A version whose files are gone, cut
short or unreadable is refused by the gates with a reason that names the file, no endpoint is
asked to load it, and what serves (the promoted version, at the endpoint) is not touched.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import httpx
import pytest

from apprentice.promotion import loading
from apprentice.promotion.files import adapter_files_problem
from tests.support.promotion import add_candidate, policy_config, promote_now, status_of, tick

POLICY = "files"


def gates_of(db, version_id: uuid.UUID) -> dict:
    return db.execute("SELECT gates FROM adapter_versions WHERE id = %s", (version_id,)).fetchone()[0]


def last_reason(db, version_id: uuid.UUID) -> str:
    return db.execute(
        "SELECT reason FROM adapter_transitions WHERE adapter_version_id = %s ORDER BY id DESC LIMIT 1",
        (version_id,),
    ).fetchone()[0]


def copy_adapter(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def served(local_server) -> set[str]:
    return {name for name in local_server.models() if name.startswith(f"{POLICY}-")}


def test_broken_adapter_files_are_refused_by_the_gates(local_server, tiny, db, database_url, tmp_path):
    policy = policy_config(POLICY, local_server)
    add_candidate(db, POLICY, 1, tiny.adapters[1])
    assert promote_now(database_url, policy, f"{POLICY}-v1").transition.changed
    assert served(local_server) == {f"{POLICY}-v1"}

    # A directory that is gone, weights cut short (a kill or a full disk), a config that is not JSON.
    missing = add_candidate(db, POLICY, 2, tmp_path / "never-written")
    truncated_dir = copy_adapter(tiny.adapters[2], tmp_path / "truncated")
    weights = truncated_dir / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    truncated = add_candidate(db, POLICY, 3, truncated_dir)
    bad_config_dir = copy_adapter(tiny.adapters[3], tmp_path / "bad-config")
    (bad_config_dir / "adapter_config.json").write_text('{"r": 8, "peft_type": ')
    bad_config = add_candidate(db, POLICY, 4, bad_config_dir)

    report = tick(database_url, policy)
    rejected = {a["version"] for a in report.actions if a["action"] == "rejected"}
    assert rejected == {f"{POLICY}-v2", f"{POLICY}-v3", f"{POLICY}-v4"}, report.actions
    for version_id, words in (
        (missing, "never-written does not exist"),
        (truncated, "adapter_model.safetensors is truncated"),
        (bad_config, "adapter_config.json is not readable JSON"),
    ):
        assert status_of(db, version_id) == "rejected"
        reason = last_reason(db, version_id)
        assert reason.startswith("gates failed: adapter_files: ") and words in reason, reason
        checks = {c["name"]: c for c in gates_of(db, version_id)["checks"]}
        assert checks["adapter_files"]["outcome"] == "fail" and words in checks["adapter_files"]["detail"]
        assert checks["run_finished"]["outcome"] == "pass"  # the run was fine: only the files are not
    # What serves is untouched: still promoted, still the only adapter at the endpoint.
    assert db.execute("SELECT name FROM adapter_versions WHERE status = 'promoted'").fetchall() == [(f"{POLICY}-v1",)]
    assert served(local_server) == {f"{POLICY}-v1"}

    # Files that go away after the gates passed: refused right before the load, with the file named.
    late_dir = copy_adapter(tiny.adapters[2], tmp_path / "late")
    late = add_candidate(db, POLICY, 5, late_dir)
    paused = {**policy, "promotion": {**policy["promotion"], "auto_canary": False}}
    tick(database_url, paused)
    assert gates_of(db, late)["outcome"] == "pass" and status_of(db, late) == "candidate"
    (late_dir / "adapter_model.safetensors").unlink()
    report = tick(database_url, policy)
    assert status_of(db, late) == "rejected", report.actions
    reason = last_reason(db, late)
    assert "adapter_files" in reason and f"no adapter_model.safetensors or adapter_model.bin in {late_dir}" in reason
    assert gates_of(db, late)["outcome"] == "fail"
    assert served(local_server) == {f"{POLICY}-v1"}
    assert db.execute("SELECT name FROM adapter_versions WHERE status = 'promoted'").fetchall() == [(f"{POLICY}-v1",)]

    # A whole adapter passes the same check.
    good = add_candidate(db, POLICY, 6, copy_adapter(tiny.adapters[3], tmp_path / "good"))
    tick(database_url, policy)
    assert status_of(db, good) == "canary"
    assert served(local_server) == {f"{POLICY}-v1", f"{POLICY}-v6"}
    assert {c["name"]: c["outcome"] for c in gates_of(db, good)["checks"]}["adapter_files"] == "pass"


def test_rollback_to_a_version_whose_files_are_gone_leaves_the_promoted_one(
    local_server,
    tiny,
    db,
    database_url,
    tmp_path,
):
    """An admin's rollback (from a gateway, which may not see the files): the endpoint refuses
    the load, the error names the version and the file, and nothing changes."""
    policy = policy_config("rollback", local_server)
    old_dir = copy_adapter(tiny.adapters[1], tmp_path / "old")
    old = add_candidate(db, "rollback", 1, old_dir)
    promote_now(database_url, policy, "rollback-v1")
    new = add_candidate(db, "rollback", 2, tiny.adapters[2])
    promote_now(database_url, policy, "rollback-v2")
    assert status_of(db, old) == "retired"
    # Past the grace the endpoint no longer holds it (a retired version still held would serve from memory).
    assert (
        httpx.post(f"{local_server.api_base}/unload_lora_adapter", json={"lora_name": "rollback-v1"}).status_code == 200
    )
    shutil.rmtree(old_dir)
    with pytest.raises(loading.LoadError) as refused:
        promote_now(database_url, policy, "rollback-v1")
    assert "rollback-v1" in str(refused.value) and str(old_dir) in str(refused.value) and refused.value.permanent
    assert status_of(db, old) == "retired" and status_of(db, new) == "promoted"
    assert "rollback-v2" in local_server.models()
    assert adapter_files_problem(old_dir) == f"{old_dir} does not exist"
