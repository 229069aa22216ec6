"""A port for a process a test starts, which binds it itself moments later.

Below the kernel's ephemeral range: a listener the tests open on port 0 (a receiver, a test
server, another worker's) is given ports in that range only, so it cannot take this one
between the check and the bind. Picked at random, and checked free, so parallel test
workers do not pick the same."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default start; other systems: 49152, above it anyway


def free_port() -> int:
    low = min(_ephemeral_low(), 65536)
    for _ in range(200):
        port = random.randint(10000, max(10001, low - 1))
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")
