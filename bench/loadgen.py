"""A small, fast HTTP/1.1 load client for the benchmarks under `bench/`.

Python HTTP clients (aiohttp, httpx) spend 150-400 us of CPU a request. On a two-core machine
that shares its cores with the server under test and the upstream behind it, that CPU is taken
from what is measured. This client keeps one asyncio stream per connection (keep-alive), writes a
pre-built request and parses only what it needs from the answer: the status, `Content-Length` or
`Transfer-Encoding: chunked`, and for streams the time of the first body byte and of the last.

It speaks plain HTTP/1.1 to loopback addresses only; it is a measuring tool, not a general client.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}


class LoadError(RuntimeError):
    """The server answered something this client cannot read."""


@dataclass
class Sample:
    """One request: when it started, how long until the first body byte and until the last."""

    start: float
    ttfb: float
    total: float
    status: int
    ok: bool
    body_tail: bytes = b""


@dataclass
class Endpoint:
    """A URL and a request body, turned into the exact bytes sent for each request."""

    url: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    stream: bool = False
    # What the last bytes of a whole stream hold (chat completions' `[DONE]`; the Responses API
    # ends with `response.completed`, Anthropic's Messages with `message_stop`).
    end_marker: bytes = b"[DONE]"
    # How many of the last bytes are kept to look for it (the Responses API's last event holds
    # the whole response, so its marker sits further from the end).
    tail_bytes: int = 64

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"only http:// URLs are supported: {self.url}")
        if parts.hostname not in LOOPBACK_HOSTS:
            raise ValueError(f"benchmarks only talk to loopback addresses, not {parts.hostname}")
        self.host = parts.hostname
        self.port = parts.port or 80
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        head = [
            f"POST {path} HTTP/1.1",
            f"Host: {self.host}:{self.port}",
            "Content-Type: application/json",
            f"Content-Length: {len(self.body)}",
            "Accept: */*",
        ]
        head += [f"{name}: {value}" for name, value in self.headers.items()]
        self.request_bytes = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + self.body


class Connection:
    """One keep-alive connection; reconnects when the server closed it."""

    def __init__(self, endpoint: Endpoint, timeout_s: float) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> None:
        self.reader, self.writer = await asyncio.wait_for(
            asyncio.open_connection(self.endpoint.host, self.endpoint.port, limit=MAX_HEAD_BYTES), self.timeout_s
        )

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    def usable(self) -> bool:
        return (
            self.writer is not None
            and not self.writer.is_closing()
            and self.reader is not None
            and not self.reader.at_eof()
        )

    async def prepare(self) -> None:
        """Reconnect now if the server closed this connection (idle keep-alive timeout), so that the
        next measured request does not pay for the connect."""
        if not self.usable():
            self.close()
            try:
                await self._connect()
            except (asyncio.TimeoutError, OSError):
                self.close()

    async def request(self, keep_body: bool = False) -> Sample:
        for attempt in (1, 2):
            reused = self.usable()
            try:
                return await asyncio.wait_for(self._request(keep_body), self.timeout_s)
            except asyncio.IncompleteReadError as exc:
                self.close()
                # A kept-alive connection the server closed just before our request came: resend
                # once on a new connection, as HTTP clients do. Anything else is a failure.
                if attempt == 1 and reused and not exc.partial:
                    continue
                error: Exception = exc
            except (ConnectionResetError, BrokenPipeError) as exc:
                self.close()
                if attempt == 1 and reused:
                    continue
                error = exc
            except (asyncio.TimeoutError, OSError, LoadError, ValueError) as exc:
                self.close()
                error = exc
            break
        now = time.perf_counter()
        return Sample(start=now, ttfb=0.0, total=0.0, status=0, ok=False, body_tail=repr(error).encode()[:200])

    async def _request(self, keep_body: bool) -> Sample:
        if not self.usable():
            self.close()
            await self._connect()
        assert self.reader is not None and self.writer is not None
        reader = self.reader
        start = time.perf_counter()
        self.writer.write(self.endpoint.request_bytes)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = -1
        chunked = False
        close = False
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value.strip())
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                close = b"close" in value.lower()
        ttfb = 0.0
        body = bytearray()
        tail = b""
        if chunked:
            total_bytes = 0
            while True:
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers, if any
                        pass
                    break
                data = await reader.readexactly(size + 2)
                if not ttfb:
                    ttfb = time.perf_counter() - start
                total_bytes += size
                if total_bytes > MAX_BODY_BYTES:
                    raise LoadError("answer too large")
                if keep_body:
                    body += data[:-2]
                tail = (tail + data[:-2])[-self.endpoint.tail_bytes :]
        elif length >= 0:
            if length > MAX_BODY_BYTES:
                raise LoadError("answer too large")
            data = await reader.readexactly(length) if length else b""
            ttfb = time.perf_counter() - start
            body += data if keep_body else b""
            tail = (tail + data)[-self.endpoint.tail_bytes :]
        else:  # no length: the body ends when the server closes the connection
            data = await reader.read(MAX_BODY_BYTES)
            ttfb = time.perf_counter() - start
            while True:
                more = await reader.read(65536)
                if not more:
                    break
                data += more
            body += data if keep_body else b""
            tail = (tail + data)[-self.endpoint.tail_bytes :]
            close = True
        total = time.perf_counter() - start
        if close:
            self.close()
        ok = status == 200 and (not self.endpoint.stream or self.endpoint.end_marker in tail)
        return Sample(
            start=start, ttfb=ttfb, total=total, status=status, ok=ok, body_tail=bytes(body) if keep_body else tail
        )


class LoadClient:
    """A pool of `concurrency` connections to one endpoint, kept open between phases."""

    def __init__(self, endpoint: Endpoint, concurrency: int, timeout_s: float = 30.0) -> None:
        self.endpoint = endpoint
        self.connections = [Connection(endpoint, timeout_s) for _ in range(concurrency)]

    def close(self) -> None:
        for connection in self.connections:
            connection.close()

    async def prepare(self) -> None:
        await asyncio.gather(*(c.prepare() for c in self.connections))

    async def one(self, keep_body: bool = True) -> Sample:
        return await self.connections[0].request(keep_body=keep_body)

    async def run(
        self, count: int, duration_s: float | None = None, min_count: int = 0, max_s: float | None = None
    ) -> tuple[list[Sample], float]:
        """Send at most `count` requests; stop starting new ones after `duration_s` once at least
        `min_count` were started, and after `max_s` in any case. Each connection sends its next
        request as soon as its previous answer is read. Returns the samples and the wall time from
        the first send to the last answer."""
        started_count = 0
        now = time.perf_counter()
        deadline = None if duration_s is None else now + duration_s
        hard_deadline = None if max_s is None else now + max_s
        samples: list[Sample] = []

        def more() -> bool:
            if started_count >= count:
                return False
            now = time.perf_counter()
            if hard_deadline is not None and now >= hard_deadline:
                return False
            return deadline is None or now < deadline or started_count < min_count

        async def worker(connection: Connection) -> None:
            nonlocal started_count
            while more():
                started_count += 1
                samples.append(await connection.request())

        started = time.perf_counter()
        await asyncio.gather(*(worker(c) for c in self.connections))
        return samples, time.perf_counter() - started
