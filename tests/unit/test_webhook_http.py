"""The webhook HTTP client (app/services/webhook_http.py) against real servers on 127.0.0.1:
what goes on the wire, how answers are framed and capped, keep-alive, deadlines, TLS, and the
egress check on the address connected to."""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from app.domain.egress import EgressPolicy, parse_egress_allow
from app.services.egress_resolver import EgressDenied, EgressResolver, ResolveResult
from app.services.webhook_http import (
    MAX_BODY_BYTES,
    BadResponse,
    ConnectFailed,
    PostNotStarted,
    ServerClosed,
    WebhookHttp,
    parse_origin,
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


class Server:
    """A raw HTTP server: each connection runs `handler`; counts connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.server: asyncio.Server | None = None
        self.port = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def start(self, tls: ssl.SSLContext | None = None) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=tls)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    def url(self, path: str = "/hook", scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    return head, await reader.readexactly(length)


async def answer_each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reply: bytes) -> None:
    while True:
        await read_request(reader)
        writer.write(reply)
        await writer.drain()


class Loopback:
    """Resolves every name to `addresses` (loopback by default), in that order."""

    def __init__(self, addresses: tuple[str, ...] = ("127.0.0.1",)) -> None:
        self.addresses = addresses

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[ResolveResult]:
        return [
            {"hostname": host, "host": a, "port": port, "family": socket.AF_INET, "proto": 6, "flags": 0}
            for a in self.addresses
        ]

    async def close(self) -> None:
        pass


@pytest.fixture
async def http() -> AsyncIterator[WebhookHttp]:
    client = WebhookHttp(EgressResolver(parse_egress_allow("127.0.0.0/8")), max_idle=8)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def servers() -> AsyncIterator[list[Server]]:
    started: list[Server] = []
    yield started
    for server in started:
        await server.stop()


async def serve(servers: list[Server], handler: Handler, tls: ssl.SSLContext | None = None) -> Server:
    server = await Server(handler).start(tls)
    servers.append(server)
    return server


async def test_the_request_carries_host_length_headers_and_body_exactly(
    http: WebhookHttp, servers: list[Server]
) -> None:
    seen: list[tuple[bytes, bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(OK)

    server = await serve(servers, handler)
    origin = http.origin(server.url("/hook/a%20b?x=1&y=%2F"))
    response = await http.post(origin, b"x-one: 1\r\n", b'{"a": 1}', 5)
    assert (response.status, response.body, response.retry_after) == (200, b"ok", None)
    ((head, body),) = seen
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /hook/a%20b?x=1&y=%2F HTTP/1.1"
    assert lines[1:4] == [f"host: 127.0.0.1:{server.port}".encode(), b"x-one: 1", b"content-length: 8"]
    assert body == b'{"a": 1}'


async def test_keep_alive_reuses_one_connection_until_the_server_closes_it(
    http: WebhookHttp, servers: list[Server]
) -> None:
    server = await serve(servers, lambda r, w: answer_each(r, w, OK))
    origin = http.origin(server.url())
    for _ in range(3):
        assert (await http.post(origin, b"", b"{}", 5)).status == 200
    assert server.connections == 1 and http.connections_opened == 1

    async def once_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()

    closing = await serve(servers, once_then_close)
    origin = http.origin(closing.url())
    assert (await http.post(origin, b"", b"{}", 5)).status == 200
    # The server's close reaches the pool before the next POST: a new connection, no error.
    for _ in range(100):
        if not http._idle.get(origin.key) or all(c.closed for c in http._idle[origin.key]):
            break
        await asyncio.sleep(0.01)
    assert (await http.post(origin, b"", b"{}", 5)).status == 200
    assert closing.connections == 2


@pytest.mark.parametrize(
    ("reply", "status", "body"),
    [
        (b"HTTP/1.1 500 Oops\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", 500, b"abcde"),
        (b"HTTP/1.0 503 Busy\r\nretry-after: 7\r\n\r\nuntil the end", 503, b"until the end"),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", 204, b""),
        (b"HTTP/1.1 302 Found\r\nlocation: http://127.0.0.1:9/x\r\ncontent-length: 0\r\n\r\n", 302, b""),
    ],
    ids=["chunked", "until-close", "interim-100", "redirect-not-followed"],
)
async def test_answers_are_framed_as_http_1_1_says(
    http: WebhookHttp, servers: list[Server], reply: bytes, status: int, body: bytes
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply)
        await writer.drain()
        if b"HTTP/1.0" in reply:
            writer.close()
        else:
            await reader.read()  # keep the connection open

    server = await serve(servers, handler)
    response = await http.post(http.origin(server.url()), b"", b"{}", 5)
    assert (response.status, response.body) == (status, body)
    if status == 503:
        assert response.retry_after == "7"


async def test_a_body_beyond_64_kb_is_cut_and_its_connection_dropped(http: WebhookHttp, servers: list[Server]) -> None:
    async def huge(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 500 Big\r\ncontent-length: 10000000\r\n\r\n")
        for _ in range(10_000):
            writer.write(b"y" * 1000)
            await writer.drain()

    server = await serve(servers, huge)
    response = await http.post(http.origin(server.url()), b"", b"{}", 5)
    assert response.status == 500 and response.body == b"y" * MAX_BODY_BYTES
    assert http._idle_count == 0


async def test_endless_headers_a_garbage_answer_and_a_cut_body_are_errors(
    http: WebhookHttp, servers: list[Server]
) -> None:
    async def endless_headers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for i in range(100_000):
            writer.write(b"x-%d: %s\r\n" % (i, b"v" * 100))
            await writer.drain()

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
        await reader.read()

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this")

    for handler, error in ((endless_headers, BadResponse), (garbage, BadResponse), (cut, ServerClosed)):
        server = await serve(servers, handler)
        started = time.monotonic()
        with pytest.raises(error):
            await http.post(http.origin(server.url()), b"", b"{}", 10)
        assert time.monotonic() - started < 5  # not the deadline


async def test_the_deadline_covers_the_whole_exchange(http: WebhookHttp, servers: list[Server]) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(30)

    server = await serve(servers, silent)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await http.post(http.origin(server.url()), b"", b"{}", 0.3)
    assert 0.3 <= time.monotonic() - started < 2
    assert http._idle_count == 0


async def test_refused_connections_and_the_trust_check(http: WebhookHttp, servers: list[Server]) -> None:
    closed = await serve(servers, lambda r, w: answer_each(r, w, OK))
    origin = http.origin(closed.url())
    await closed.stop()
    servers.remove(closed)
    with pytest.raises(ConnectFailed) as refused:
        await http.post(origin, b"", b"{}", 5)
    assert refused.value.kind == "refused"

    requests = 0

    async def counting(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        while True:
            await read_request(reader)
            requests += 1
            writer.write(OK)

    server = await serve(servers, counting)
    origin = http.origin(server.url())
    with pytest.raises(PostNotStarted):
        await http.post(origin, b"", b"{}", 5, lambda: False)
    assert (await http.post(origin, b"", b"{}", 5, lambda: True)).status == 200
    assert requests == 1 and server.connections == 1  # the refused POST's connection was kept


async def test_the_egress_policy_checks_the_address_connected_to(servers: list[Server]) -> None:
    server = await serve(servers, lambda r, w: answer_each(r, w, OK))
    client = WebhookHttp(EgressResolver(EgressPolicy()), max_idle=2)
    try:
        for url in (server.url(), f"http://localhost:{server.port}/hook"):
            with pytest.raises(EgressDenied):
                await client.post(client.origin(url), b"", b"{}", 5)
    finally:
        await client.close()
    assert server.connections == 0


def test_urls_that_cannot_be_sent_are_refused() -> None:
    for url in ("ftp://example.com/", "http:///nohost", "http://example.com/a b"):
        with pytest.raises(ValueError):
            parse_origin(url)
    origin = parse_origin("https://Example.COM/p?q")
    assert (origin.host, origin.port, origin.tls) == ("example.com", 443, True)
    assert origin.request_start == b"POST /p?q HTTP/1.1\r\nhost: example.com\r\n"
    assert parse_origin("http://[::1]:8080").request_start == b"POST / HTTP/1.1\r\nhost: [::1]:8080\r\n"


def self_signed_certificate(folder: Path, name: str, alt_name: str) -> tuple[ssl.SSLContext, Path]:
    """A server-side TLS context for a certificate that names `name` (`alt_name`, e.g.
    `IP:127.0.0.1` or `DNS:localhost`), and the certificate's file (to trust it)."""
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert)),
            *("-days", "1", "-subj", f"/CN={name}", "-addext", f"subjectAltName={alt_name}"),
        ],
        check=True,
        capture_output=True,
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context, cert


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> ssl.SSLContext:
    context, _ = self_signed_certificate(tmp_path_factory.mktemp("tls"), "127.0.0.1", "IP:127.0.0.1")
    return context


async def test_tls_checks_the_certificate(
    http: WebhookHttp, servers: list[Server], self_signed: ssl.SSLContext
) -> None:
    server = await serve(servers, lambda r, w: answer_each(r, w, OK), tls=self_signed)
    with pytest.raises(ConnectFailed) as rejected:
        await http.post(http.origin(server.url(scheme="https")), b"", b"{}", 5)
    assert rejected.value.kind == "certificate"


def test_on_uvloop_as_the_scheduler_runs_it() -> None:
    """The scheduler runs on uvloop, whose transports are not asyncio's: the same exchanges."""
    import uvloop

    async def scenario() -> None:
        servers: list[Server] = []
        client = WebhookHttp(EgressResolver(parse_egress_allow("127.0.0.0/8")), max_idle=8)
        try:
            server = await serve(servers, lambda r, w: answer_each(r, w, OK))
            origin = client.origin(server.url())
            for _ in range(3):
                assert (await client.post(origin, b"", b"{}", 5)).status == 200
            assert server.connections == 1

            async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                await read_request(reader)
                await asyncio.sleep(30)

            quiet = await serve(servers, silent)
            with pytest.raises(TimeoutError):
                await client.post(client.origin(quiet.url()), b"", b"{}", 0.2)
        finally:
            await client.close()
            for server in servers:
                await server.stop()

    uvloop.run(scenario())


async def test_an_answer_nobody_asked_for_is_never_taken_for_the_next_requests(
    http: WebhookHttp, servers: list[Server]
) -> None:
    async def stray(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        # The answer, and in the same write the start of a second one.
        writer.write(OK + b"HTTP/1.1 500 Stray\r\ncontent-length: 5\r\n\r\nab")
        await writer.drain()
        await read_request(reader)
        writer.write(b"cde" + b"HTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        await reader.read()

    server = await serve(servers, stray)
    origin = http.origin(server.url())
    assert (await http.post(origin, b"", b"{}", 5)).status == 200
    # The connection that carried the stray bytes is gone: the next request gets a fresh
    # one and its own answer (here the handler's first, 200), never the stray 500.
    assert (await http.post(origin, b"", b"{}", 5)).status == 200
    assert server.connections == 2


async def test_interim_answers_are_bounded_and_an_upgrade_is_refused(http: WebhookHttp, servers: list[Server]) -> None:
    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for _ in range(10_000):
            writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n")
            await writer.drain()

    async def upgrade(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n")
        await reader.read()

    for handler in (flood, upgrade):
        server = await serve(servers, handler)
        started = time.monotonic()
        with pytest.raises(BadResponse):
            await http.post(http.origin(server.url()), b"", b"{}", 10)
        assert time.monotonic() - started < 5


async def test_a_body_of_exactly_64_kb_is_whole_and_keeps_its_connection(
    http: WebhookHttp, servers: list[Server]
) -> None:
    body = b"z" * MAX_BODY_BYTES
    reply = b"HTTP/1.1 500 Full\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    server = await serve(servers, lambda r, w: answer_each(r, w, reply))
    origin = http.origin(server.url())
    for _ in range(2):
        assert (await http.post(origin, b"", b"{}", 5)).body == body
    assert server.connections == 1


async def test_a_name_with_an_unreachable_address_first_is_reached_at_the_next_one(servers: list[Server]) -> None:
    server = await serve(servers, lambda r, w: answer_each(r, w, OK))
    # 127.0.0.2 at the same port: a listener whose accept queue is full drops new SYNs.
    hole = socket.socket()
    hole.bind(("127.0.0.2", server.port))
    hole.listen(0)
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        try:
            filler.connect(("127.0.0.2", server.port))
        except BlockingIOError:
            pass
        fillers.append(filler)

    client = WebhookHttp(
        EgressResolver(parse_egress_allow("127.0.0.0/8"), Loopback(("127.0.0.2", "127.0.0.1"))), max_idle=2
    )
    try:
        started = time.monotonic()
        response = await client.post(client.origin(f"http://dual.test:{server.port}/hook"), b"", b"{}", 3)
        assert response.status == 200 and time.monotonic() - started < 2
    finally:
        await client.close()
        for sock in (hole, *fillers):
            sock.close()


async def test_tls_to_a_name_with_a_trailing_dot_checks_the_name_without_it(
    servers: list[Server], tmp_path: Path
) -> None:
    server_side, cert = self_signed_certificate(tmp_path, "localhost", "DNS:localhost")
    server = await serve(servers, lambda r, w: answer_each(r, w, OK), tls=server_side)
    client = WebhookHttp(EgressResolver(parse_egress_allow("127.0.0.0/8"), Loopback()), max_idle=2)
    # This test's certificate as the only one trusted (the client uses the system's).
    client._ssl = ssl.create_default_context(cafile=str(cert))
    try:
        for name in ("localhost", "localhost."):
            response = await client.post(client.origin(f"https://{name}:{server.port}/hook"), b"", b"{}", 5)
            assert response.status == 200, name
    finally:
        await client.close()
