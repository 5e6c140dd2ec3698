"""A statsd target to read back: what statsd_exporter would get, kept in a list.

Shared by the tests (tests/conftest.py's ``statsd_listener`` fixture) and the load test
(benchmarks/load.py), which checks that no datagram of one job carries another's tags.
"""

from __future__ import annotations

import socket
import threading
import time


class StatsdListener:
    """A real UDP socket on 127.0.0.1 keeping every statsd line it receives, from its creation until
    :meth:`close` (a datagram that is not UTF-8 is kept with its bad bytes replaced)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65535)
            except TimeoutError:
                continue
            self.lines.extend(data.decode(errors="replace").splitlines())

    def names(self) -> set[str]:
        return {line.split(":", 1)[0] for line in self.lines}

    def wait_for(self, line: str, timeout: float = 10.0) -> None:
        """Until ``line`` has arrived, with any tags after it (UDP: the sender does not wait for it)."""
        deadline = time.monotonic() + timeout
        while not any(got == line or got.startswith(f"{line}|#") for got in self.lines):
            assert time.monotonic() < deadline, f"statsd never got {line!r}; got {self.lines}"
            time.sleep(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.setblocking(False)  # what arrived while the thread was stopping
        while True:
            try:
                self.lines.extend(self.sock.recv(65535).decode(errors="replace").splitlines())
            except BlockingIOError:
                break
        self.sock.close()
