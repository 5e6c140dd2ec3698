"""An elastic group's training processes outlive a resize: each node keeps one host process per local rank,
and every start of a worker by its torchrun agent trains in that host, not in a new process.

torchrun's agent answers a resize (a node lost or joining) by stopping its workers and starting new ones
at the new rendezvous. Every survivor then pays a process's start again: its GPU's context, the model's
build, and ``torch.compile``'s tracing (seconds even from a warm cache; on a GPU a cold one is most of a
minute). In a host, the dynamo code cache of the compiled blocks, the imports and the device context stay:
measured on CPU, the first step after a rebuild at a smaller world took 0.2 s in the same process against
3.5 s in a new one with a warm cache (``benchmarks/RESULTS.md``, recovery).

How: ``trainer.launch`` starts the hosts from its fork server (torch and the trainer imported) when the group
is elastic (``--max-restarts`` > 0). The worker the agent forks (``trainer.elastic.forked_worker``) stays
what the agent sees and signals, a small proxy named ``dtrain-p<rank>``: it hands its arguments and
environment to its local rank's host over a Unix socket, forwards every signal it gets (SIGTERM, SIGINT,
SIGHUP, SIGUSR1), and exits with the host's exit code. The host, named ``dtrain-r<rank>`` while it trains
(``dtrain-h<local rank>`` while it waits), runs ``python -m trainer``'s main in itself, with that environment.

A host trains again only after a clean resumable stop (exit 75: every rank saved and left its process
group); after anything else it exits, and the next worker trains in its own process as it would without
hosts. A host whose proxy is gone mid-round (the agent killed it) exits at once: the agent counts that
worker as dead. If the proxy loses its host (killed, out of memory), it kills itself with SIGKILL, so that
its agent sees what it would see of a killed worker. ``DTRAIN_KEEP_WORKERS=0``
(``JobSpec.keep_workers=False``) starts every worker as its own process, as before. Stdlib only until a round
runs.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import sys
import threading
from multiprocessing.connection import Client, Connection

from trainer.elastic import warm_join
from trainer.torch_private import elastic_hooks
from trainer.elastic.startup import STARTED_AT_ENV, process_started_at
from trainer.elastic.workers import name_this_process

HOSTS_ENV = "DTRAIN_WORKER_HOSTS"
"""The directory of a node's host sockets (``<local rank>.sock``), set by ``trainer.launch`` for its
workers."""
KEEP_ENV = "DTRAIN_KEEP_WORKERS"
"""``0``: no hosts; an elastic group's agent starts new training processes at every resize."""
PROXY_NAME, IDLE_NAME = "dtrain-p", "dtrain-h"
REUSABLE_EXIT_CODE = 75  # trainer.config.job_config.PREEMPTED_EXIT_CODE, without importing the config here
HANDSHAKE_S = 60.0
"""How long a worker waits for its host to take it (the host starts once the fork server has imported torch,
as the worker itself does): past that, it trains in its own process."""
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)


def socket_path(directory: str, local_rank: int) -> str:
    return os.path.join(directory, f"{local_rank}.sock")


def keep_training_processes(directory: str, local_ranks: int, context, warm=None) -> str | None:
    """``start_hosts``, then, with ``warm``, wait for their warm-up before the agent meets its peers, so that
    a node joining a group in training does not make the survivors wait for its compile. What the agent has
    to say about it, if anything."""
    try:
        hosts = start_hosts(directory, local_ranks, context, warm)
    except OSError as err:  # a speed-up, never a reason to fail: workers find no host, train alone
        return f"no kept training processes ({err}): every resize starts new ones"
    if warm is None:
        return None
    ended = lambda: any(host.exitcode is not None for host in hosts)  # noqa: E731
    return "this node " + warm_join.wait_for_the_hosts(directory, local_ranks, ended)


def start_hosts(directory: str, local_ranks: int, context, warm: tuple[list[str], int] | None = None) -> list:
    """Start one host per local rank from ``context`` (the agent's fork server), listening in ``directory``
    (private to this user). Daemonic: they end with the agent. The sockets listen before this returns (a
    worker that connects early waits in the backlog); the hosts start in a thread, for the fork server may
    still be importing torch. ``warm``: (the training arguments, the group's full world size): each host
    first compiles in a world of its own (``trainer.elastic.warm_join``) and says so in ``directory``.
    Returns the
    hosts' processes, as they start."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    listeners, hosts = [], []
    for local_rank in range(local_ranks):
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(socket_path(directory, local_rank))
        listener.listen(1)
        listeners.append(listener)

    def start() -> None:
        for local_rank, listener in enumerate(listeners):
            host = context.Process(
                target=serve, args=(listener, local_rank, directory, warm), name=f"{IDLE_NAME}{local_rank}"
            )
            host.daemon = True
            host.start()
            hosts.append(host)
            listener.close()  # the host has its own (passed through the fork server)

    threading.Thread(target=start, name="dtrain-hosts", daemon=True).start()
    return hosts


def serve(listener: socket.socket, local_rank: int, directory: str = "", warm=None) -> None:
    """A host: warm up if asked (``start_hosts``), then train one round per worker that connects, while each
    round ends in a clean resumable stop."""
    name_this_process(local_rank, prefix=IDLE_NAME)
    threading.Thread(target=_exit_when_orphaned, daemon=True).start()
    if warm is not None:
        argv, world_size = warm
        warm_join.warm_up_and_tell(directory, local_rank, world_size, argv, free=free_the_last_round)
    while True:
        accepted, _ = listener.accept()
        try:
            code = _one_round(Connection(accepted.detach()))
        except (EOFError, OSError, ValueError):  # the handshake: a worker that gave up waiting for this host
            continue
        if code != REUSABLE_EXIT_CODE:
            return
        name_this_process(local_rank, prefix=IDLE_NAME)


def _one_round(conn: Connection) -> int:
    """Train with the worker's arguments and environment; answer its exit code. The round's end, whatever
    it is, is this host's exit code."""
    conn.send_bytes(json.dumps({"pid": os.getpid()}).encode())
    request = json.loads(conn.recv_bytes())  # nothing has changed in this host until here
    os.environ.clear()
    os.environ.update(request["env"], **{STARTED_AT_ENV: str(request["started_at"])})
    done = threading.Event()
    watcher = threading.Thread(target=_exit_if_the_worker_goes, args=(conn, done), daemon=True)
    watcher.start()
    try:
        code = _train(request["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - told as a crash would be, then this host ends
        import traceback

        traceback.print_exc()
        code = 1
    done.set()
    _stop_watching(conn, watcher)
    for sig in FORWARDED:  # the round ignored further signals while saving; idle, they end the host
        signal.signal(sig, signal.SIG_DFL)
    try:
        conn.send_bytes(json.dumps({"code": code}).encode())
    except OSError:  # the worker went after the round: its agent has seen that, this round still ended so
        pass
    conn.close()
    free_the_last_round()
    return code


def _train(argv: list[str]) -> int:
    from trainer.__main__ import main

    prepare(int(os.environ.get("RANK", "0")))
    sys.argv = [sys.argv[0], *argv]
    return main(list(argv))


def prepare(rank: int) -> None:
    """What ``python -u`` and a new interpreter would give a training process of ``rank``."""
    name_this_process(rank)
    if threads := os.environ.get("OMP_NUM_THREADS"):  # the worker's, whatever the fork server's OpenMP read
        import torch

        torch.set_num_threads(int(threads))
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)  # as -u: each line reaches the node's log whole, at once


def free_the_last_round() -> None:
    """Let the last round's model, optimizer and buffers go before the next builds its own, and forget its
    world: DTensor caches its sharding decisions by device mesh, and a mesh equals another of the same shape
    whatever this process's rank in it. Kept, the next round's parameters would take the last round's mesh,
    and with it its rank's shard offsets (seen: a survivor that was rank 1, now rank 0, saving rank 1's
    shard).
    ``trainer.step.train_step.build_model`` checks that none is left."""
    forget_the_last_world()
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def forget_the_last_world() -> None:
    """Clear torch's caches keyed by device mesh (``torch.distributed.tensor``'s sharding propagation, its
    redistribution plans and mesh topology: ``trainer.torch_private``, hook ``dtensor_mesh_caches``; where
    this torch lacks them, ``trainer.launch`` keeps no process across worlds)."""
    if "torch.distributed.tensor" in sys.modules:
        elastic_hooks.clear_mesh_caches()


def _exit_if_the_worker_goes(conn: Connection, done: threading.Event) -> None:
    """The proxy sends nothing after its request: end of file means it is gone (the agent killed it, or
    it died with the agent). Its agent counts this rank as dead: so must this host be, at once."""
    try:
        conn.recv_bytes()
    except (EOFError, OSError):
        pass
    if not done.is_set():
        os._exit(1)


def _stop_watching(conn: Connection, watcher: threading.Thread) -> None:
    """End the watcher's read before the connection closes: closed under it, its descriptor's number could
    go to the next round's connection while the watcher is about to read, and the watcher would take that
    round's request (seen: a host waiting for a request its watcher had read). Shutting the reading side
    down makes the read end at once (end of file); the code is still sent after."""
    try:
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            sock.shutdown(socket.SHUT_RD)
    except OSError:  # the worker has gone already: its watcher has seen the end
        pass
    watcher.join(timeout=5.0)


def _exit_when_orphaned(poll_s: float = 1.0) -> None:
    """The fork server that started this host ends with its agent: so does an idle host."""
    parent = os.getppid()
    while os.getppid() == parent:
        threading.Event().wait(poll_s)
    os._exit(0)


def run_in_host(local_rank: int, argv: list[str]) -> int | None:
    """The proxy's side: train ``argv`` in this local rank's host and return its exit code; None when there
    is no host to train in (none started, or it has ended): train here."""
    directory = os.environ.get(HOSTS_ENV)
    if not directory:
        return None
    try:
        conn = Client(socket_path(directory, local_rank), family="AF_UNIX")
        if not conn.poll(HANDSHAKE_S):
            conn.close()
            return None
        host = json.loads(conn.recv_bytes())["pid"]
    except (OSError, EOFError, ValueError, KeyError):
        return None
    name_this_process(int(os.environ.get("RANK", "0")), prefix=PROXY_NAME)
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, frame: _forward(host, signum))
    conn.send_bytes(json.dumps({"argv": list(argv), "env": dict(os.environ),
                                "started_at": process_started_at()}).encode())  # fmt: skip
    try:
        return int(json.loads(conn.recv_bytes())["code"])
    except (EOFError, OSError, ValueError, KeyError):  # the host died mid-round: as a killed worker would
        os.kill(os.getpid(), signal.SIGKILL)
        return None  # not reached


def _forward(host: int, signum: int) -> None:
    try:
        os.kill(host, signum)
    except OSError:
        pass
