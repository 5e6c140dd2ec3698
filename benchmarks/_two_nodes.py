"""recovery.py's "one of two nodes lost" rows: a local group of 2 nodes x 1 process (``LocalLauncher``),
SIGTERM to one node's agent, the clock stopped at the first step after it."""

import json
import os
import shutil
import statistics
import signal
import tempfile
import time

from _common import REPO
from _where import after_resume, startup_after

POLL_S = 0.01  # how often the group's events are looked at: the clock's resolution

ROWS = {  # --two-node KEY: (elastic, the node lost, node_lost_round's options, label)
    "relaunch": (False, 1, {}, "2 nodes, all or nothing: whole-group relaunch"),
    "replaced": (True, 1, {}, "2 nodes, elastic: one node replaced"),
    "node0": (True, 0, {}, "2 nodes, elastic: node 0 replaced"),
    "alone": (True, 1, {"replaced": False}, "2 nodes, elastic, none to replace it: on at 1 once all are in"),
    "last-call": (True, 1, {"replaced": False, "last_call": True}, "2 nodes, elastic, none to replace it: "
                  "on at 1 after torch's last call (replace_timeout_s 30 s)"),
    "join": (True, 1, {"replaced": False, "join_after": 3}, "2 nodes, elastic, on at 1, then a node joins"),
}  # fmt: skip


def _two_node_spec(root: str, flavor: str, elastic: bool, compiled: bool):
    """recovery.py's job as a group of 2 nodes x 1 process, the same sizes: elastic (min_nodes 1) or all or
    nothing; ``compiled``: ``parallel.compile=true``."""
    from airflow_dtrain.job.spec import JobSpec

    return JobSpec.from_arguments(
        flavor=flavor, seq_len=32, global_batch_size=8, micro_batch_size=4, log_every=1, steps=1000,
        num_nodes=2, procs_per_node=1, min_nodes=1 if elastic else None,
        checkpoint_uri=os.path.join(root, "ckpt"), config={"parallel": {"compile": compiled}},
    )  # fmt: skip


def _group_events(launcher, name: str):
    """A running local group's events as its ranks write them (polled), until it has ended."""
    cursor = None
    while True:
        ended = launcher.status(name).state.terminal
        new, cursor = launcher.events(name, cursor)
        yield from new
        if ended:
            return
        time.sleep(POLL_S)


def node_lost_round(
    at_step: int, flavor: str, elastic: bool, lost: int = 1, replaced: bool = True, last_call: bool = False,
    compiled: bool = False, join_after: int = 0,
) -> dict:  # fmt: skip
    """One of two nodes lost: a local group (LocalLauncher) of 2 nodes, SIGTERM to node ``lost``'s agent only
    once step ``at_step`` is logged. Elastic: its supervisor starts a replacement at once (capacity 2) and the
    other node's agent re-rendezvouses with it (node 0 too: the store is a process of its own); not
    ``replaced`` (capacity 1), it trains on alone, once its round closes: when it is in (ours) or, with
    ``last_call``, at the round's last call (torch's rule: the hook ``rdzv_close_round`` off). All or nothing:
    the group ends preempted and is launched again, as the operator does. The clock stops at the first step
    after the preempted one. ``compiled``: with the job's compile cache (the local backend's). ``join_after``:
    once the survivor has trained that many steps alone, capacity 2 again, and a node joins
    (``joined``)."""
    from airflow_dtrain.launchers.local import LocalLauncher
    from trainer.torch_private import OFF_ENV

    os.environ["PYTHONPATH"] = str(REPO)  # the supervisor and its agents run this checkout's code
    if last_call:  # else as the caller's environment says (recovery.py --compare-env)
        os.environ[OFF_ENV] = ",".join(filter(None, [os.environ.get(OFF_ENV, ""), "rdzv_close_round"]))
    root = tempfile.mkdtemp(prefix="dtrain-recovery-2nodes-")
    launcher, name = LocalLauncher(os.path.join(root, "groups"), peer_exit_grace_s=5), "lost-r0"
    spec = _two_node_spec(root, flavor, elastic, compiled)
    launcher.launch(name, spec)
    if not replaced:
        launcher.set_capacity(name, 1)  # no node to replace the lost one with
    stream = _group_events(launcher, name)
    for e in stream:
        if e["event"] == "train" and e["step"] >= at_step:
            t0, t0_wall = time.perf_counter(), time.time()
            nodes = json.loads(open(os.path.join(root, "groups", name, "nodes.json")).read())
            os.kill(nodes[str(lost)]["pid"], signal.SIGTERM)
            break
    preempted = next(e for e in stream if e["event"] == "preempted")
    if not elastic:  # the whole group ends; the operator launches the next one from the checkpoint
        while not launcher.status(name).state.terminal:
            time.sleep(POLL_S)
        name = "lost-r1"
        launcher.launch(name, spec)
        stream = _group_events(launcher, name)
    seen = after_resume(stream, "world")
    t1, first_step, resume, world = (seen.get(k) for k in ("t1", "first_step", "resume", "world"))
    where = startup_after(stream, t0_wall) if t1 is not None else {}
    join = {}
    if elastic and t1 is not None and (join_after or replaced and world["nodes"] == 1):
        join = joined(launcher, name, stream, first_step + join_after if join_after else None)
    status = launcher.stop(name, grace_period_s=30)
    if t1 is None:
        raise RuntimeError(f"the group ended before a step after the loss: {status}; see {root}")
    shutil.rmtree(root, ignore_errors=True)
    return {
        "recovery_s": t1 - t0,
        "save_s": preempted["seconds_to_save"],
        "preempted_step": preempted["step"],
        "resumed_from": resume["from_step"],
        "first_step": first_step,
        "steps_lost": preempted["step"] - resume["from_step"],
        "nodes_after": world["nodes"],
        **where,
        **join,
    }


def joined(launcher, name: str, stream, capacity_at: int | None) -> dict:
    """A node joins a group training on 1, once its replacement has started (``capacity_at`` None) or at
    capacity 2 once step ``capacity_at`` is logged: ``join_pause_s``, the survivor's steps' longest gap,
    from its last step alone to its first in the world of 2 (the resize it pays: its save, the rendezvous,
    the process group, the load, and the wait for the newcomer's first step), and ``join_s``, from the
    capacity (or the survivor's first step alone) to that step: the newcomer's whole start."""
    last = t_join = time.perf_counter()
    if capacity_at is not None:
        for e in stream:
            if e["event"] == "train":
                last = time.perf_counter()
                if e["step"] >= capacity_at:
                    break
        t_join = time.perf_counter()
        launcher.set_capacity(name, 2)
    nodes = 1
    for e in stream:
        if e["event"] == "world":
            nodes = e["nodes"]
        elif e["event"] == "train":
            now = time.perf_counter()
            if nodes == 2:
                return {"join_pause_s": now - last, "join_s": now - t_join, "join_step": e["step"]}
            last = now
    raise RuntimeError("the group ended before a step at 2 nodes after the join")


def join_line(rows: list[dict]) -> str:
    """The rows' join, where the survivor trained on alone before a node joined (``joined``); "" if none."""
    if not all("join_pause_s" in row for row in rows):
        return ""
    pause, join = (statistics.median(r[k] for r in rows) for k in ("join_pause_s", "join_s"))
    return (
        f"; then a node joined: the survivor paused {pause:.2f} s ({join:.2f} s from capacity to a step at 2)"
    )
