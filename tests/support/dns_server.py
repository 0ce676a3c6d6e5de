"""A real DNS server for tests: dnslib's DNSServer on 127.0.0.1, an ephemeral UDP port.

Its A/AAAA records are a dict the test changes while the server runs (a Kubernetes headless
service gaining and losing ready pods). `failing = True` answers SERVFAIL to everything (a DNS
outage); a name it does not hold gets NXDOMAIN (no ready pod). Every query is counted.

The replicas a name points to listen on other loopback addresses (127.0.0.2, 127.0.0.3, ...:
all of 127.0.0.0/8 is loopback on Linux) at one port, the port of the `dns+http://` entry:
`port_free_on` finds one.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from dnslib import AAAA, QTYPE, RCODE, RR, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer

from apprentice.processes import free_port


class Records(BaseResolver):  # type: ignore[misc]
    """The zone: {absolute name: [addresses]}, changed by the test at any time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: dict[str, list[str]] = {}
        self.failing = False
        self.queries: list[tuple[str, str]] = []

    def set(self, name: str, addresses: list[str]) -> None:
        with self._lock:
            self._names[_absolute(name)] = list(addresses)

    def remove(self, name: str) -> None:
        with self._lock:
            self._names.pop(_absolute(name), None)

    def resolve(self, request: Any, handler: Any) -> Any:
        reply = request.reply()
        name, kind = str(request.q.qname), QTYPE[request.q.qtype]
        with self._lock:
            self.queries.append((name, kind))
            if self.failing:
                reply.header.rcode = RCODE.SERVFAIL
                return reply
            addresses = self._names.get(name)
        if addresses is None:
            reply.header.rcode = RCODE.NXDOMAIN
            return reply
        for address in addresses:
            version = ipaddress.ip_address(address).version
            if kind == "A" and version == 4:
                reply.add_answer(RR(name, QTYPE.A, rdata=A(address), ttl=1))
            elif kind == "AAAA" and version == 6:
                reply.add_answer(RR(name, QTYPE.AAAA, rdata=AAAA(address), ttl=1))
        return reply


def _absolute(name: str) -> str:
    return name if name.endswith(".") else name + "."


class TestDnsServer:
    """Start with `start()`; `nameserver` is what `endpoint_discovery.nameservers` takes."""

    __test__ = False  # not a test class for pytest

    def __init__(self) -> None:
        self.records = Records()
        self._server = DNSServer(self.records, address="127.0.0.1", port=0, logger=DNSLogger(logf=_quiet))

    @property
    def port(self) -> int:
        return int(self._server.server.server_address[1])

    @property
    def nameserver(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> TestDnsServer:
        self._server.start_thread()
        return self

    def stop(self) -> None:
        self._server.stop()
        self._server.server.server_close()


def _quiet(_: str) -> None:
    return None


@pytest.fixture(name="dns")
def dns_fixture() -> Iterator[TestDnsServer]:
    """The fixture `dns`: a running TestDnsServer, stopped after the test (import `dns_fixture`)."""
    server = TestDnsServer().start()
    yield server
    server.stop()


def port_free_on(hosts: list[str]) -> int:
    """One TCP port that nothing listens on at any of `hosts` (loopback addresses)."""
    for _ in range(20):
        port = free_port(hosts[0])
        try:
            for host in hosts[1:]:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                    sock.bind((host, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no port free on all of {hosts}")
