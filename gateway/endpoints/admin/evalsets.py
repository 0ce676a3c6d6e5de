"""/v1/admin/policies/{policy}/eval-sets: evaluation sets, their items, their runs.

An operator registers a held-out set per policy (docs/evaluation-sets.md): items given outright,
or recorded trajectories picked by id or by a query (snapshots of their last call's
conversation), each scored by an expected answer, the judge or a reward function. Runs are made
by `apprentice eval` and by the promotion's evaluation gate; they are listed here read-only.
"""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request, Response

from apprentice.evalsets import store
from apprentice.settings import PolicySettings
from gateway.endpoints.admin.protocol import (
    EvalItemOut,
    EvalItemsAddedOut,
    EvalItemsIn,
    EvalRunOut,
    EvalSetDetailOut,
    EvalSetIn,
    EvalSetListOut,
    EvalSetOut,
)
from gateway.endpoints.admin.routes import _admin
from gateway.http.documented import ADMIN, error_responses
from gateway.http.errors import GatewayError
from gateway.state import GatewayState

router = APIRouter(tags=["admin"], dependencies=[ADMIN], responses=error_responses(401, 403, 404, 503))
BASE = "/v1/admin/policies/{policy}/eval-sets"


def _policy(state: GatewayState, policy: str) -> PolicySettings:
    settings = state.settings.policy(policy)
    if settings is None:
        raise GatewayError(404, f"policy {policy!r} is not configured", param="policy", code="policy_not_found")
    return settings


async def _set(state: GatewayState, policy: str, name: str) -> store.EvalSet:
    try:
        return await store.get_set(state.engine, policy, name)
    except store.SetNotFound as exc:
        raise GatewayError(404, str(exc), param="name", code="eval_set_not_found") from None


def _out(eval_set: store.EvalSet, policy: PolicySettings) -> EvalSetOut:
    gate = policy.promotion.eval_gate
    return EvalSetOut.model_validate(eval_set).model_copy(
        update={"gate": gate is not None and gate.set == eval_set.name}
    )


@router.get(BASE, response_model=EvalSetListOut, summary="A policy's evaluation sets")
async def list_eval_sets(request: Request, policy: str) -> EvalSetListOut:
    state, _ = await _admin(request)
    settings = _policy(state, policy)
    return EvalSetListOut(data=[_out(s, settings) for s in await store.list_sets(state.engine, policy)])


@router.post(
    BASE,
    response_model=EvalSetOut,
    status_code=201,
    summary="Register an evaluation set",
    responses=error_responses(409, s409="The policy already has a set of that name."),
)
async def create_eval_set(request: Request, policy: str, body: EvalSetIn) -> EvalSetOut:
    state, actor = await _admin(request)
    settings = _policy(state, policy)
    try:
        created = await store.create_set(
            state.engine,
            policy,
            body.name,
            body.scoring.model_dump(),
            description=body.description,
            created_by=actor,
        )
    except store.SetExists as exc:
        raise GatewayError(409, str(exc), param="name", code="eval_set_exists") from None
    return _out(created, settings)


@router.get(BASE + "/{name}", response_model=EvalSetDetailOut, summary="An evaluation set with its items and runs")
async def show_eval_set(request: Request, policy: str, name: str) -> EvalSetDetailOut:
    state, _ = await _admin(request)
    settings = _policy(state, policy)
    eval_set = await _set(state, policy, name)
    items = await store.items_of(state.engine, eval_set.id)
    runs = await store.runs_of(state.engine, set_id=eval_set.id)
    return EvalSetDetailOut(
        **_out(eval_set, settings).model_dump(exclude={"object"}),
        item_list=[EvalItemOut.model_validate(item) for item in items],
        runs=[EvalRunOut.model_validate(run) for run in runs],
    )


@router.delete(BASE + "/{name}", status_code=204, summary="Delete an evaluation set, its items and runs")
async def delete_eval_set(request: Request, policy: str, name: str) -> Response:
    state, _ = await _admin(request)
    _policy(state, policy)
    await _set(state, policy, name)
    try:
        await store.delete_set(state.engine, policy, name)
    except store.SetNotFound as exc:
        raise GatewayError(404, str(exc), param="name", code="eval_set_not_found") from None
    return Response(status_code=204)


@router.post(
    BASE + "/{name}/items",
    response_model=EvalItemsAddedOut,
    status_code=201,
    summary="Add items: given outright, recorded trajectories by id, or by a query",
)
async def add_eval_items(request: Request, policy: str, name: str, body: EvalItemsIn) -> EvalItemsAddedOut:
    state, _ = await _admin(request)
    settings = _policy(state, policy)
    eval_set = await _set(state, policy, name)
    new = [store.NewItem(item.messages, item.scoring.model_dump() if item.scoring else None) for item in body.items]
    missing: list[uuid.UUID] = []
    scoring = body.scoring.model_dump() if body.scoring else None
    if body.trajectory_ids:
        found, missing = await store.trajectory_items(state.engine, policy, ids=body.trajectory_ids, scoring=scoring)
        new.extend(found)
    if body.query is not None:
        query = store.TrajectoryQuery(
            since=body.query.since,
            until=body.query.until,
            reward_name=body.query.reward_name or settings.learning.reward_name,
            min_reward=body.query.min_reward,
            max_reward=body.query.max_reward,
            limit=body.query.limit,
        )
        found, _ = await store.trajectory_items(state.engine, policy, query=query, scoring=scoring)
        new.extend(found)
    added = await store.add_items(state.engine, eval_set.id, new)
    return EvalItemsAddedOut(data=[EvalItemOut.model_validate(item) for item in added], missing_trajectory_ids=missing)


@router.delete(BASE + "/{name}/items/{item_id}", status_code=204, summary="Remove an item from an evaluation set")
async def delete_eval_item(request: Request, policy: str, name: str, item_id: uuid.UUID) -> Response:
    state, _ = await _admin(request)
    _policy(state, policy)
    eval_set = await _set(state, policy, name)
    if not await store.delete_item(state.engine, eval_set.id, item_id):
        raise GatewayError(
            404, f"evaluation set {name!r} has no item {item_id}", param="item_id", code="eval_item_not_found"
        )
    return Response(status_code=204)
