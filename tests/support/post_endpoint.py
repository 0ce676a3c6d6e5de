"""A local HTTP endpoint that answers POSTs from a thread of the test's (or bench's) own process.

Tests and benches stand in for what an operator runs (a reward function's scorer, an OTLP
collector) with one of these: the gateway reaches it over real HTTP, and the test reads what it
received without a second process. `answer(path, headers, body)` gives the status, content type
and body of each reply; it runs on the server's threads, so what it records must be safe to
append from several threads at once (lists' append is).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = tuple[int, str, bytes]  # status, content type, body


class PostEndpoint:
    def __init__(self, answer: Callable[[str, dict[str, str], bytes], Reply]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, content_type, reply = answer(self.path, dict(self.headers), body)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
