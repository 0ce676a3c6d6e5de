"""From the model name a client calls to the ordered list of upstreams to try.

Deployments that share a `model_name` are rotated round-robin; LiteLLM-style fallbacks
follow. A policy's calls go to its inference endpoints (vLLM or the local server).

A policy that names a teacher (docs/distillation.md) is served by the teacher's deployments
while none of its versions is promoted (`teacher_plan`; the handler decides per call, since
the canary's share still goes to the policy's endpoints); after takeover the teacher follows
the policy's own endpoints as a fallback when `teacher.fallback` is set.

A policy's endpoints may include DNS names (apprentice/discovery): its targets are rebuilt from
the directory's last resolved addresses by `update_endpoints`, which the gateway's discovery
worker calls after each refresh; `plan` only reads the current list. A policy whose names never
resolved (and that has no fixed endpoint) has no target: its calls get a 503 naming it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

from apprentice.discovery.directory import EndpointDirectory
from apprentice.discovery.entries import dns_names
from apprentice.settings import ModelEntry, PolicySettings, Settings, resolve_secret
from gateway.http.errors import GatewayError

WILDCARD = "*"


@dataclass(slots=True)
class UpstreamTarget:
    """One place a call can be sent. `api_key` is held in memory only, never recorded."""

    name: str  # for metrics and the record: model_name, or policy@endpoint
    direct: bool
    api_base: str
    upstream_model: str
    api_key: str | None
    timeout: float
    litellm_model: str | None = None
    litellm_params: dict[str, Any] = field(default_factory=dict)
    # Protocols besides chat completions the upstream speaks itself (forwarded byte for byte),
    # at native_api_base (e.g. https://api.anthropic.com/v1 for Anthropic's Messages).
    protocols: frozenset[str] = frozenset()
    native_api_base: str = ""
    # Set on a copy of the target made to forward a native protocol: its headers exactly.
    native_headers: dict[str, str] | None = None
    # A policy's teacher (a hosted model): asked for its own model, never for an adapter.
    teacher: bool = False

    def headers(self) -> dict[str, str]:
        if self.native_headers is not None:
            return self.native_headers
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers


@dataclass(slots=True)
class RoutePlan:
    model: str
    policy: PolicySettings | None
    targets: list[UpstreamTarget]  # the model's own deployments first, then its fallbacks
    primary_count: int
    # The policy's call goes to its teacher (no promoted version yet): no policy sampling settings.
    teacher: bool = False


class UnknownModel(LookupError):
    pass


class EndpointsUnresolved(GatewayError):
    """A policy whose endpoints are DNS names none of which has resolved yet: no target."""

    def __init__(self, policy: str, names: list[str]) -> None:
        super().__init__(
            503,
            f"The model `{policy}` has no inference endpoint yet: its endpoint name(s) "
            f"{', '.join(names) or '(none)'} have not resolved to any address. Retry shortly.",
            code="policy_endpoints_unresolved",
        )
        self.policy = policy


def _target_from_entry(entry: ModelEntry, default_timeout: float) -> UpstreamTarget:
    params = entry.litellm_params
    return UpstreamTarget(
        name=entry.model_name,
        direct=entry.is_direct,
        api_base=entry.api_base,
        upstream_model=params.upstream_model,
        api_key=resolve_secret(params.api_key),
        timeout=params.timeout or default_timeout,
        litellm_model=params.model,
        litellm_params={k: v for k, v in params.extra_params.items()},
        protocols=entry.native_protocols,
        native_api_base=entry.native_api_base,
    )


def _targets_from_policy(policy: PolicySettings, endpoints: list[str]) -> list[UpstreamTarget]:
    api_key = resolve_secret(policy.api_key)
    return [
        UpstreamTarget(
            name=f"{policy.name}@{endpoint}",
            direct=True,
            api_base=endpoint,
            upstream_model=policy.base_model,
            api_key=api_key,
            timeout=policy.timeout,
        )
        for endpoint in endpoints
    ]


class Router:
    """Resolved once at start; `plan` is called on every request and only rotates lists."""

    def __init__(self, settings: Settings, directory: EndpointDirectory | None = None) -> None:
        self.settings = settings
        # The policies with DNS entries, whose targets follow the directory (`update_endpoints`).
        self.directory = directory or EndpointDirectory(settings.endpoint_discovery)
        self.dynamic_policies = [policy for policy in settings.policies if dns_names(policy.endpoints)]
        self._generation = self.directory.generation
        timeout = settings.router_settings.timeout
        self._deployments: dict[str, list[UpstreamTarget]] = {}
        for entry in settings.model_list:
            self._deployments.setdefault(entry.model_name, []).append(_target_from_entry(entry, timeout))
        self._policies = {policy.name: policy for policy in settings.policies}
        for policy in settings.policies:
            if policy.endpoints:
                self._deployments[policy.name] = _targets_from_policy(policy, self.directory.endpoints(policy))
        # A teacher's deployments marked as such, built once: `plan` appends them as the policy's
        # last fallback in their fixed order, and only `teacher_plan` rotates them, so a call the
        # teacher serves advances the rotation once (building the plan advanced it twice, and with
        # two deployments every first attempt went to the same one).
        self._teacher_deployments = {
            policy.teacher.model: [replace(target, teacher=True) for target in self._deployments[policy.teacher.model]]
            for policy in settings.policies
            if policy.teacher is not None and policy.teacher.model in self._deployments
        }
        self._cursors = {name: itertools.count() for name in self._deployments}
        self._teacher_cursors = {name: itertools.count() for name in self._teacher_deployments}
        default = settings.default_upstream or (settings.model_list[0].model_name if settings.model_list else None)
        self.default_target = self._deployments[default][0] if default else None

    def update_endpoints(self) -> dict[str, list[str]]:
        """Rebuild the targets of policies with DNS entries from the directory; returns the
        endpoints of each policy whose set changed. A new list replaces the old in one
        assignment, so a `plan` in progress keeps the list it read."""
        if self.directory.generation == self._generation:
            return {}
        self._generation = self.directory.generation
        changed: dict[str, list[str]] = {}
        for policy in self.dynamic_policies:
            endpoints = self.directory.endpoints(policy)
            if endpoints != [target.api_base for target in self._deployments[policy.name]]:
                self._deployments[policy.name] = _targets_from_policy(policy, endpoints)
                changed[policy.name] = endpoints
        return changed

    def endpoints_of(self, policy: str) -> list[str]:
        """The base URLs a policy's calls go to now."""
        return [target.api_base for target in self._deployments.get(policy, [])]

    @property
    def model_names(self) -> list[str]:
        return [name for name in self._deployments if name != WILDCARD]

    def _rotated(self, name: str) -> list[UpstreamTarget]:
        targets = self._deployments[name]
        if len(targets) <= 1:
            return list(targets)
        start = next(self._cursors[name]) % len(targets)
        return targets[start:] + targets[:start]

    def plan(self, model: str) -> RoutePlan:
        if model not in self._deployments:
            if WILDCARD not in self._deployments:
                raise UnknownModel(model)
            # LiteLLM's `model_name: "*"`: any other name goes to that provider as it is.
            targets = [
                replace(
                    target,
                    upstream_model=model,
                    name=model,
                    litellm_model=(target.litellm_model or "").replace(WILDCARD, model),
                )
                for target in self._rotated(WILDCARD)
            ]
            return RoutePlan(model=model, policy=None, targets=targets, primary_count=len(targets))
        targets = self._rotated(model)
        primary_count = len(targets)
        policy = self._policies.get(model)
        if not targets and policy is not None and policy.teacher is None:
            raise EndpointsUnresolved(policy.name, self.directory.unresolved(policy))
        for fallback in self.settings.router_settings.fallbacks_for(model):
            if fallback in self._deployments:
                targets.extend(self._rotated(fallback))
        if policy is not None and policy.teacher is not None and policy.teacher.fallback:
            targets.extend(self._teacher_deployments[policy.teacher.model])
        return RoutePlan(model=model, policy=policy, targets=targets, primary_count=primary_count)

    def _teacher_targets(self, name: str) -> list[UpstreamTarget]:
        targets = self._teacher_deployments[name]
        if len(targets) == 1:
            return list(targets)
        start = next(self._teacher_cursors[name]) % len(targets)
        return targets[start:] + targets[:start]

    def teacher_plan(self, plan: RoutePlan) -> RoutePlan:
        """The plan of a policy's call that its teacher answers (the teacher's own fallbacks after it)."""
        assert plan.policy is not None and plan.policy.teacher is not None
        name = plan.policy.teacher.model
        targets = self._teacher_targets(name)
        primary_count = len(targets)
        for fallback in self.settings.router_settings.fallbacks_for(name):
            if fallback in self._deployments:
                targets.extend(self._rotated(fallback))
        return RoutePlan(plan.model, plan.policy, targets, primary_count, teacher=True)

    def target_for_other_endpoint(self, model: str | None) -> UpstreamTarget | None:
        """Embeddings and the like: the deployment of that model name, else the default."""
        if model and model in self._deployments:
            targets = self._rotated(model)
            if not targets:
                raise EndpointsUnresolved(model, self.directory.unresolved(self._policies[model]))
            return targets[0]
        return self.default_target
