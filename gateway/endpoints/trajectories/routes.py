"""GET /v1/trajectories/{id} (the key's own tenant; admin: any) and GET /v1/trajectories (admin)."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Query, Request, Response

from gateway.endpoints.trajectories.protocol import (
    TrainedVersionOut,
    TrajectoryDeletedOut,
    TrajectoryListOut,
    TrajectoryOut,
    trajectory_list_out,
    trajectory_out,
)
from gateway.http.documented import ADMIN, CLIENT, error_responses
from gateway.http.errors import GatewayError
from gateway.http.responses import model_response
from gateway.http.timestamps import QueryTimestamp, timestamp_schema
from gateway.state import GatewayState
from gateway.store.deletion import delete_trajectory
from gateway.store.trajectories import get_trajectory, list_trajectories
from gateway.trajectories.stitching import trajectory_id_for_client

router = APIRouter(tags=["trajectories"], responses=error_responses(401, 503))
NOT_FOUND = error_responses(404, s404="No such trajectory for this key.")


def _state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


@router.get(
    "/v1/trajectories/{trajectory_id}",
    response_model=TrajectoryOut,
    summary="One trajectory with its calls and rewards",
    description=(
        "Addressed by the gateway's trajectory id, an alias (a trajectory merged into another "
        "answers as the one it joined) or the client's own trajectory id. A client key sees its "
        "own tenant's trajectories only."
    ),
    dependencies=[CLIENT],
    responses=NOT_FOUND,
)
async def get_one(
    request: Request,
    trajectory_id: str,
    history: bool = Query(False, description="Include superseded and rejected rewards."),
) -> Response:
    state = _state(request)
    key = await state.authenticate(request.scope)
    candidates = _candidates(trajectory_id, trajectory_id_for_client(state.instance_secret, key.tenant, trajectory_id))
    found = await get_trajectory(state.engine, candidates, None if key.is_admin else key.tenant, history=history)
    if found is None:
        raise GatewayError(404, f"no trajectory {trajectory_id!r}", param="trajectory_id", code="not_found")
    return model_response(trajectory_out(found))


@router.delete(
    "/v1/trajectories/{trajectory_id}",
    response_model=TrajectoryDeletedOut,
    summary="Delete a trajectory with its calls and rewards",
    description=(
        "Addressed like GET (the gateway's id, an alias, or the client's own id); a client key deletes its own "
        "tenant's trajectories only. Untrained data is gone for the learner; adapter versions already trained "
        "on it are listed."
    ),
    dependencies=[CLIENT],
    responses=NOT_FOUND,
)
async def delete_one(request: Request, trajectory_id: str) -> Response:
    state = _state(request)
    key = await state.authenticate(request.scope)
    candidates = _candidates(trajectory_id, trajectory_id_for_client(state.instance_secret, key.tenant, trajectory_id))
    deleted = await delete_trajectory(state.engine, candidates, None if key.is_admin else key.tenant)
    if deleted is None:
        raise GatewayError(404, f"no trajectory {trajectory_id!r}", param="trajectory_id", code="not_found")
    answer = TrajectoryDeletedOut(
        id=str(deleted.trajectory_id),
        aliases=[str(alias) for alias in deleted.aliases],
        calls=deleted.calls,
        rewards=deleted.rewards,
        trained_into=[TrainedVersionOut(**row) for row in deleted.trained_into],
    )
    return model_response(answer)


def _candidates(trajectory_id: str, as_client_id: uuid.UUID) -> list[uuid.UUID]:
    """What `trajectory_id` may name, in order: a gateway id (or alias), else the client's own id."""
    candidates: list[uuid.UUID] = []
    try:
        candidates.append(uuid.UUID(trajectory_id))
    except ValueError:
        pass
    if as_client_id not in candidates:
        candidates.append(as_client_id)
    return candidates


@router.get(
    "/v1/trajectories",
    response_model=TrajectoryListOut,
    summary="List trajectories (admin)",
    description="Newest first by last call; merged aliases are left out. Page with `starting_after`.",
    dependencies=[ADMIN],
    responses=error_responses(403),
)
async def list_all(
    request: Request,
    policy: str | None = Query(None),
    model: str | None = Query(None),
    tenant: str | None = Query(None),
    since: QueryTimestamp | None = Query(
        None,
        description="Last call at or after (RFC 3339, UTC when no offset, or unix seconds).",
        json_schema_extra=timestamp_schema,
    ),
    until: QueryTimestamp | None = Query(
        None,
        description="Last call before (RFC 3339, UTC when no offset, or unix seconds).",
        json_schema_extra=timestamp_schema,
    ),
    rewarded: bool | None = Query(
        None, description="Only trajectories with (true) or without (false) a current reward named `reward_name`."
    ),
    reward_name: str = Query("reward"),
    group_id: str | None = Query(None),
    starting_after: uuid.UUID | None = Query(None, description="The last id of the previous page."),
    limit: int = Query(100, ge=1, le=1000),
) -> Response:
    state = _state(request)
    await state.authenticate(request.scope, admin=True)
    page = await list_trajectories(
        state.engine,
        tenant=tenant,
        policy=policy,
        model=model,
        since=since,
        until=until,
        rewarded=rewarded,
        reward_name=reward_name,
        group_id=group_id,
        starting_after=starting_after,
        limit=limit,
    )
    return model_response(trajectory_list_out(page))
