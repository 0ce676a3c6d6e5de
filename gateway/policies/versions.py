"""Which adapter version serves a policy's call: the canary's share, the promoted version
otherwise, and the base model while nothing is promoted.

Every gateway process re-reads the serving versions when the lifecycle announces a transition
(NOTIFY, see notifications.py: a few milliseconds after the commit) and polls them anyway (one
small query a second), so that a missed notification or a status changed by hand costs at most
a second. No restart, and calls in flight are not touched. The request path only reads this
process's memory.

The canary is an experiment whose unit is the run: each unit is put in the canary's arm with
probability equal to the canary share, independently of its prompt, so that both arms see the
same mix of tasks (apprentice/promotion/sequential.py compares them). The unit is the client's
group when it names one (a GRPO group stays on one version), else the run's trajectory id (the
client's, derived from its name by a keyed hash, or the gateway's, random). The draw is a hash
of the unit and the experiment, the id of the live lineage's first version
(apprentice.promotion.lineage): every process and replica that knows the unit draws the same
arm with no shared state, every version of one lineage keeps the unit in that arm, and each
new lineage (after a promotion or a rejection) draws afresh. A unit is never derived from the
prompt: hashing the messages put every run of one prompt in one arm, and with a few repeating
prompts the arms compared prompts, not versions.

Why the experiment and not the canary's version: the canary follows its lineage to each new
version, seconds apart on a live loop, and a client's group of runs spans seconds too. Drawn
with the canary's version, a group whose runs straddled a move drew afresh half-way: on a live
loop with runs of two calls in named groups of 8, 17 of 43 groups had runs in both arms (9 of
86 with single calls), so the group was no longer one unit, its GRPO comparison mixed
versions, and the lineage's comparison read the other arm's rewards into a unit. A group also
keeps the version its first run got, on the process that served it, while that version serves
or is kept for `sticky_grace_s` (`_groups`); on another process a later run of the group gets
the same arm, served by the canary as it is there.

The run records the arm drawn at its first call, the version it pointed to and the share
(`Choice`, stored on its trajectory), and the analysis is by that assigned arm: a later call of
the run that is served otherwise still counts in the arm it was assigned.

Stickiness: a run stays on the version that served its first call. The stitch index remembers
the version of each open trajectory on this process; a later call whose trajectory id is known
(the client's id, `previous_response_id`) draws the same arm on any process; a call continuing
another process's run by content alone starts a provisional trajectory and draws with that id
(docs/operations-promotion.md says how often that misses, and what a miss costs: it dilutes the
comparison, it never biases it).

A run keeps the version it started on when the canary moves on to a newer version of its
lineage (or any version stops serving): this process remembers when each version it served
stopped serving, and keeps a sticky run on it for `sticky_grace_s` of its policy afterwards.
The promotion job unloads a version only `unload_grace_s` after it stopped serving, so a grace
of half that leaves the endpoints holding the adapter for every call routed to it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.promotion.lineage import LINEAGE_STATUSES, lineage_head, lineage_versions
from apprentice.promotion.rows import AdapterVersion
from apprentice.promotion.status import SERVING, VersionStatus
from apprentice.settings import PolicySettings
from apprentice.store.tables import adapter_versions
from gateway.http.errors import GatewayError
from gateway.workers import PeriodicWorker

log = logging.getLogger(__name__)

# Read by the same poll: the serving versions and the lineage's, whose head exploration samples.
POLLED_STATUSES = tuple(sorted(status.value for status in SERVING | LINEAGE_STATUSES))

# A run stays on a version that stopped serving for this share of the policy's unload grace:
# the rest is margin for gateways that learn of the change late and calls still in flight.
STICKY_SHARE_OF_UNLOAD_GRACE = 0.5

# The named groups whose draw this process remembers (the newest; a group's runs arrive within
# seconds or minutes of each other): about 200 bytes each.
REMEMBERED_GROUPS = 16384


def sticky_graces(policies: Iterable[PolicySettings]) -> dict[str, float]:
    """Each policy's grace for runs on a version that stopped serving."""
    return {policy.name: STICKY_SHARE_OF_UNLOAD_GRACE * policy.promotion.unload_grace_s for policy in policies}


@dataclass(frozen=True, slots=True)
class ServingVersion:
    id: uuid.UUID
    name: str  # the LoRA name the inference endpoints serve it under


class VersionUnavailable(GatewayError):
    """No inference endpoint of the policy answered for the adapter version a call was routed to
    (every endpoint down, or none holds the adapter: each answered 404).

    A 503 that names the version, rather than the endpoint's 404 for a model name the client
    never asked for or a bare 502: the client called the policy, and an operator reading the
    error learns which version is missing. Which endpoints failed, and how, is for the operator's
    log (`detail`), not for the tenant's client: it names internal hosts. The call is recorded
    without a version, since none answered it (it must not count as that version's work)."""

    def __init__(self, policy: str, version: ServingVersion, detail: str) -> None:
        super().__init__(
            503,
            f"adapter version {version.name} of policy {policy} is not available at any inference endpoint",
            code="adapter_version_unavailable",
        )
        self.version = version
        self.detail = detail


@dataclass(frozen=True, slots=True)
class PolicyServing:
    promoted: ServingVersion | None = None
    canary: ServingVersion | None = None
    canary_share: float = 0.0
    # The canary's experiment: its lineage's first version (the canary's own id when the canary
    # is not in the live lineage, e.g. an older version made canary by hand).
    experiment: uuid.UUID | None = None

    def is_serving(self, version_id: uuid.UUID | None) -> bool:
        if version_id is None:
            return self.promoted is None
        return any(v is not None and v.id == version_id for v in (self.promoted, self.canary))

    def by_id(self, version_id: uuid.UUID | None) -> ServingVersion | None:
        for version in (self.promoted, self.canary):
            if version is not None and version.id == version_id:
                return version
        return None


@dataclass(frozen=True, slots=True)
class StoppedVersion:
    """A version this process saw serving a policy, and when (monotonic clock) it stopped."""

    policy: str
    version: ServingVersion
    stopped_at: float


@dataclass(frozen=True, slots=True)
class Choice:
    """The version a call goes to and, when the call drew an arm of a running canary, the draw.

    `arm` is None when nothing was drawn: no canary serves the policy, or the call continues a
    run that keeps the version it started on."""

    version: ServingVersion | None  # None: the base model
    arm: str | None = None  # "canary" | "incumbent"
    share: float | None = None  # the probability of the canary's arm at the draw


CANARY_ARM, INCUMBENT_ARM = "canary", "incumbent"


@dataclass(frozen=True, slots=True)
class GroupDraw:
    """What a named group drew with its first run on this process: later runs keep it."""

    experiment: uuid.UUID
    version: ServingVersion | None
    arm: str
    share: float


def bucket(key: bytes) -> float:
    """A uniform number in [0, 1): the same key lands in the same arm everywhere.

    The key is hashed first: a split key may be a gateway-issued UUIDv7, whose leading bytes
    are a timestamp, and reading those directly put every echoed run in the canary."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") / 2**64


class PolicyVersions:
    def __init__(
        self, engine: AsyncEngine, *, poll_interval_s: float, sticky_grace_s: Mapping[str, float] | None = None
    ) -> None:
        self.engine = engine
        self.poll_interval_s = poll_interval_s
        # policy -> how long a run stays on a version after it stopped serving (0: not at all)
        self.sticky_grace_s = dict(sticky_grace_s or {})
        self._serving: dict[str, PolicyServing] = {}
        self._stopped: dict[uuid.UUID, StoppedVersion] = {}
        self._heads: dict[str, ServingVersion | None] = {}
        self._groups: OrderedDict[bytes, GroupDraw] = OrderedDict()  # policy + unit -> its draw, newest last
        self.loaded = asyncio.Event()
        self.worker = PeriodicWorker("adapter-version-poll", self.refresh, interval_s=poll_interval_s)

    async def start(self) -> None:
        """Read the serving versions before serving; if the store does not answer, serve the
        base model and let the worker retry (with back-off) in the background."""
        await self.worker.run_once()
        self.worker.start()

    async def stop(self) -> None:
        await self.worker.stop()

    def wake(self) -> None:
        """Re-read the serving versions now (a transition was announced by NOTIFY)."""
        self.worker.wake()

    async def refresh(self) -> None:
        async with self.engine.connect() as connection:
            rows = await connection.execute(
                select(adapter_versions).where(adapter_versions.c.status.in_(POLLED_STATUSES))
            )
            serving: dict[str, dict[str, object]] = {}
            by_policy: dict[str, list[AdapterVersion]] = {}
            for row in rows:
                polled = AdapterVersion.from_row(row)
                by_policy.setdefault(polled.policy, []).append(polled)
                if not polled.status.serving:
                    continue
                entry = serving.setdefault(polled.policy, {})
                version = ServingVersion(polled.id, polled.name)
                if polled.status == VersionStatus.PROMOTED:
                    entry["promoted"] = version
                else:
                    entry["canary"] = version
                    entry["canary_share"] = float(polled.canary_share or 0.0)
        for policy, entry in serving.items():
            canary = entry.get("canary")
            if isinstance(canary, ServingVersion):
                lineage = [v.id for v in lineage_versions(by_policy.get(policy, []))]
                entry["experiment"] = lineage[0] if canary.id in lineage else canary.id
        fresh = {policy: PolicyServing(**entry) for policy, entry in serving.items()}  # type: ignore[arg-type]
        self._remember_stopped(self._serving, fresh, time.monotonic())
        self._serving = fresh
        self._heads = {
            policy: ServingVersion(head.id, head.name) if (head := lineage_head(versions)) is not None else None
            for policy, versions in by_policy.items()
        }
        self.loaded.set()

    def lineage_head(self, policy: str) -> ServingVersion | None:
        """The version the policy's next learner run continues (apprentice.promotion.lineage):
        what exploration samples, on-policy for the learner whatever the canary share. None:
        the base model."""
        return self._heads.get(policy)

    def _remember_stopped(self, before: dict[str, PolicyServing], after: dict[str, PolicyServing], now: float) -> None:
        """Note the versions that served before and do not now; forget those past their grace
        and those that serve again."""
        serving_now = {v.id for entry in after.values() for v in (entry.promoted, entry.canary) if v is not None}
        for policy, entry in before.items():
            for version in (entry.promoted, entry.canary):
                if version is not None and version.id not in serving_now and version.id not in self._stopped:
                    self._stopped[version.id] = StoppedVersion(policy, version, now)
        self._stopped = {
            version_id: stopped
            for version_id, stopped in self._stopped.items()
            if version_id not in serving_now and now - stopped.stopped_at < self.sticky_grace_s.get(stopped.policy, 0.0)
        }

    def serving(self, policy: str) -> PolicyServing:
        return self._serving.get(policy) or PolicyServing()

    def choose(
        self, policy: str, unit: bytes, sticky_version: uuid.UUID | None, sticky_known: bool, *, group: bool = False
    ) -> Choice:
        """The version for a call (None: the base model), and the arm drawn for `unit` when a
        canary serves and the call does not continue a run that keeps its version. `group`: the
        unit is a client's named group, whose later runs keep its first run's draw."""
        serving = self.serving(policy)
        if sticky_known and (kept := self._kept(policy, serving, sticky_version)) is not None:
            return Choice(kept[0])
        if serving.canary is None:
            return Choice(serving.promoted)
        experiment = serving.experiment or serving.canary.id
        remembered = policy.encode() + b"\x00" + unit if group else b""
        if group and (drawn := self._groups.get(remembered)) is not None and drawn.experiment == experiment:
            if (kept := self._kept(policy, serving, drawn.version.id if drawn.version else None)) is not None:
                return Choice(kept[0], drawn.arm, drawn.share)
        share = serving.canary_share
        arm = CANARY_ARM if bucket(experiment.bytes + unit) < share else INCUMBENT_ARM
        version = serving.canary if arm == CANARY_ARM else serving.promoted
        if group:
            self._remember_group(remembered, GroupDraw(experiment, version, arm, share))
        return Choice(version, arm, share)

    def _kept(
        self, policy: str, serving: PolicyServing, version_id: uuid.UUID | None
    ) -> tuple[ServingVersion | None] | None:
        """The version a continuing run or group stays on, in a 1-tuple (its version may be None,
        the base model), or None when it can no longer: it neither serves nor stopped less than
        the policy's grace ago."""
        if serving.is_serving(version_id):
            return (serving.by_id(version_id),)
        if version_id is not None and (kept := self._still_kept(policy, version_id)):
            return (kept,)
        return None

    def _remember_group(self, key: bytes, draw: GroupDraw) -> None:
        self._groups[key] = draw
        self._groups.move_to_end(key)
        while len(self._groups) > REMEMBERED_GROUPS:
            self._groups.popitem(last=False)

    def _still_kept(self, policy: str, version_id: uuid.UUID) -> ServingVersion | None:
        """A version that stopped serving less than the policy's grace ago (a run keeps it)."""
        stopped = self._stopped.get(version_id)
        if stopped is None or stopped.policy != policy:
            return None
        if time.monotonic() - stopped.stopped_at >= self.sticky_grace_s.get(policy, 0.0):
            return None
        return stopped.version
