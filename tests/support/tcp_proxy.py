"""A TCP proxy that a test can cut and restore, to take PostgreSQL away from a gateway
without touching the shared server."""

from __future__ import annotations

import asyncio
import threading

from tests.support.processes import free_port


class CuttableProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.connections = 0

    def start(self) -> CuttableProxy:
        self._thread.start()
        self._call(self._listen())
        return self

    def _call(self, coroutine):  # noqa: ANN001, ANN202
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self.connections += 1
        self._writers.update((writer, upstream_writer))

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))
        self._writers.difference_update((writer, upstream_writer))

    def cut(self) -> None:
        """Refuse new connections and drop every open one, as a database outage does."""

        async def cut() -> None:
            if self._server is not None:
                self._server.close()
                await self._server.wait_closed()
                self._server = None
            for writer in list(self._writers):
                writer.transport.abort()
            self._writers.clear()

        self._call(cut())

    def restore(self) -> None:
        self._call(self._listen())

    def close(self) -> None:
        self.cut()
        self._loop.call_soon_threadsafe(self._loop.stop)
