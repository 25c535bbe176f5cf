"""Loopback ports chosen free at run time, so parallel runs and busy machines never collide."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port nothing listens on right now.

    The port is released before it is returned; a server started on it at once wins it in
    practice, and the tests that start servers name the port in their failure messages.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
