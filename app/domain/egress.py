"""The egress policy: which addresses and host names webhook deliveries may reach. Pure.

By default only globally routable unicast addresses are allowed, so a tenant cannot point a
target at cronhook's own API, its database, the cloud metadata service or anything else on
the internal network (SSRF). Addresses that embed an IPv4 address (IPv4-mapped and -compatible
IPv6, NAT64, 6to4) are judged by the address they embed. `CRONHOOK_EGRESS_ALLOW` opens
deliberate exceptions: CIDRs, and host names (`*.example.internal` for every subdomain).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _nets(*cidrs: str) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(c) for c in cidrs)


# (reason, networks) in the order they are tried; the reason is for operators' logs only.
DENIED_V4: tuple[tuple[str, tuple[IPNetwork, ...]], ...] = (
    ("unspecified", _nets("0.0.0.0/8")),
    ("loopback", _nets("127.0.0.0/8")),
    ("private", _nets("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")),
    ("shared (CGNAT)", _nets("100.64.0.0/10")),
    ("link-local", _nets("169.254.0.0/16")),
    ("documentation", _nets("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")),
    ("benchmarking", _nets("198.18.0.0/15")),
    ("multicast", _nets("224.0.0.0/4")),
    # 240/4 holds the broadcast address 255.255.255.255.
    ("reserved", _nets("192.0.0.0/24", "192.88.99.0/24", "240.0.0.0/4")),
)
DENIED_V6: tuple[tuple[str, tuple[IPNetwork, ...]], ...] = (
    ("unspecified", _nets("::/128")),
    ("loopback", _nets("::1/128")),
    ("unique-local", _nets("fc00::/7")),
    ("link-local", _nets("fe80::/10")),
    ("multicast", _nets("ff00::/8")),
    ("documentation", _nets("2001:db8::/32", "3fff::/20")),
    ("benchmarking", _nets("2001:2::/48")),
    # Local-use NAT64 embeds IPv4 per the operator's own prefix length: never a public address.
    ("nat64 local-use", _nets("64:ff9b:1::/48")),
    # IETF protocol assignments (Teredo, ORCHID, ...), site-local, discard-only, SRv6 SIDs.
    ("reserved", _nets("2001::/23", "fec0::/10", "100::/64", "5f00::/16")),
)
# Only the global unicast block is routable on the Internet; anything else is reserved.
GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")
NAT64_WELL_KNOWN = ipaddress.ip_network("64:ff9b::/96")
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
SIX_TO_FOUR = ipaddress.ip_network("2002::/16")

# Cloud metadata services: never reachable through a broad allowed range, only when the
# allow list names the address itself (or the host name) exactly.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "169.254.170.2", "100.100.100.200", "192.0.0.192", "fd00:ec2::254")
)
METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata.goog", "metadata", "instance-data"})


def normalize_host(host: str) -> str:
    return host.strip().rstrip(".").lower()


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped, compatible, NAT64, 6to4), if any."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in NAT64_WELL_KNOWN or (address in IPV4_COMPATIBLE and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in SIX_TO_FOUR:
        return address.sixtofour
    return None


def denied_reason(address: IPAddress) -> str | None:
    """Why the default policy refuses `address` (None: globally routable unicast)."""
    inner = embedded_ipv4(address)
    if inner is not None:
        return denied_reason(inner)
    if address in METADATA_ADDRESSES:
        return "cloud metadata"
    table = DENIED_V4 if isinstance(address, ipaddress.IPv4Address) else DENIED_V6
    for reason, networks in table:
        if any(address in network for network in networks):
            return reason
    if isinstance(address, ipaddress.IPv6Address) and address not in GLOBAL_UNICAST_V6:
        return "reserved"
    return None


def parse_address(text: str) -> IPAddress | None:
    """A strict IP literal (canonical dotted quad or IPv6, brackets and zone id allowed)."""
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    text = text.split("%", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def is_legacy_ipv4_literal(host: str) -> bool:
    """Numeric IPv4 spellings the C library accepts but that are not a dotted quad: 2130706433,
    0x7f000001, 0177.0.0.1, 127.1. They hide an address from anyone reading the URL."""
    host = host.rstrip(".")
    if not host or parse_address(host) is not None:
        return False
    if any(c not in "0123456789abcdefxABCDEFX." for c in host):
        return False
    try:
        socket.inet_aton(host)
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class EgressPolicy:
    """Default-deny for internal addresses; `networks` and `hosts` are the operator's exceptions."""

    networks: tuple[IPNetwork, ...] = ()
    # Exact names, and suffixes (".example.internal" from "*.example.internal").
    hosts: frozenset[str] = frozenset()
    host_suffixes: tuple[str, ...] = ()

    @property
    def is_default(self) -> bool:
        return not (self.networks or self.hosts or self.host_suffixes)

    def describe(self) -> str:
        names = [str(n) for n in self.networks] + sorted(self.hosts) + ["*" + s for s in self.host_suffixes]
        return ",".join(names)

    def allows_host(self, host: str) -> bool:
        """A host name the operator allowed: delivered to whatever it resolves to."""
        name = normalize_host(host)
        return name in self.hosts or any(name.endswith(suffix) for suffix in self.host_suffixes)

    def denies_host_name(self, host: str) -> bool:
        """Refused by name before any lookup (metadata services)."""
        return normalize_host(host) in METADATA_HOSTS and not self.allows_host(host)

    def allows_address(self, address: IPAddress) -> bool:
        candidates = [address]
        inner = embedded_ipv4(address)
        if inner is not None:
            candidates.append(inner)
        for candidate in candidates:
            for network in self.networks:
                if candidate.version != network.version or candidate not in network:
                    continue
                # A broad range never opens a metadata service; naming its address does.
                if candidate not in METADATA_ADDRESSES or network.num_addresses == 1:
                    return True
        return denied_reason(address) is None


def parse_egress_allow(text: str) -> EgressPolicy:
    """`10.0.0.0/8, 192.168.1.5, billing.internal, *.svc.cluster.local` -> EgressPolicy.
    Raises ValueError naming the first entry that is neither a CIDR nor a host name."""
    networks: list[IPNetwork] = []
    hosts: set[str] = set()
    suffixes: list[str] = []
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        if parse_address(entry) is not None or ("/" in entry and parse_address(entry.split("/", 1)[0])):
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            except ValueError as exc:
                raise ValueError(f"{entry!r} is not a valid CIDR") from exc
            continue
        name = normalize_host(entry.removeprefix("*."))
        if not _is_host_name(name) or is_legacy_ipv4_literal(name):
            raise ValueError(f"{entry!r} is neither a CIDR nor a host name")
        if entry.startswith("*."):
            suffixes.append("." + name)
        else:
            hosts.add(name)
    return EgressPolicy(tuple(networks), frozenset(hosts), tuple(suffixes))


def _is_host_name(name: str) -> bool:
    labels = name.split(".")
    return (
        0 < len(name) <= 253
        and all(0 < len(label) <= 63 for label in labels)
        # An all-numeric last label is an address in disguise, never a top-level domain.
        and not labels[-1].isdigit()
        and all(c.isascii() and (c.isalnum() or c in "-_") for c in name.replace(".", ""))
    )
