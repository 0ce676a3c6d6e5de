"""What a policy's `endpoints` entry says: a fixed base URL, or a DNS name to resolve.

A fixed entry is an OpenAI base URL (`http://10.0.0.5:8000/v1`) used as written. A DNS entry
puts `dns+` in front of the scheme:

    dns+http://vllm-headless.inference.svc:8000/v1

and stands for one base URL per address the name resolves to (its A and AAAA records, as a
Kubernetes headless service publishes its ready pods): `http://10.1.2.3:8000/v1`,
`http://[fd00::7]:8000/v1`, ... The port and path are kept; a missing port is the scheme's
(80, 443). The prefix, rather than a separate setting, keeps fixed and DNS entries in one
ordered list (mixed lists work) and reads as what it does, like SQLAlchemy's `dialect+driver`.

This module only parses (the settings validate every entry with it at load time); resolving
is `apprentice.discovery.lookup`, keeping the last known addresses `directory`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

DNS_PREFIX = "dns+"
DNS_SCHEMES = {"dns+http": "http", "dns+https": "https"}
DEFAULT_PORTS = {"http": 80, "https": 443}
DNS_PORT = 53


class EntryError(ValueError):
    """An endpoints entry or a nameserver that cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class DnsName:
    """A `dns+http(s)://name:port/path` entry: one base URL per address of `host`."""

    entry: str  # as configured (trailing slash removed)
    scheme: str  # http or https
    host: str  # the name to resolve, as written (a relative name honours resolv.conf's search list)
    port: int
    path: str  # e.g. /v1, no trailing slash

    def url(self, address: str) -> str:
        """The base URL of one resolved address (IPv6 in brackets)."""
        shown = f"[{address}]" if ":" in address else address
        return f"{self.scheme}://{shown}:{self.port}{self.path}"


Entry = str | DnsName


def is_dns_entry(entry: str) -> bool:
    return entry.strip().lower().startswith(DNS_PREFIX)


def _shown(entry: str) -> str:
    """The entry as an error may print it: user and password, if any, replaced by `***`."""
    scheme, separator, rest = entry.partition("://")
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return f"{scheme}{separator}{netloc}{slash}{path}"


def parse_entry(entry: str) -> Entry:
    """A fixed base URL (returned as the string, trailing slash removed) or a DnsName.

    Raises EntryError for a `dns+` entry that cannot be resolved as written: another scheme
    than http/https, no host, an IP address instead of a name, a bad port, a query or fragment.
    """
    text = entry.strip().rstrip("/")
    if not is_dns_entry(text):
        return text
    parts = urlsplit(text)
    shown = _shown(entry)  # errors end up on the command line and in logs
    scheme = parts.scheme.lower()
    if scheme not in DNS_SCHEMES:
        raise EntryError(
            f"endpoint {shown!r}: a DNS entry is dns+http://NAME:PORT/PATH or dns+https://NAME:PORT/PATH "
            f"(not {parts.scheme}://)"
        )
    try:
        port = parts.port
    except ValueError as exc:
        raise EntryError(f"endpoint {shown!r}: bad port ({exc})") from None
    host = parts.hostname
    if not host:
        raise EntryError(f"endpoint {shown!r}: no DNS name after {parts.scheme}://")
    if parts.username is not None or parts.password is not None:
        raise EntryError(f"endpoint {shown!r}: credentials do not belong in the URL (set the policy's api_key)")
    if parts.query or parts.fragment:
        raise EntryError(f"endpoint {shown!r}: a DNS entry takes no query or fragment")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        raise EntryError(
            f"endpoint {shown!r}: {host} is an address, not a DNS name; write it as a fixed entry "
            f"({DNS_SCHEMES[scheme]}://...)"
        )
    base = DNS_SCHEMES[scheme]
    return DnsName(text, base, host, port or DEFAULT_PORTS[base], parts.path.rstrip("/"))


def dns_names(entries: list[str]) -> list[DnsName]:
    """The DNS entries among `entries` (already validated by the settings)."""
    return [parsed for parsed in map(parse_entry, entries) if isinstance(parsed, DnsName)]


def parse_nameserver(value: str) -> tuple[str, int]:
    """`10.0.0.10`, `10.0.0.10:5353`, `fd00::10` or `[fd00::10]:5353` -> (address, port)."""
    text = value.strip()
    address, port = text, DNS_PORT
    if text.startswith("["):
        closing = text.find("]")
        if closing < 0:
            raise EntryError(f"nameserver {value!r}: missing ']'")
        address, rest = text[1:closing], text[closing + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise EntryError(f"nameserver {value!r}: expected ':PORT' after ']'")
            port = _port(value, rest[1:])
    elif text.count(":") == 1:
        address, raw_port = text.split(":")
        port = _port(value, raw_port)
    try:
        ipaddress.ip_address(address)
    except ValueError:
        raise EntryError(f"nameserver {value!r}: not an IP address (a nameserver is given by address)") from None
    return address, port


def _port(value: str, raw: str) -> int:
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise EntryError(f"nameserver {value!r}: bad port {raw!r}")
    return int(raw)
