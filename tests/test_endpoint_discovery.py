"""Endpoints given as a DNS name (apprentice/discovery): parsing, the settings' errors, the
directory's refresh rules against a real DNS server on 127.0.0.1, and the router over a
changing set.

The gateway and the promotion job against real processes: test_endpoint_discovery_gateway.py
and test_endpoint_discovery_promotion.py.
"""

from __future__ import annotations

import re
import time
from typing import Any

import orjson
import pytest

from apprentice.discovery.directory import EndpointDirectory, current_endpoints, shared_directory
from apprentice.discovery.entries import DnsName, EntryError, parse_entry, parse_nameserver
from apprentice.discovery.lookup import Lookup, LookupFailed
from apprentice.settings import EndpointDiscoverySettings, PolicySettings, Settings
from gateway.upstreams.direct import attempt_order
from gateway.upstreams.discovery import EndpointDiscovery, EndpointLookupFailed
from gateway.upstreams.routing import EndpointsUnresolved, Router
from tests.support.dns_server import TestDnsServer, dns_fixture  # noqa: F401 (the fixture `dns`)

NAME = "vllm.apprentice.test"


def discovery(dns: TestDnsServer, **overrides: Any) -> EndpointDiscoverySettings:
    return EndpointDiscoverySettings(nameservers=[dns.nameserver], timeout_s=1.0, **overrides)


def policy(*endpoints: str, name: str = "p", **extra: Any) -> PolicySettings:
    return PolicySettings(name=name, base_model="base", endpoints=list(endpoints), **extra)


# ---- parsing -----------------------------------------------------------------------------


def test_a_fixed_entry_is_kept_as_written():
    assert parse_entry("http://10.0.0.5:8000/v1/") == "http://10.0.0.5:8000/v1"


def test_a_dns_entry_names_scheme_host_port_and_path():
    entry = parse_entry("dns+http://vllm-headless.inference.svc:8000/v1/")
    assert entry == DnsName(
        "dns+http://vllm-headless.inference.svc:8000/v1", "http", "vllm-headless.inference.svc", 8000, "/v1"
    )
    assert entry.url("10.1.2.3") == "http://10.1.2.3:8000/v1"
    assert entry.url("fd00::7") == "http://[fd00::7]:8000/v1"


def test_a_dns_entry_without_port_takes_the_schemes():
    assert parse_entry("DNS+HTTPS://vllm.example/v1") == DnsName(
        "DNS+HTTPS://vllm.example/v1", "https", "vllm.example", 443, "/v1"
    )
    assert (
        isinstance(entry := parse_entry("dns+http://vllm.example"), DnsName)
        and entry.url("10.0.0.1") == "http://10.0.0.1:80"
    )


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("dns+ftp://vllm.example/v1", "dns+http://NAME:PORT/PATH"),
        ("dns+http://10.0.0.1:8000/v1", "is an address, not a DNS name"),
        ("dns+http://[fd00::1]:8000/v1", "is an address, not a DNS name"),
        ("dns+http://:8000/v1", "no DNS name"),
        ("dns+http://vllm.example:99999/v1", "bad port"),
        ("dns+http://vllm.example:8000/v1?x=1", "no query or fragment"),
        ("dns+http://user:secret@vllm.example:8000/v1", "credentials do not belong"),
        ("dns+http://user:secret@vllm.example:99999/v1", "bad port"),
    ],
)
def test_a_dns_entry_that_cannot_be_resolved_as_written_is_refused(entry: str, reason: str):
    with pytest.raises(EntryError, match=re.escape(reason)) as raised:
        parse_entry(entry)
    assert "secret" not in str(raised.value), "the error must not print a password"


def test_the_settings_refuse_a_bad_entry_naming_it():
    with pytest.raises(ValueError) as raised:
        Settings(
            policies=[{"name": "p", "base_model": "b", "endpoints": ["http://a:1/v1", "dns+http://10.0.0.1:80/v1"]}]
        )
    assert "policies.0.endpoints" in str(raised.value)
    assert "'dns+http://10.0.0.1:80/v1': 10.0.0.1 is an address, not a DNS name" in str(raised.value)


def test_nameservers_are_addresses_with_an_optional_port():
    assert parse_nameserver("10.0.0.10") == ("10.0.0.10", 53)
    assert parse_nameserver("10.0.0.10:5353") == ("10.0.0.10", 5353)
    assert parse_nameserver("fd00::10") == ("fd00::10", 53)
    assert parse_nameserver("[fd00::10]:5353") == ("fd00::10", 5353)
    for bad in ("dns.google", "10.0.0.10:0", "[fd00::10", "[fd00::10]5353"):
        with pytest.raises(EntryError):
            parse_nameserver(bad)
    with pytest.raises(ValueError, match="not an IP address"):
        Settings(endpoint_discovery={"nameservers": ["kube-dns"]})
    with pytest.raises(ValueError, match="greater than 0"):
        Settings(endpoint_discovery={"refresh_s": 0})


def test_the_refresh_period_has_a_default_and_an_environment_override(monkeypatch):
    assert Settings().endpoint_discovery.refresh_s == 10.0
    monkeypatch.setenv("APPRENTICE_ENDPOINT_DISCOVERY__REFRESH_S", "2.5")
    assert Settings().endpoint_discovery.refresh_s == 2.5


# ---- lookups and the directory -----------------------------------------------------------


async def test_a_lookup_returns_ipv4_and_ipv6_addresses(dns):
    dns.records.set(NAME, ["127.0.0.3", "fd00::7", "127.0.0.2"])
    assert await Lookup([dns.nameserver]).addresses(NAME) == ("127.0.0.2", "127.0.0.3", "fd00::7")
    assert await Lookup([dns.nameserver]).addresses("absent.apprentice.test") == ()
    assert {kind for _, kind in dns.records.queries} == {"A", "AAAA"}


async def test_a_servfail_is_a_failed_lookup_not_an_empty_one(dns):
    dns.records.set(NAME, ["127.0.0.2"])
    dns.records.failing = True
    with pytest.raises(LookupFailed, match="SERVFAIL"):
        await Lookup([dns.nameserver]).addresses(NAME)


async def test_the_directory_follows_the_records_and_keeps_the_last_set_on_failure(dns):
    directory = EndpointDirectory(discovery(dns))
    pol = policy(f"dns+http://{NAME}:8000/v1")

    dns.records.set(NAME, ["127.0.0.2", "127.0.0.3"])
    result = await directory.refresh([pol])
    assert directory.endpoints(pol) == ["http://127.0.0.2:8000/v1", "http://127.0.0.3:8000/v1"]
    assert result.changed == {NAME: ((), ("127.0.0.2", "127.0.0.3"))} and not result.failed
    generation = directory.generation

    dns.records.set(NAME, ["127.0.0.3", "127.0.0.4"])  # one pod went, another came
    await directory.refresh([pol])
    assert directory.endpoints(pol) == ["http://127.0.0.3:8000/v1", "http://127.0.0.4:8000/v1"]
    assert directory.generation == generation + 1

    unchanged = await directory.refresh([pol])
    assert not unchanged.changed and directory.generation == generation + 1

    dns.records.failing = True  # the DNS server fails: the last set stays
    failed = await directory.refresh([pol])
    assert NAME in failed.failed and "SERVFAIL" in failed.failed[NAME]
    assert directory.endpoints(pol) == ["http://127.0.0.3:8000/v1", "http://127.0.0.4:8000/v1"]
    assert directory.state(NAME).consecutive_failures == 1
    assert failed.describe_failures(directory).startswith(f"{NAME} (kept 2 known address(es)): A: SERVFAIL")

    dns.records.failing = False
    dns.records.remove(NAME)  # NXDOMAIN (no ready pod): the last set stays too
    empty = await directory.refresh([pol])
    assert empty.failed[NAME].startswith("no A or AAAA record")
    assert directory.endpoints(pol) == ["http://127.0.0.3:8000/v1", "http://127.0.0.4:8000/v1"]
    assert directory.state(NAME).consecutive_failures == 2

    dns.records.set(NAME, ["127.0.0.5"])
    await directory.refresh([pol])
    assert directory.endpoints(pol) == ["http://127.0.0.5:8000/v1"]
    assert directory.state(NAME).consecutive_failures == 0 and directory.state(NAME).last_error is None


async def test_a_name_that_never_resolved_has_no_endpoints(dns):
    directory = EndpointDirectory(discovery(dns))
    pol = policy(f"dns+http://{NAME}:8000/v1")
    assert directory.endpoints(pol) == [] and directory.unresolved(pol) == [f"dns+http://{NAME}:8000/v1"]
    result = await directory.refresh([pol])
    assert NAME in result.failed
    assert directory.endpoints(pol) == [] and directory.unresolved(pol) == [f"dns+http://{NAME}:8000/v1"]


async def test_a_mixed_list_keeps_its_order_and_drops_duplicates(dns):
    directory = EndpointDirectory(discovery(dns))
    dns.records.set(NAME, ["127.0.0.2", "127.0.0.3"])
    dns.records.set("other.apprentice.test", ["127.0.0.9"])
    pol = policy(
        "http://127.0.0.7:9000/v1",
        f"dns+http://{NAME}:8000/v1",
        "http://127.0.0.2:8000/v1",  # also one of the name's addresses
        "dns+https://other.apprentice.test/v2",
    )
    await directory.refresh([pol])
    assert directory.endpoints(pol) == [
        "http://127.0.0.7:9000/v1",
        "http://127.0.0.2:8000/v1",
        "http://127.0.0.3:8000/v1",
        "https://127.0.0.9:443/v2",
    ]


async def test_only_stale_names_are_looked_up_again(dns):
    directory = EndpointDirectory(discovery(dns, refresh_s=0.3))
    dns.records.set(NAME, ["127.0.0.2"])
    pol = policy(f"dns+http://{NAME}:8000/v1")
    assert (await directory.refresh([pol], only_stale=True)).looked_up == [NAME]
    dns.records.set(NAME, ["127.0.0.3"])
    assert (await directory.refresh([pol], only_stale=True)).looked_up == []
    assert directory.endpoints(pol) == ["http://127.0.0.2:8000/v1"]
    time.sleep(0.35)
    assert (await directory.refresh([pol], only_stale=True)).looked_up == [NAME]
    assert directory.endpoints(pol) == ["http://127.0.0.3:8000/v1"]


async def test_current_endpoints_of_a_fixed_policy_costs_no_lookup(dns):
    config = discovery(dns, refresh_s=0.2)
    assert await current_endpoints(config, policy("http://127.0.0.7:9000/v1")) == (["http://127.0.0.7:9000/v1"], [])
    assert dns.records.queries == []
    dns.records.set(NAME, ["127.0.0.2"])
    mixed = policy("http://127.0.0.7:9000/v1", f"dns+http://{NAME}:8000/v1")
    assert await current_endpoints(config, mixed) == (["http://127.0.0.7:9000/v1", "http://127.0.0.2:8000/v1"], [])
    assert shared_directory(config) is shared_directory(config.model_copy())


# ---- the router over the dynamic set -----------------------------------------------------


def settings_with(dns: TestDnsServer, *policies: dict[str, Any]) -> Settings:
    return Settings(policies=list(policies), endpoint_discovery={"nameservers": [dns.nameserver], "refresh_s": 0.2})


async def test_the_router_sends_calls_to_the_resolved_set_as_it_changes(dns):
    settings = settings_with(dns, {"name": "p", "base_model": "base", "endpoints": [f"dns+http://{NAME}:8000/v1"]})
    directory = EndpointDirectory(settings.endpoint_discovery)
    router = Router(settings, directory)
    worker = EndpointDiscovery(settings, directory, router)
    assert worker.enabled

    dns.records.set(NAME, ["127.0.0.2", "127.0.0.3"])
    await worker.refresh()
    firsts = {router.plan("p").targets[0].api_base for _ in range(4)}
    assert firsts == {"http://127.0.0.2:8000/v1", "http://127.0.0.3:8000/v1"}  # round-robin over both
    assert len(router.plan("p").targets) == 2  # the other is the failover

    dns.records.set(NAME, ["127.0.0.3", "127.0.0.4"])
    await worker.refresh()
    seen = {target.api_base for _ in range(4) for target in router.plan("p").targets}
    assert seen == {"http://127.0.0.3:8000/v1", "http://127.0.0.4:8000/v1"}
    assert router.endpoints_of("p") == ["http://127.0.0.3:8000/v1", "http://127.0.0.4:8000/v1"]

    dns.records.failing = True
    with pytest.raises(EndpointLookupFailed, match=re.escape(f"{NAME} (kept 2 known address(es)): A: SERVFAIL")):
        await worker.refresh()
    assert router.endpoints_of("p") == ["http://127.0.0.3:8000/v1", "http://127.0.0.4:8000/v1"]


async def test_a_policy_whose_names_never_resolved_gets_a_503_naming_it(dns):
    settings = settings_with(
        dns,
        {"name": "lost", "base_model": "base", "endpoints": ["dns+http://missing.apprentice.test:8000/v1"]},
        {
            "name": "mixed",
            "base_model": "base",
            "endpoints": ["http://127.0.0.7:9000/v1", f"dns+http://{NAME}:8000/v1"],
        },
    )
    router = Router(settings, EndpointDirectory(settings.endpoint_discovery))
    with pytest.raises(EndpointsUnresolved) as raised:
        router.plan("lost")
    error = orjson.loads(raised.value.body())["error"]
    assert raised.value.status == 503 and error["code"] == "policy_endpoints_unresolved"
    assert "`lost`" in error["message"] and "missing.apprentice.test" in error["message"]
    with pytest.raises(EndpointsUnresolved):
        router.target_for_other_endpoint("lost")
    # A mixed list serves from its fixed entry while its name has not resolved.
    assert [t.api_base for t in router.plan("mixed").targets] == ["http://127.0.0.7:9000/v1"]


def test_no_target_and_retries_give_no_attempt():
    assert attempt_order([], 0, 2) == []
