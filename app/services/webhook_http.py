"""The HTTP/1.1 client that POSTs webhooks: keep-alive connections per origin, one write per
request, the response parsed by httptools (llhttp, the parser behind uvicorn and Node.js).

Why not aiohttp, which cronhook used before: a POST through aiohttp's ClientSession cost
78-85 us of CPU on this box, against 13 us for a protocol on the event loop
(bench/log/2026-11-25-webhook-client.md); deliveries are the scheduler's hot path. This client
does only what a webhook POST needs, and the rules a delivery must keep:

- no redirects: a 3xx is an answer like any other;
- a total deadline per request, connecting included (`timeout_s`);
- at most `MAX_BODY_BYTES` of a response body are kept and at most `MAX_HEAD_BYTES` of its
  status line and headers are read; a longer body ends the read and the connection;
- the egress policy on every address connected to (app/services/egress_resolver.py): names
  resolve through `EgressResolver` (allowed addresses only, cached `DNS_TTL_S`), and every
  socket passes its `socket_factory` check before it connects;
- `may_send`, the delivery's last trust check, runs once a connection is in hand (new or
  pooled) and before a byte of the request is written, with no await in between;
- TLS with the system's trust store and host name checks (ssl.create_default_context()).

Errors a caller classifies: `TimeoutError` (the deadline), `EgressDenied`, `ConnectFailed`
(with `kind`), `ServerClosed`, `BadResponse`, `ValueError` (a URL that cannot be sent).
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any, cast

import httptools
from aiohappyeyeballs import start_connection
from yarl import URL

from app.domain.egress import parse_address
from app.services.egress_resolver import EgressDenied, EgressResolver

MAX_BODY_BYTES = 64 * 1024
MAX_HEAD_BYTES = 64 * 1024
# An idle pooled connection older than this is closed (aiohttp's default keep-alive).
KEEPALIVE_S = 15.0
# How long the addresses a name resolved to are used before it is resolved again.
DNS_TTL_S = 60.0
# Interim (1xx) answers accepted before the real one.
MAX_INTERIM_RESPONSES = 8
# Happy eyeballs (RFC 8305) between a name's addresses, as aiohttp connected: the next address
# is tried this long after the previous one started, so one unreachable address does not
# use up the deadline.
HAPPY_EYEBALLS_DELAY_S = 0.25
# Parsed target URLs remembered (then the memory starts over).
_ORIGIN_CACHE_SIZE = 10_000


class PostNotStarted(Exception):
    """The last trust check failed: nothing was written to the network."""


class ConnectFailed(Exception):
    """No connection: `kind` is dns, refused, reset, tls, certificate or other."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class ServerClosed(Exception):
    """The connection ended before a whole response arrived."""


class BadResponse(Exception):
    """The answer is not an HTTP/1.x response this client accepts."""


@dataclasses.dataclass(frozen=True, slots=True)
class Response:
    status: int
    retry_after: str | None
    # At most MAX_BODY_BYTES of the body.
    body: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class Origin:
    """What a target URL is sent to, parsed once."""

    key: tuple[str, str, int]
    host: str  # for DNS and TLS (IDNA-encoded, no brackets)
    port: int
    tls: bool
    # The request line's target and the Host header, ready to send.
    request_start: bytes


def parse_origin(url: str) -> Origin:
    """Raises ValueError for a URL that cannot be sent (scheme, host, characters).

    The path and query go out as the target gave them (the API accepts only ASCII URLs
    without spaces or control characters): no re-encoding or normalizing."""
    parsed = URL(url, encoded=True)
    scheme = parsed.scheme.lower()
    host = (parsed.raw_host or "").lower()
    default_port = {"http": 80, "https": 443}.get(scheme)
    port = parsed.explicit_port if parsed.explicit_port is not None else default_port
    if scheme not in ("http", "https") or not host or port is None:
        raise ValueError("not an http(s) URL with a host")
    target = parsed.raw_path_qs or "/"
    if not target.startswith("/"):
        target = "/" + target
    name = f"[{host}]" if ":" in host else host
    host_header = name if port == default_port else f"{name}:{port}"
    line = f"POST {target} HTTP/1.1\r\nhost: {host_header}\r\n"
    if not line.isascii() or any(c in target + host_header for c in "\r\n\x00 "):
        raise ValueError("the URL has characters a request line cannot carry")
    return Origin((scheme, host, port), host, port, scheme == "https", line.encode("ascii"))


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self, pool: WebhookHttp, key: tuple[str, str, int]) -> None:
        self._pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._waiter: asyncio.Future[Response] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._parser: Any = None
        self._head_bytes = 0
        self._headers_done = False
        self._framed = False  # Content-Length or chunked: EOF before the end is an error
        self._interim = 0
        self._retry_after: str | None = None
        self._body: list[bytes] = []
        self._body_bytes = 0
        self.reusable = False
        # In the pool's idle list (WebhookHttp._give_back), waiting for the next request.
        self.pooled = False

    # --- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses: no isinstance check.
        self.transport = cast(asyncio.Transport, transport)
        # One parser for the connection's responses, one after another (keep-alive): making
        # one costs about as much as parsing a response.
        self._parser = httptools.HttpResponseParser(self)

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            # Bytes nobody asked for: the connection's framing can no longer be trusted.
            self.close()
            return
        if not self._headers_done:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(BadResponse("protocol upgrade"))
        except httptools.HttpParserError as exc:
            self._fail(BadResponse(str(exc)))
        # Headers without end (a hostile or broken receiver): stop reading them.
        if not self._headers_done and self._head_bytes > MAX_HEAD_BYTES:
            self._fail(BadResponse("response head too large"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool._forget(self)
        if self._waiter is not None and not self._waiter.done():
            if self._headers_done and not self._framed:
                self._complete(keep=False)  # a body delimited by the end of the connection
            else:
                self._fail(ServerClosed())

    # --- httptools callbacks ------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._waiter is None or self._waiter.done():
            # A second answer after the one this request got, in the same read: unasked for,
            # it would be taken for the next request's answer. The connection goes.
            self.close()

    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower == b"retry-after":
            self._retry_after = value.decode("latin-1")
        elif lower == b"content-length" or (lower == b"transfer-encoding" and b"chunked" in value.lower()):
            # Otherwise the body ends with the connection (RFC 9112 6.3).
            self._framed = True

    def on_headers_complete(self) -> None:
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            return  # the cap was reached earlier in this read
        room = MAX_BODY_BYTES - self._body_bytes
        if len(body) <= room:
            self._body.append(body)
            self._body_bytes += len(body)
            return
        # The cap: keep what fits and stop reading (the connection goes, not back to the pool).
        self._body.append(body[:room])
        self._body_bytes += room
        self._complete(keep=False)

    def on_message_complete(self) -> None:
        status = self._parser.get_status_code()
        if status == 101:
            self._fail(BadResponse("protocol upgrade"))
            return
        if 100 <= status < 200:
            # An interim answer (100 Continue, 103 Early Hints): the real one follows. Its
            # bytes still count against MAX_HEAD_BYTES, and only so many are taken.
            self._interim += 1
            if self._interim > MAX_INTERIM_RESPONSES:
                self._fail(BadResponse("too many interim responses"))
                return
            self._headers_done = self._framed = False
            self._retry_after = None
            return
        self._complete(keep=self._parser.should_keep_alive())

    # --- the exchange -------------------------------------------------------------------

    async def exchange(self, data: bytes, deadline: float) -> Response:
        loop = self._pool.loop
        waiter: asyncio.Future[Response] = loop.create_future()
        self._waiter = waiter
        self._head_bytes = self._body_bytes = 0
        self._headers_done = self._framed = False
        self._interim = 0
        self._retry_after = None
        self._body = []
        self.reusable = False
        self._timer = loop.call_at(deadline, self._on_deadline)
        assert self.transport is not None
        self.transport.write(data)
        try:
            return await waiter
        finally:
            # Cancelled or failed, `reusable` stayed False: the connection is closed.
            self._timer.cancel()
            self._waiter = None

    def _on_deadline(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._fail(TimeoutError())

    def _complete(self, keep: bool) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        # Not when request bytes are still unsent (an early answer, a large payload): the
        # rest would reach the server as the start of the next request.
        assert self.transport is not None
        self.reusable = keep and not self.closed and self.transport.get_write_buffer_size() == 0
        waiter.set_result(Response(self._parser.get_status_code(), self._retry_after, b"".join(self._body)))
        if not self.reusable:
            self.close()

    def _fail(self, exc: BaseException) -> None:
        waiter = self._waiter
        self.reusable = False
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.close()

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()
            self._pool._forget(self)


class WebhookHttp:
    """A pool of keep-alive connections and the POST that uses them."""

    def __init__(self, resolver: EgressResolver, max_idle: int, keepalive_s: float = KEEPALIVE_S) -> None:
        self.loop = asyncio.get_running_loop()
        self._resolver = resolver
        self._max_idle = max(1, max_idle)
        self._keepalive_s = keepalive_s
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._idle_count = 0
        self._open: set[_Connection] = set()
        self._dns: dict[tuple[str, int], tuple[float, list[dict[str, Any]]]] = {}
        self._origins: dict[str, Origin] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._ssl: ssl.SSLContext | None = None
        self.connections_opened = 0

    def origin(self, url: str) -> Origin:
        origin = self._origins.get(url)
        if origin is None:
            if len(self._origins) >= _ORIGIN_CACHE_SIZE:
                self._origins.clear()
            origin = self._origins[url] = parse_origin(url)
        return origin

    async def post(
        self,
        origin: Origin,
        head: bytes,
        body: bytes,
        timeout_s: float,
        may_send: Callable[[], bool] | None = None,
    ) -> Response:
        """POSTs `body` with `head` (header lines, each ending in CRLF, no Host or
        Content-Length) to `origin`, within `timeout_s` in all.

        Raises PostNotStarted, without writing anything, when `may_send` says no once the
        connection is in hand."""
        deadline = self.loop.time() + timeout_s
        conn = self._take(origin.key)
        if conn is None:
            async with asyncio.timeout_at(deadline):
                conn = await self._connect(origin)
        if may_send is not None:
            try:
                allowed = may_send()
            except BaseException:
                conn.close()
                raise
            if not allowed:
                self._give_back(conn)
                raise PostNotStarted
        request = b"%s%scontent-length: %d\r\n\r\n%s" % (origin.request_start, head, len(body), body)
        try:
            return await conn.exchange(request, deadline)
        finally:
            if conn.reusable:
                self._give_back(conn)
            else:
                conn.close()

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self._open):
            conn.close()
        self._idle.clear()
        self._idle_count = 0
        await self._resolver.close()

    # --- the pool -----------------------------------------------------------------------

    def _take(self, key: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = self._unpool(idle.pop())
            assert conn.transport is not None
            # Closing: the server's end of the connection arrived, its connection_lost not yet.
            if not conn.closed and not conn.transport.is_closing() and now - conn.idle_since < self._keepalive_s:
                return conn
            conn.close()
        return None

    def _give_back(self, conn: _Connection) -> None:
        if conn.closed or conn.pooled:
            return
        if self._idle_count >= self._max_idle:
            self._close_oldest_idle()
        conn.idle_since = time.monotonic()
        conn.pooled = True
        self._idle.setdefault(conn.key, []).append(conn)
        self._idle_count += 1
        if self._sweeper is None:
            self._sweeper = self.loop.call_later(self._keepalive_s, self._sweep)

    def _unpool(self, conn: _Connection) -> _Connection:
        """Counts a connection taken off its idle list out of the pool."""
        conn.pooled = False
        self._idle_count -= 1
        return conn

    def _forget(self, conn: _Connection) -> None:
        """A connection ended: out of the pool, and off its idle list if it waited there."""
        self._open.discard(conn)
        if conn.pooled:
            idle = self._idle.get(conn.key)
            if idle is not None and conn in idle:
                idle.remove(conn)
                self._unpool(conn)

    def _close_oldest_idle(self) -> None:
        oldest = min((conns[0] for conns in self._idle.values() if conns), key=lambda c: c.idle_since, default=None)
        if oldest is not None:
            self._idle[oldest.key].remove(oldest)
            self._unpool(oldest).close()

    def _sweep(self) -> None:
        self._sweeper = None
        now = time.monotonic()
        for key, conns in list(self._idle.items()):
            keep = [c for c in conns if not c.closed and now - c.idle_since < self._keepalive_s]
            self._idle[key] = keep
            for conn in conns:
                if conn not in keep:
                    self._unpool(conn).close()
            if not keep:
                del self._idle[key]
        if self._idle_count:
            self._sweeper = self.loop.call_later(self._keepalive_s, self._sweep)

    # --- connecting ---------------------------------------------------------------------

    async def _connect(self, origin: Origin) -> _Connection:
        infos = [
            (family, socket.SOCK_STREAM, proto, "", sockaddr)
            for family, proto, sockaddr in await self._addresses(origin)
        ]
        try:
            # Every socket is made by the resolver's factory: the policy's last word on the
            # very address it connects to (EgressDenied, and the next address is tried).
            sock = await start_connection(
                infos,
                happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY_S,
                loop=self.loop,
                socket_factory=self._resolver.socket_factory,
            )
        except EgressDenied:
            raise
        except ConnectionRefusedError:
            raise ConnectFailed("refused") from None
        except ConnectionResetError:
            raise ConnectFailed("reset") from None
        except OSError:
            raise ConnectFailed("other") from None
        return await self._wrap(origin, sock)

    async def _wrap(self, origin: Origin, sock: socket.socket) -> _Connection:
        tls = self._tls() if origin.tls else None
        try:
            _, conn = await self.loop.create_connection(
                lambda: _Connection(self, origin.key),
                sock=sock,
                ssl=tls,
                # The name as certificates spell it: without a trailing dot (`host.`).
                server_hostname=origin.host.rstrip(".") if tls else None,
            )
        except ssl.SSLCertVerificationError:
            sock.close()
            raise ConnectFailed("certificate") from None
        except (ssl.SSLError, ConnectionResetError):
            sock.close()
            raise ConnectFailed("tls" if tls else "reset") from None
        except BaseException:
            sock.close()
            raise
        self._open.add(conn)
        self.connections_opened += 1
        return conn

    def _tls(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    async def _addresses(self, origin: Origin) -> list[tuple[int, int, tuple[Any, ...]]]:
        address = parse_address(origin.host)
        if address is not None:
            family = socket.AF_INET if address.version == 4 else socket.AF_INET6
            return [(family, 0, _sockaddr(family, str(address), origin.port))]
        key = (origin.host, origin.port)
        cached = self._dns.get(key)
        if cached is None or cached[0] < time.monotonic():
            try:
                results = await self._resolver.resolve(origin.host, origin.port, socket.AF_UNSPEC)
            except EgressDenied:
                raise
            except OSError:
                raise ConnectFailed("dns") from None
            if len(self._dns) >= _ORIGIN_CACHE_SIZE:
                self._dns.clear()
            cached = self._dns[key] = (time.monotonic() + DNS_TTL_S, [dict(r) for r in results])
        return [(r["family"], r["proto"], _sockaddr(r["family"], r["host"], r["port"])) for r in cached[1]]


def _sockaddr(family: int, host: str, port: int) -> tuple[Any, ...]:
    return (host, port, 0, 0) if family == socket.AF_INET6 else (host, port)
