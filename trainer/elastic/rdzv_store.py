"""The c10d rendezvous store of an elastic group, in a process of its own: no node hosts it.

In an all-or-nothing group node 0's agent hosts the store, and that is harmless: any lost node ends the group.
An elastic group goes on without a lost node, so the store must outlive every one of them, node 0 included:
``python -m trainer.elastic.rdzv_store HOST PORT`` serves it (torch's ``TCPStore``) until SIGTERM, and every
agent connects to it as a client (``--rdzv-conf is_host=0``). The local supervisor starts it before the agents
and ends it with the group; on Kubernetes it is the group's store pod (``airflow_dtrain.kubernetes.store``).
It lives here, beside ``trainer.launch``, because every training image has this package (torch only).
"""

from __future__ import annotations

import signal
import sys
import threading
from datetime import timedelta

from trainer.base.say import say

READY = "rendezvous store serving on"
"""The line the store prints once it accepts connections."""


def serve(host: str, port: int, stop: threading.Event) -> None:
    """Serve the store on ``host:port`` until ``stop`` is set."""
    from torch.distributed import TCPStore

    store = TCPStore(host, port, is_master=True, wait_for_workers=False, multi_tenant=True,
                     timeout=timedelta(seconds=60))  # fmt: skip
    print(f"{READY} {host}:{port}", flush=True)
    stop.wait()
    del store


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].isdigit():
        say("usage: python -m trainer.elastic.rdzv_store HOST PORT")
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    serve(argv[0], int(argv[1]), stop)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
