"""Relaying a server-sent event stream event by event, whatever its line endings.

Two things need the stream cut at event boundaries rather than at the upstream's reads:
- the `data: [DONE]` event is held back until the call is journaled (see handler.py), so it
  must be recognised even when it arrives split across two reads;
- a policy's events are rewritten (policy_tokens.py), which needs each event whole.

An event ends with a blank line, and the SSE specification allows three line endings:
CRLF, LF and CR (sse-starlette, for one, writes CRLF). So an event ends at the first of
`\\r\\n\\r\\n`, `\\n\\n` or `\\r\\r`. Bytes after the last boundary wait for the next read.

Invariants:
- `feed` returns only whole events, each with its original terminator, in order;
- nothing is dropped: `feed` outputs + `finish()` == the input bytes (events rewritten, or
  dropped when it returns nothing, by the `rewrite` hook aside);
- the `[DONE]` event and everything after it come out of `finish()` alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable

EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
DONE_PAYLOAD = b"[DONE]"

# rewrite(event without its terminator) -> the event to send instead, without terminator.
Rewrite = Callable[[bytes], bytes]


def is_done_event(event: bytes) -> bool:
    """`data: [DONE]` (the space after the colon is optional in SSE)."""
    return event.startswith(b"data:") and event[5:].strip() == DONE_PAYLOAD


class EventRelay:
    """Cuts a stream into whole events, rewrites them, and holds back `[DONE]` and what follows."""

    def __init__(self, rewrite: Rewrite | None = None) -> None:
        self._rewrite = rewrite
        self._partial = b""
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        """The whole events that may be sent now."""
        if self._held:  # [DONE] was seen: everything after it waits for finish()
            self._held += data
            return b""
        buffer = self._partial + data
        out: list[bytes] = []
        start = 0
        for boundary in EVENT_END.finditer(buffer):
            event, terminator = buffer[start : boundary.start()], boundary.group()
            if is_done_event(event):
                self._held = buffer[start:]
                self._partial = b""
                return b"".join(out)
            out.append(self._emit(event, terminator))
            start = boundary.end()
        self._partial = buffer[start:]
        return b"".join(out)

    def finish(self) -> bytes:
        """What is left: an unterminated last event, or the held-back `[DONE]` and after."""
        if self._held:
            held, self._held = self._held, b""
            return held
        rest, self._partial = self._partial, b""
        if not rest.strip() or is_done_event(rest.strip()):
            return rest
        return self._emit(rest, b"")

    def _emit(self, event: bytes, terminator: bytes) -> bytes:
        if self._rewrite is None or not event:
            return event + terminator
        rewritten = self._rewrite(event)
        if not rewritten:  # the rewrite dropped the event (e.g. a usage chunk nobody asked for)
            return b""
        return rewritten + (terminator or b"\n\n")
