"""A node's "checkpoint now" requests on Kubernetes, without ``pods/exec``: the launcher sets the pod
annotation ``dtrain.io/checkpoint-now``, the kubelet writes the pod's annotations into a downward-API volume
(``$DTRAIN_REQUESTS_FILE``), and a thread of the node's agent (``trainer.launch``) sends each new request
to the workers as SIGUSR1."""

import json
import os
import signal
import threading

from trainer.elastic.workers import worker_pids
from trainer.base.say import say

REQUESTS_FILE_ENV = "DTRAIN_REQUESTS_FILE"
"""The pod's annotations as the kubelet writes them (a downward-API volume): where "checkpoint now"
arrives."""
CHECKPOINT_NOW_ANNOTATION = "dtrain.io/checkpoint-now"


def read_annotation(path: str, key: str) -> str | None:
    """``key``'s value in a downward-API annotations file (``key="value"`` lines, the value JSON-quoted)."""
    try:
        with open(path) as f:
            for line in f:
                name, sep, value = line.rstrip("\n").partition("=")
                if sep and name == key:
                    try:
                        return json.loads(value)
                    except ValueError:
                        return value.strip('"')
    except OSError:
        return None
    return None


def signal_workers(sig: int = signal.SIGUSR1) -> int:
    """Send ``sig`` to this node's workers (the agent runs in this process; ``workers.worker_pids``): never
    the agent's fork server, nor what the workers start in turn (data loader workers). Returns how many were
    signalled."""
    asked = 0
    for pid in worker_pids(os.getpid()):
        try:
            os.kill(pid, sig)
            asked += 1
        except OSError:
            pass
    return asked


def watch_checkpoint_requests(
    path: str, poll_s: float = 1.0, stop: threading.Event | None = None
) -> threading.Thread:
    """Follow the annotations file at ``path``: each new value of ``dtrain.io/checkpoint-now`` (the launcher's
    request, set on the pod) sends the workers SIGUSR1, "checkpoint at the next step boundary and carry on".
    The value when the watch starts is an old request (a relaunched pod keeps none; this one may): ignored."""
    stop = stop or threading.Event()

    def run() -> None:
        seen = read_annotation(path, CHECKPOINT_NOW_ANNOTATION)
        while not stop.wait(poll_s):
            value = read_annotation(path, CHECKPOINT_NOW_ANNOTATION)
            if value is not None and value != seen:
                seen = value
                asked = signal_workers()
                say(f"[trainer.launch] checkpoint-now request {value}: SIGUSR1 to {asked} worker(s)")

    thread = threading.Thread(target=run, name="checkpoint-now-watch", daemon=True)
    thread.start()
    return thread
