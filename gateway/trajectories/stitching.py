"""Which trajectory a call belongs to, decided on the request path without the database.

A run's next call carries the previous call's request and answer as the prefix of its own
messages. Each message gets a digest of its meaningful fields (role, content, tool calls,
tool_call_id, name: not the `refusal: null` and similar noise that clients add or drop), and
the digests are chained, so the key of any prefix costs one hash per message:

    key(prefix) = blake2b(key(prefix[:-1]) || digest(prefix[-1])), seeded by tenant and model.

A finished call registers `continuation_key` = key(request + answer) for each answer choice.
A new call's `parent_key` = key(messages up to its last assistant message). When this process
served the parent, the call joins its trajectory at once; otherwise it starts a provisional
trajectory with `stitch_pending`, and the shipper merges it into the parent's trajectory once
both are stored (see gateway/store/calls.py), keeping the provisional id as an alias.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

KEY_BYTES = 16


_RANDOM_POOL = bytearray()


def _random_bytes(count: int) -> bytes:
    """os.urandom, read 4 KiB at a time: one syscall per few hundred ids, not one per id."""
    global _RANDOM_POOL
    if len(_RANDOM_POOL) < count:
        _RANDOM_POOL = bytearray(os.urandom(4096))
    chunk = bytes(_RANDOM_POOL[:count])
    del _RANDOM_POOL[:count]
    return chunk


def _forget_pool_after_fork() -> None:
    _RANDOM_POOL.clear()  # a forked child must not reuse its parent's random bytes


os.register_at_fork(after_in_child=_forget_pool_after_fork)


VERSION_SHIFT, VARIANT_SHIFT = 76, 62
TAG_BITS = 32  # of a trajectory id's random bits, keyed to its tenant (see tenant_tag)


def _set_version(value: int, version: int) -> int:
    value = (value & ~(0xF << VERSION_SHIFT)) | (version << VERSION_SHIFT)
    return (value & ~(0x3 << VARIANT_SHIFT)) | (0x2 << VARIANT_SHIFT)  # RFC 9562 variant


def uuid7() -> uuid.UUID:
    """Time-ordered UUID (RFC 9562 v7): new rows land at the end of the primary-key index.

    Its 74 random bits come from the OS's CSPRNG: ids must not be guessable."""
    ms = time.time_ns() // 1_000_000
    value = (ms & ((1 << 48) - 1)) << 80 | int.from_bytes(_random_bytes(10), "big") & ((1 << 80) - 1)
    return uuid.UUID(int=_set_version(value, 7))


def tenant_tag(secret: bytes, tenant: str, value: int) -> int:
    """A keyed tag of an id's other bits and its tenant, stored in the id's low 32 bits.

    A client may echo a trajectory id back to continue its run. The tag lets any gateway
    process check, without the database, that the id was issued to the caller's tenant: an
    id of tenant A sent by tenant B fails the check and is taken as B's own client name, so
    B can neither write into A's trajectory nor learn whether A's id exists.
    """
    body = (value >> TAG_BITS).to_bytes(12, "big")
    digest = hmac.new(secret, b"trajectory-tag\x00" + tenant.encode() + b"\x00" + body, hashlib.sha256).digest()
    return int.from_bytes(digest[:4], "big")


def _tagged(secret: bytes, tenant: str, value: int, version: int) -> uuid.UUID:
    value = _set_version(value, version)
    return uuid.UUID(int=(value & ~((1 << TAG_BITS) - 1)) | tenant_tag(secret, tenant, value))


def new_trajectory_id(secret: bytes, tenant: str) -> uuid.UUID:
    """A v7 id (time-ordered) of a new trajectory, tagged for its tenant: 42 random bits
    and a 32-bit tag, where a plain v7 id has 74 random bits."""
    return _tagged(secret, tenant, uuid7().int, 7)


def issued_to(secret: bytes, tenant: str, trajectory_id: uuid.UUID) -> bool:
    """Whether this installation issued `trajectory_id` to `tenant` (v7 or v8, tag matching)."""
    if trajectory_id.version not in (7, 8):
        return False
    return trajectory_id.int & ((1 << TAG_BITS) - 1) == tenant_tag(secret, tenant, trajectory_id.int)


def trajectory_id_for_client(secret: bytes, tenant: str, client_id: str) -> uuid.UUID:
    """The gateway id of a client-named trajectory: the same on every process and replica.

    A gateway-issued id echoed back by its own tenant is taken as it is. Any other name
    (another tenant's id included) is mapped with a keyed hash (the instance secret, kept in
    PostgreSQL), so nobody can compute another tenant's trajectory id from a guessable name;
    the result is marked as UUID version 8 and tagged for the tenant like any issued id.
    """
    try:
        parsed = uuid.UUID(client_id)
    except ValueError:
        parsed = None
    if parsed is not None and issued_to(secret, tenant, parsed):
        return parsed
    digest = hmac.new(secret, f"{tenant}\x00{client_id}".encode(), hashlib.sha256).digest()
    return _tagged(secret, tenant, int.from_bytes(digest[:16], "big"), 8)


def _content_form(content: Any) -> Any:
    if content is None or content == "":
        return ""
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        texts = [part.get("text") for part in content if isinstance(part, dict) and part.get("type") == "text"]
        if len(texts) == len(content):
            return "".join(t or "" for t in texts)
    return content


def _arguments_form(arguments: Any) -> Any:
    """Tool call arguments as their JSON value: a client that parses and re-serialises them
    (Anthropic's `tool_use.input`, the Responses API's items through an SDK) changes the
    spacing, not the call."""
    if isinstance(arguments, str):
        try:
            return orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments
    return arguments


def message_digest(message: Any) -> bytes:
    if not isinstance(message, dict):
        return hashlib.blake2b(orjson.dumps(message), digest_size=KEY_BYTES).digest()
    form: list[Any] = [message.get("role"), _content_form(message.get("content"))]
    tool_calls = message.get("tool_calls")
    if tool_calls:
        form.append(
            [
                [
                    call.get("id"),
                    (call.get("function") or {}).get("name"),
                    _arguments_form((call.get("function") or {}).get("arguments")),
                ]
                for call in tool_calls
                if isinstance(call, dict)
            ]
        )
    if message.get("tool_call_id"):
        form.append(["tool_call_id", message["tool_call_id"]])
    if message.get("name"):
        form.append(["name", message["name"]])
    return hashlib.blake2b(orjson.dumps(form, option=orjson.OPT_SORT_KEYS), digest_size=KEY_BYTES).digest()


def seed_key(tenant: str, model: str) -> bytes:
    return hashlib.blake2b(f"{tenant}\x00{model}".encode(), digest_size=KEY_BYTES).digest()


def extend_key(key: bytes, message: Any) -> bytes:
    return hashlib.blake2b(key + message_digest(message), digest_size=KEY_BYTES).digest()


@dataclass(slots=True)
class MessageKeys:
    """Chained keys of a request's messages: `request_key` covers all of them, `root_key` the
    ones before the first assistant turn (the same for every call of a run)."""

    request_key: bytes
    parent_key: bytes | None
    root_key: bytes


def request_keys(tenant: str, model: str, messages: list[Any]) -> MessageKeys:
    key = seed_key(tenant, model)
    parent: bytes | None = None
    root: bytes | None = None
    for message in messages:
        if root is None and isinstance(message, dict) and message.get("role") == "assistant":
            root = key
        key = extend_key(key, message)
        if isinstance(message, dict) and message.get("role") == "assistant":
            parent = key
    return MessageKeys(request_key=key, parent_key=parent, root_key=root or key)


@dataclass(frozen=True, slots=True)
class OpenTrajectory:
    trajectory_id: uuid.UUID
    adapter_version_id: uuid.UUID | None  # the version that served the run's first call


class StitchIndex:
    """This process's open trajectories: continuation key -> trajectory, LRU with a TTL."""

    def __init__(self, *, max_entries: int, ttl_s: float) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._entries: OrderedDict[bytes, tuple[OpenTrajectory, float]] = OrderedDict()

    def lookup(self, key: bytes | None) -> OpenTrajectory | None:
        if key is None:
            return None
        entry = self._entries.get(key)
        if entry is None:
            return None
        trajectory, expires_at = entry
        if expires_at < time.monotonic():
            del self._entries[key]
            return None
        return trajectory

    def register(self, key: bytes, trajectory: OpenTrajectory) -> None:
        self._entries[key] = (trajectory, time.monotonic() + self.ttl_s)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


@dataclass(slots=True)
class TrajectoryAssignment:
    trajectory_id: uuid.UUID
    client_trajectory_id: str | None
    keys: MessageKeys
    stitch_pending: bool
    # Set when this process served the run's previous call: the version to stay on.
    continued: OpenTrajectory | None = None

    def canary_unit(self, tenant: str, group_id: str | None) -> tuple[bytes, str]:
        """What the canary randomises for this call, as bytes to draw with and as a label: the
        client's group when it names one, else the run (its trajectory id, the client's or the
        gateway's). Never the prompt: see gateway/policies/versions.py."""
        if group_id:
            digest = hashlib.blake2b(f"{tenant}\x00{group_id}".encode(), digest_size=KEY_BYTES).digest()
            return b"group\x00" + digest, f"group:{group_id}"
        label = "client" if self.client_trajectory_id else "run"
        return b"run\x00" + self.trajectory_id.bytes, f"{label}:{self.trajectory_id}"


def assign_trajectory(
    index: StitchIndex, *, secret: bytes, tenant: str, model: str, messages: list[Any], client_trajectory_id: str | None
) -> TrajectoryAssignment:
    """The trajectory of a new call: the client's (named or echoed), the run this process saw
    continue, or a new one (marked pending when it may continue a run another process saw)."""
    keys = request_keys(tenant, model, messages)
    if client_trajectory_id:
        return TrajectoryAssignment(
            trajectory_id_for_client(secret, tenant, client_trajectory_id), client_trajectory_id, keys, False
        )
    known = index.lookup(keys.parent_key)
    if known is not None:
        return TrajectoryAssignment(known.trajectory_id, None, keys, False, continued=known)
    return TrajectoryAssignment(new_trajectory_id(secret, tenant), None, keys, keys.parent_key is not None)


def continuation_keys(keys: MessageKeys, answers: list[Any]) -> list[bytes]:
    """Keys that the next call of this run will carry as its parent key, one per choice."""
    return [extend_key(keys.request_key, answer) for answer in answers]


def new_call_id() -> uuid.UUID:
    return uuid7()
