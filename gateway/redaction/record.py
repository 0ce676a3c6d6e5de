"""Redaction of a journal record, with the redaction settings of the call's policy.

Applied to every body a record stores (the chat request and answer, a translated or forwarded
call's native request and answer, the error) before the record is journaled, so neither the
journal on local disk nor PostgreSQL (nor a trace that exports content) ever holds the values.
When anything in a call was replaced, the token ids and logprobs the inference server returned
are dropped from its stored answer too: they spell the original text (a tokenizer decodes
them). The learner then trains that call on its redacted text through the chat template.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

from apprentice.settings import RedactionKinds, RedactionSettings, Settings
from gateway.redaction.redactor import Redaction, trajectory_key
from gateway.redaction.rules import Rule, compile_rules

BODY_FIELDS = ("request", "response", "native_request", "native_response", "error")
# How long after the call is handed to the upstream its request is redacted. Not at once: the
# HTTP client writes the request body from a task of its own, which a callback scheduled first
# would delay by the whole redaction (measured: the cost then showed in full against a 20 ms
# upstream). An upstream that answers sooner than this finds the work not done: the record then
# redacts the request itself, as it would without this.
EARLY_DELAY_S = 0.001
# Calls whose early redaction waits for their record; past this the oldest are dropped (a call
# that never reaches its record, e.g. a client gone mid-call, must not hold memory).
MAX_EARLY = 10_000
ANSWER_TOKEN_FIELDS = ("prompt_token_ids", "prompt_logprobs")
CHOICE_TOKEN_FIELDS = ("token_ids",)


def effective_kinds(gateway: RedactionSettings, policy: RedactionKinds | None) -> RedactionKinds:
    """A policy's redaction: the gateway's, with the fields the policy sets, plus its rules."""
    if policy is None:
        return gateway
    update: dict[str, Any] = {name: getattr(policy, name) for name in policy.model_fields_set if name != "rules"}
    update["rules"] = [*gateway.rules, *policy.rules]
    return RedactionKinds.model_validate({**gateway.model_dump(exclude={"key", "rules"}), **update})


def without_tokens(answer: Any) -> Any:
    """A stored chat answer without the token ids and logprobs that spell its original text."""
    if not isinstance(answer, dict):
        return answer
    stripped = {name: value for name, value in answer.items() if name not in ANSWER_TOKEN_FIELDS}
    choices = answer.get("choices")
    if isinstance(choices, list):
        stripped["choices"] = [
            {
                **{name: value for name, value in choice.items() if name not in CHOICE_TOKEN_FIELDS},
                **({"logprobs": None} if "logprobs" in choice else {}),
            }
            if isinstance(choice, dict)
            else choice
            for choice in choices
        ]
    return stripped


class RecordRedactor:
    """Redacts journal records: one rule set per policy, the gateway's for every other call."""

    def __init__(self, settings: Settings, key: bytes) -> None:
        self.key = key
        self._early: OrderedDict[str, _Early] = OrderedDict()
        self.default = self._rules(settings.redaction)
        self.by_policy = {
            policy.name: self._rules(effective_kinds(settings.redaction, policy.redaction))
            for policy in settings.policies
        }

    @staticmethod
    def _rules(kinds: RedactionKinds) -> list[Rule]:
        return compile_rules(kinds) if kinds.enabled else []

    @property
    def active(self) -> bool:
        return bool(self.default) or any(self.by_policy.values())

    def rules_for(self, policy: str | None) -> list[Rule]:
        return self.by_policy.get(policy, self.default) if policy is not None else self.default

    def early(self, call_id: str, trajectory_id: str, policy: str | None, *bodies: Any) -> None:
        """Redact a call's request bodies in EARLY_DELAY_S, while the upstream works on the call;
        `apply` on its record takes the results."""
        rules = self.rules_for(policy)
        if not rules:
            return
        entry = _Early(trajectory_id, bodies)
        self._early[call_id] = entry
        while len(self._early) > MAX_EARLY:
            self._early.popitem(last=False)
        entry.handle = asyncio.get_running_loop().call_later(EARLY_DELAY_S, entry.run, rules, self.key)

    def apply(self, record: dict[str, Any]) -> dict[str, Any]:
        """The record with its bodies redacted: a new dict when anything was, else `record`."""
        early = self._early.pop(str(record.get("id")), None) if self._early else None
        if early is not None and early.results is None and early.handle is not None:
            early.handle.cancel()  # the call ended before the loop got to it: redacted below instead
        rules = self.rules_for(record.get("policy"))
        if not rules:
            return record
        trajectory_id = str(record.get("trajectory_id"))
        redaction = Redaction(rules, trajectory_key(self.key, trajectory_id))
        changed: dict[str, Any] = {}
        for field in BODY_FIELDS:
            value = record.get(field)
            if value is None:
                continue
            redacted = early.result(value, trajectory_id, redaction) if early is not None else None
            if redacted is None:
                redacted = redaction.body(value)
            if redacted is not value:
                changed[field] = redacted
        if not changed:
            return record
        result = {**record, **changed}
        if redaction.count:
            result["response"] = without_tokens(result.get("response"))
        return result


class _Early:
    """A call's request bodies and, once `run`, their redacted forms."""

    __slots__ = ("trajectory_id", "bodies", "results", "count", "handle")

    def __init__(self, trajectory_id: str, bodies: tuple[Any, ...]) -> None:
        self.trajectory_id = trajectory_id
        self.bodies = bodies
        self.results: list[Any] | None = None
        self.count = 0
        self.handle: asyncio.Handle | None = None

    def run(self, rules: list[Rule], key: bytes) -> None:
        redaction = Redaction(rules, trajectory_key(key, self.trajectory_id))
        self.results = [redaction.body(body) if body is not None else None for body in self.bodies]
        self.count = redaction.count

    def result(self, body: Any, trajectory_id: str, into: Redaction) -> Any:
        """The redacted form of `body` if it was redacted early, for the same trajectory (a
        stitch may not move a call, but be sure); its replacements count into `into`. None: not."""
        if self.results is None or trajectory_id != self.trajectory_id:
            return None
        for index, source in enumerate(self.bodies):
            if source is body:
                redacted = self.results[index]
                if redacted is not body:
                    into.count += self.count  # any early replacement means the call was redacted
                return redacted
        return None
