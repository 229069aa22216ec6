"""Enforcing the egress policy (app/domain/egress.py) where connections are made.

Delivery checks three times: the URL's host when it is an IP literal (the webhook client,
app/services/webhook_http.py, skips the resolver for those), every address a name resolves
to (only allowed ones are handed to the client, which connects to exactly those and caches
them for a minute: no second lookup a rebinding DNS server could
answer differently), and the address of every socket just before it connects. Target
create/update checks literals and what names resolve to at that moment, for a clear 422.

A refusal is an `EgressDenied` whose text is only "egress_denied": nothing about the address
reaches the tenant.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Protocol, TypedDict
from urllib.parse import urlsplit

from aiohappyeyeballs import AddrInfoType

from app.domain.egress import (
    EgressPolicy,
    IPAddress,
    is_legacy_ipv4_literal,
    parse_address,
)

EGRESS_DENIED = "egress_denied"
# The 422 for a target URL: deliberately silent about which range matched.
DENIED_DETAIL = (
    "must not point at a loopback, private, link-local or otherwise internal address "
    "(the operator lists allowed internal targets in CRONHOOK_EGRESS_ALLOW)"
)
LEGACY_LITERAL_DETAIL = "must spell an IPv4 address as four decimal numbers (a.b.c.d)"
# A create or update waits at most this long for DNS; a name that does not resolve in time
# is accepted and checked again at every delivery.
CREATE_LOOKUP_TIMEOUT_S = 2.0


class EgressDenied(OSError):
    def __init__(self) -> None:
        super().__init__(EGRESS_DENIED)


def literal_host_address(host: str) -> IPAddress | None:
    """The address an IP-literal host names, including legacy numeric IPv4 spellings."""
    address = parse_address(host)
    if address is None and is_legacy_ipv4_literal(host):
        address = ipaddress.IPv4Address(socket.inet_aton(host.rstrip(".")))
    return address


def literal_host_denied(policy: EgressPolicy, host: str) -> bool:
    """For delivery: True when `host` is an IP literal the policy refuses."""
    address = literal_host_address(host)
    return address is not None and not policy.allows_address(address)


class ResolveResult(TypedDict):
    """One address a name resolved to (the shape aiohttp's resolvers use)."""

    hostname: str
    host: str
    port: int
    family: int
    proto: int
    flags: int


class Resolver(Protocol):
    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]: ...

    async def close(self) -> None: ...


# Addresses come back as numbers, never names (getnameinfo, for a scoped IPv6 address).
_NUMERIC = socket.NI_NUMERICHOST | socket.NI_NUMERICSERV


class SystemResolver:
    """The system resolver (getaddrinfo in the loop's thread pool), as aiohttp's
    ThreadedResolver: stream sockets, only address families this host has configured."""

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, family=family, flags=socket.AI_ADDRCONFIG)
        results: list[ResolveResult] = []
        for info_family, _, proto, _, address in infos:
            if info_family == socket.AF_INET6:
                if len(address) < 3:
                    continue  # a Python built without IPv6
                if address[3]:
                    # A link-local address keeps its scope ("fe80::1%eth0").
                    resolved_host, service = await loop.getnameinfo(address, _NUMERIC)
                    results.append(_result(host, resolved_host, int(service), info_family, proto))
                    continue
            results.append(_result(host, str(address[0]), int(address[1]), info_family, proto))
        return results

    async def close(self) -> None:
        return None


def _result(hostname: str, host: str, port: int, family: int, proto: int) -> ResolveResult:
    return ResolveResult(hostname=hostname, host=host, port=port, family=family, proto=proto, flags=_NUMERIC)


class EgressResolver:
    """Resolves names with the system resolver and returns only the addresses allowed."""

    def __init__(self, policy: EgressPolicy, inner: Resolver | None = None) -> None:
        self._policy = policy
        self._inner: Resolver = inner or SystemResolver()
        # Addresses that allowed host names resolved to: the socket check lets these through.
        self.vetted: set[IPAddress] = set()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if self._policy.denies_host_name(host) or literal_host_denied(self._policy, host):
            raise EgressDenied()
        results = await self._inner.resolve(host, port, family)
        if self._policy.allows_host(host):
            self.vetted.update(a for r in results if (a := parse_address(r["host"])) is not None)
            return results
        # Judged by the policy alone: another name resolving to a vetted address gains nothing.
        allowed = [r for r in results if (a := parse_address(r["host"])) is not None and self._policy.allows_address(a)]
        if not allowed:
            raise EgressDenied()
        return allowed

    async def close(self) -> None:
        await self._inner.close()

    def socket_factory(self, addr_info: AddrInfoType) -> socket.socket:
        """The last check, on the address the socket is about to connect to. Only addresses
        this resolver handed over for an allowed name pass beyond the policy; IP-literal URLs
        were judged by the policy before the request (Dispatcher.deliver)."""
        family, type_, proto, _, sockaddr = addr_info
        address = parse_address(str(sockaddr[0]))
        if address is None or not (address in self.vetted or self._policy.allows_address(address)):
            raise EgressDenied()
        return socket.socket(family=family, type=type_, proto=proto)


async def url_refusal(policy: EgressPolicy, url: str, timeout_s: float = CREATE_LOOKUP_TIMEOUT_S) -> str | None:
    """Why a target may not have `url` (a 422 detail), or None. Looks the host up once."""
    host = urlsplit(url).hostname or ""
    if is_legacy_ipv4_literal(host):
        return LEGACY_LITERAL_DETAIL
    address = parse_address(host)
    if address is not None:
        return None if policy.allows_address(address) else DENIED_DETAIL
    if "%" in host:
        return "must not percent-encode the host name"
    if policy.allows_host(host):
        return None
    if policy.denies_host_name(host):
        return DENIED_DETAIL
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(loop.getaddrinfo(host, None, type=socket.SOCK_STREAM), timeout_s)
    except (OSError, TimeoutError, UnicodeError):
        return None
    for *_, sockaddr in infos:
        resolved = parse_address(str(sockaddr[0]))
        if resolved is None or not policy.allows_address(resolved):
            return DENIED_DETAIL
    return None
