"""The egress policy (app/domain/egress.py) and its enforcement points that need no network
beyond /etc/hosts (app/services/egress_resolver.py)."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from app.domain.egress import EgressPolicy, denied_reason, is_legacy_ipv4_literal, parse_egress_allow
from app.services.egress_resolver import (
    DENIED_DETAIL,
    LEGACY_LITERAL_DETAIL,
    EgressDenied,
    EgressResolver,
    ResolveResult,
    literal_host_denied,
    url_refusal,
)

DEFAULT = EgressPolicy()

DENIED = [
    "127.0.0.1",
    "127.255.255.254",
    "0.0.0.0",
    "0.1.2.3",
    "10.0.0.1",
    "172.16.0.1",
    "172.31.255.255",
    "192.168.1.1",
    "100.64.0.1",
    "100.127.255.254",
    "169.254.169.254",
    "169.254.1.1",
    "192.0.0.192",
    "192.0.2.10",
    "198.51.100.7",
    "203.0.113.9",
    "198.18.0.1",
    "198.19.255.1",
    "224.0.0.1",
    "239.255.255.250",
    "240.0.0.1",
    "255.255.255.255",
    "::",
    "::1",
    "fc00::1",
    "fd00:ec2::254",
    "fe80::1",
    "fec0::1",
    "ff02::1",
    "2001:db8::1",
    "3fff::1",
    "2001:2::1",
    "2001::1",  # Teredo
    "100::1",
    "::ffff:127.0.0.1",  # IPv4-mapped
    "::ffff:10.1.2.3",
    "::ffff:169.254.169.254",
    "::127.0.0.1",  # IPv4-compatible
    "::10.0.0.1",
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "64:ff9b:1::808:808",  # local-use NAT64: never public
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "4000::1",  # outside 2000::/3
]
ALLOWED = ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"]


@pytest.mark.parametrize("text", DENIED)
def test_the_default_policy_refuses_internal_and_special_addresses(text: str) -> None:
    address = ipaddress.ip_address(text)
    assert denied_reason(address) is not None
    assert not DEFAULT.allows_address(address)


@pytest.mark.parametrize("text", ALLOWED)
def test_the_default_policy_allows_globally_routable_unicast(text: str) -> None:
    assert DEFAULT.allows_address(ipaddress.ip_address(text))


def test_allowed_ranges_open_exactly_what_they_cover() -> None:
    policy = parse_egress_allow(" 127.0.0.0/8 ,10.1.0.0/16, fd12::/16,")
    for text in ("127.0.0.1", "::ffff:127.0.0.1", "10.1.200.3", "fd12::5", "8.8.8.8"):
        assert policy.allows_address(ipaddress.ip_address(text)), text
    for text in ("10.2.0.1", "192.168.0.1", "::1", "fd13::1"):
        assert not policy.allows_address(ipaddress.ip_address(text)), text
    assert policy.describe() == "127.0.0.0/8,10.1.0.0/16,fd12::/16"
    assert parse_egress_allow(" , ").is_default and not policy.is_default


def test_a_broad_range_never_opens_a_metadata_service_but_naming_it_does() -> None:
    broad = parse_egress_allow("169.254.0.0/16,fd00::/8")
    assert broad.allows_address(ipaddress.ip_address("169.254.1.1"))
    assert not broad.allows_address(ipaddress.ip_address("169.254.169.254"))
    assert not broad.allows_address(ipaddress.ip_address("fd00:ec2::254"))
    exact = parse_egress_allow("169.254.169.254")
    assert exact.allows_address(ipaddress.ip_address("169.254.169.254"))


def test_host_names_in_the_allow_list() -> None:
    policy = parse_egress_allow("billing.internal, *.svc.cluster.local, Metadata.Google.Internal.")
    assert policy.allows_host("BILLING.internal.")
    assert policy.allows_host("api.team.svc.cluster.local")
    assert not policy.allows_host("svc.cluster.local.evil.test")
    assert not policy.allows_host("billing.internal.evil.test")
    assert not policy.denies_host_name("metadata.google.internal")
    assert DEFAULT.denies_host_name("metadata.google.internal.")
    assert not DEFAULT.allows_host("localhost")


@pytest.mark.parametrize("entry", ["10.0.0.0/33", "300.1.1.1", "127.1", "2130706433", "bad host", "a..b", "*."])
def test_a_bad_allow_list_entry_is_refused_by_name(entry: str) -> None:
    with pytest.raises(ValueError, match=r"CIDR|host name"):
        parse_egress_allow(f"10.0.0.0/8,{entry}")


@pytest.mark.parametrize(
    ("host", "legacy"),
    [
        ("0x7f000001", True),
        ("2130706433", True),
        ("0177.0.0.1", True),
        ("127.1", True),
        ("0x7f.1", True),
        ("127.0.0.1", False),
        ("example.com", False),
        ("deadbeef", False),
        ("1.2.3.4.5", False),
        ("::1", False),
    ],
)
def test_legacy_numeric_ipv4_spellings_are_recognised(host: str, legacy: bool) -> None:
    assert is_legacy_ipv4_literal(host) is legacy


def test_literal_hosts_are_judged_by_the_address_they_spell() -> None:
    for host in ("127.0.0.1", "0x7f000001", "2130706433", "0177.0.0.1", "127.1", "::ffff:7f00:1", "fe80::1%25eth0"):
        assert literal_host_denied(DEFAULT, host), host
    assert not literal_host_denied(DEFAULT, "8.8.8.8")
    assert not literal_host_denied(DEFAULT, "example.com")  # a name: the resolver judges it
    assert not literal_host_denied(parse_egress_allow("127.0.0.0/8"), "2130706433")


class FixedResolver:
    """Answers every lookup with the same addresses (stands in for DNS in a unit test)."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = addresses

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return [
            ResolveResult(
                hostname=host,
                host=a,
                port=port,
                family=socket.AF_INET6 if ":" in a else socket.AF_INET,
                proto=0,
                flags=0,
            )
            for a in self.addresses
        ]

    async def close(self) -> None:
        return None


async def test_the_resolver_hands_over_only_allowed_addresses() -> None:
    mixed = EgressResolver(DEFAULT, FixedResolver("127.0.0.1", "93.184.216.34", "::ffff:10.0.0.1"))
    assert [r["host"] for r in await mixed.resolve("rebind.example", 443)] == ["93.184.216.34"]
    internal = EgressResolver(DEFAULT, FixedResolver("10.0.0.7", "::1"))
    with pytest.raises(EgressDenied, match=r"^egress_denied$"):
        await internal.resolve("rebind.example", 443)
    with pytest.raises(EgressDenied):
        await EgressResolver(DEFAULT, FixedResolver("8.8.8.8")).resolve("metadata.google.internal", 80)


async def test_an_allowed_host_name_reaches_what_it_resolves_to_and_only_through_that_name() -> None:
    resolver = EgressResolver(parse_egress_allow("billing.internal"), FixedResolver("10.0.0.7"))
    assert [r["host"] for r in await resolver.resolve("billing.internal", 80)] == ["10.0.0.7"]
    with pytest.raises(EgressDenied):
        await resolver.resolve("other.example", 80)
    sock = resolver.socket_factory((socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", 80)))
    sock.close()


@pytest.mark.parametrize("address", ["127.0.0.1", "::ffff:127.0.0.1", "169.254.169.254", "0x7f000001", "nonsense"])
def test_the_socket_check_refuses_denied_addresses(address: str) -> None:
    resolver = EgressResolver(DEFAULT, FixedResolver())
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with pytest.raises(EgressDenied):
        resolver.socket_factory((family, socket.SOCK_STREAM, 6, "", (address, 80)))


@pytest.mark.parametrize(
    ("url", "detail"),
    [
        ("http://127.0.0.1:5432/", DENIED_DETAIL),
        ("http://[::1]/", DENIED_DETAIL),
        ("http://[::ffff:127.0.0.1]/", DENIED_DETAIL),
        ("http://169.254.169.254/latest/meta-data/", DENIED_DETAIL),
        ("http://[fd00:ec2::254]/", DENIED_DETAIL),
        ("http://metadata.google.internal/computeMetadata/v1/", DENIED_DETAIL),
        ("http://localhost:8080/v1/targets", DENIED_DETAIL),  # a name resolving to loopback
        ("http://LOCALHOST:8080/", DENIED_DETAIL),
        ("http://0x7f000001/", LEGACY_LITERAL_DETAIL),
        ("http://2130706433/", LEGACY_LITERAL_DETAIL),
        ("http://0177.0.0.1/", LEGACY_LITERAL_DETAIL),
        ("http://127.1/", LEGACY_LITERAL_DETAIL),
        ("http://127.0.0.%31/", "must not percent-encode the host name"),
        ("https://8.8.8.8/hook", None),
        ("https://hooks.example.invalid/", None),  # does not resolve now: checked at delivery
    ],
)
async def test_url_refusal_at_create(url: str, detail: str | None) -> None:
    assert await url_refusal(DEFAULT, url) == detail


async def test_url_refusal_honours_the_allow_list_but_never_legacy_spellings() -> None:
    policy = parse_egress_allow("127.0.0.0/8,billing.internal")
    assert await url_refusal(policy, "http://127.0.0.1:9000/hook") is None
    assert await url_refusal(policy, "http://localhost:9000/hook") is None
    assert await url_refusal(policy, "http://billing.internal/hook") is None
    assert await url_refusal(policy, "http://0x7f000001/") == LEGACY_LITERAL_DETAIL
    assert await url_refusal(policy, "http://10.0.0.1/") == DENIED_DETAIL
