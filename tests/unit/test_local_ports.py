"""The local backend's rendezvous port comes from outside the kernel's ephemeral range, which sockets bound to
port 0 (gloo's listeners, client connections of the groups beside it) draw from while node 0's agent is still
starting."""

from __future__ import annotations

import socket

from airflow_dtrain.launchers.ports import _ephemeral_ports, free_port


def test_a_groups_port_is_free_and_outside_the_ephemeral_range():
    ephemeral = _ephemeral_ports()
    for _ in range(50):
        port = free_port()
        assert port not in ephemeral
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))  # free: the agent can bind it
