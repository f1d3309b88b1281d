"""Free loopback ports for the processes tests start (servers, operators, Prometheus, the API emulator)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on now; the caller binds it soon after (a small race every test accepts)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
