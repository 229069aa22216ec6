"""A webhook receiver for the compose end-to-end test (tests/compose/): run in a container on
the deployment's network (`--network-alias receiver`), it answers every POST 200 and keeps it,
headers and body; GET /_received?since=N returns those from the N-th on, for the test on the
host to read through a published port. Standard library only: it runs on the bare Python base
image (the official one or the stand-in), with nothing installed."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

PORT = 8000

_received: list[dict[str, object]] = []
_lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    # Keep-alive, as webhook clients expect of a server.
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        record = {
            "path": self.path,
            "headers": {name.lower(): value for name, value in self.headers.items()},
            "body": body.decode("utf-8", errors="replace"),
            "at": time.time(),
        }
        with _lock:
            _received.append(record)
        self._answer(200, b"ok", "text/plain")

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path != "/_received":
            self._answer(404, b"not found", "text/plain")
            return
        since = int(parse_qs(url.query).get("since", ["0"])[0])
        with _lock:
            items = _received[since:]
            total = len(_received)
        self._answer(200, json.dumps({"total": total, "items": items}).encode(), "application/json")

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per delivery would drown the container's log


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # Hundreds of deliveries may connect at once.
    request_queue_size = 1024


if __name__ == "__main__":
    # Every address of its container: the deployment's network and the published port.
    Server(("0.0.0.0", PORT), Handler).serve_forever()
