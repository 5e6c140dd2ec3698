"""Ports for the local backend's rendezvous stores. Stdlib only."""

from __future__ import annotations

import random
import socket


def _ephemeral_ports() -> range:
    """The kernel's range for sockets bound to port 0 (Linux: ip_local_port_range)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = map(int, f.read().split())
        return range(low, high + 1)
    except (OSError, ValueError):
        return range(32768, 61000)


def free_port(tries: int = 200) -> int:
    """A free port for a group's rendezvous store, outside the kernel's ephemeral range: node 0's agent binds
    it seconds later (after importing torch), and in between any socket bound to port 0 -- a gloo listener of
    a group beside it, a client connection -- could take a port from that range, not from this one."""
    ephemeral = _ephemeral_ports()
    for _ in range(tries):
        port = random.randint(10_000, 65_535)
        if port in ephemeral:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # every port tried was taken
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
