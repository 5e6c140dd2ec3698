"""A probe of the in-process resize that issue #39's last line waits on: not part of the product, nor of CI.

Two replica processes train one model with torchft (https://github.com/meta-pytorch/torchft): a Manager
each, a quorum from torchft's lighthouse, the gradients all-reduced over a process group torchft rebuilds
when the quorum changes. Replica 1 is killed with SIGKILL (a spot node gone); replica 0 goes on alone in
the same process, with the model and optimizer it has in memory. Replica 1 is started again (its
replacement); it takes the state from replica 0 (torchft's live recovery) and joins while replica 0 trains.

It prints, per round: the survivor's time from the kill to its first step committed alone (the collective's
timeout, ``--timeout-s``, bounds it), the replacement's time from its start to its first committed step, and
the survivor's longest pause between steps while the replacement joins, beside the step interval.
``benchmarks/recovery.py`` measures the launchers' resize (every survivor's workers restart) for comparison;
``benchmarks/spot_cost.py --rerendezvous-s S --grow-resize-s J`` prices a resize of each kind.

    .venv/bin/pip install torchft==0.2.0     # not a dependency of the project
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/studies/torchft_resize.py [--rounds 3] [--timeout-s 5]
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import statistics
import subprocess
import sys
import time
from datetime import timedelta


def replica(rid: int, lighthouse: str, steps: int, dim: int, timeout_s: float, sleep_s: float) -> None:
    """One replica: a two-layer model of ``dim`` (2 x dim^2 weights), AdamW, one JSON line per step."""
    import torch
    import torch.distributed as dist
    from torch import nn, optim
    from torchft.ddp import DistributedDataParallel
    from torchft.manager import Manager
    from torchft.optim import OptimizerWrapper
    from torchft.process_group import ProcessGroupGloo

    t0 = time.time()
    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim))
    opt = optim.AdamW(model.parameters(), lr=1e-3)

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])

    def state_dict():
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    timeout = timedelta(seconds=timeout_s)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout), min_replica_size=1, load_state_dict=load_state_dict,
        state_dict=state_dict, replica_id=f"r{rid}", store_addr="localhost", store_port=store.port, rank=0,
        world_size=1, lighthouse_addr=lighthouse, timeout=timeout, quorum_timeout=2 * timeout,
    )  # fmt: skip
    ddp, wrapped = DistributedDataParallel(manager, model), OptimizerWrapper(manager, opt)
    print(json.dumps({"r": rid, "ready_s": time.time() - t0}), flush=True)
    while manager.current_step() < steps:
        wrapped.zero_grad()
        ddp(torch.randn(8, dim)).pow(2).mean().backward()
        before = manager.current_step()
        wrapped.step()
        step = manager.current_step()
        n = manager.num_participants()
        line = {"r": rid, "t": time.time(), "step": step, "n": n, "ok": step > before}
        print(json.dumps(line), flush=True)
        time.sleep(sleep_s)
    manager.shutdown(wait=False)


def one_round(args) -> dict:
    """Two replicas; kill replica 1 at step ``--kill-at``; start it again ``--down-s`` later."""
    from torchft._torchft import LighthouseServer

    # a replica that stops heartbeating leaves the quorum within half the timeout, before its peer's quorum
    # call times out (with the lighthouse's own default, 5 s, a timeout under 5 s never had a quorum alone)
    lighthouse = LighthouseServer(
        bind="[::]:0", min_replicas=1, join_timeout_ms=1000, heartbeat_timeout_ms=int(500 * args.timeout_s)
    )
    sel, events, procs = selectors.DefaultSelector(), [], {}

    def start(rid: int) -> None:
        cmd = [sys.executable, __file__, "--replica", str(rid), lighthouse.address(), str(args.dim),
               str(args.timeout_s), str(args.step_sleep_s)]  # fmt: skip
        procs[rid] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        sel.register(procs[rid].stdout, selectors.EVENT_READ)

    start(0)
    start(1)
    killed = restarted = None
    deadline = time.time() + 300
    while time.time() < deadline:
        for key, _ in sel.select(timeout=1):
            line = key.fileobj.readline()
            if not line:
                sel.unregister(key.fileobj)
                continue
            event = json.loads(line)
            event["at"] = time.time()
            events.append(event)
            ready = event.get("r") == 0 and event.get("step", 0) >= args.kill_at and event.get("n") == 2
            if killed is None and ready:
                procs[1].send_signal(signal.SIGKILL)
                procs[1].wait()
                killed = time.time()
        if killed and restarted is None and time.time() - killed >= args.down_s:
            start(1)
            restarted = time.time()
        if restarted and any(e.get("r") == 1 and e.get("ok") and e["at"] > restarted for e in events[-20:]):
            if sum(1 for e in events if e.get("r") == 0 and e.get("n") == 2 and e["at"] > restarted) >= 20:
                break
    for proc in procs.values():
        proc.kill()
    lighthouse.shutdown()
    return _measures(events, killed, restarted)


def _measures(events: list[dict], killed: float, restarted: float) -> dict:
    steps0 = [e for e in events if e.get("r") == 0 and "t" in e]
    together = [e["t"] for e in steps0 if e["t"] < killed]
    alone = next(e["t"] for e in steps0 if e["t"] > killed and e["ok"] and e["n"] == 1)
    joined = next(e["t"] for e in events if e.get("r") == 1 and "t" in e and e["t"] > restarted and e["ok"])
    around = [e["t"] for e in steps0 if restarted <= e["t"] <= joined + 2]
    return {
        "step interval s": statistics.median(b - a for a, b in zip(together[-20:], together[-19:])),
        "kill -> survivor's first step alone s": alone - killed,
        "survivor's steps not committed (retried) after the kill": float(
            sum(1 for e in steps0 if killed < e["t"] <= alone and not e["ok"])
        ),
        "replacement start -> its first committed step s": joined - restarted,
        "survivor's longest pause while it joins s": max(b - a for a, b in zip(around, around[1:])),
    }


def main() -> None:
    os.environ.setdefault("RUST_LOG", "warn")  # the lighthouse's log of every quorum, before it is imported
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dim", type=int, default=1024, help="the model's width: 2 x dim^2 weights")
    ap.add_argument("--timeout-s", type=float, default=5.0, help="torchft's collective and RPC timeout")
    ap.add_argument("--kill-at", type=int, default=40, help="replica 0's step when 1 is killed")
    ap.add_argument("--down-s", type=float, default=5.0, help="how long the lost replica stays away")
    ap.add_argument("--step-sleep-s", type=float, default=0.1, help="a step's compute, as a sleep")
    args = ap.parse_args()
    rows = [one_round(args) for _ in range(args.rounds)]
    print(f"torchft in-process resize, 2 replicas x 1 process, gloo on CPU, dim {args.dim}, "
          f"timeout {args.timeout_s:g} s, {os.cpu_count()} CPUs")  # fmt: skip
    for name in rows[0]:
        values = [row[name] for row in rows]
        shown = [f"{v:.2f}" for v in values]
        print(f"  {name}: {', '.join(shown)} (median {statistics.median(values):.2f})")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--replica"]:
        rid, lh, dim, timeout_s, sleep_s = sys.argv[2:7]
        replica(int(rid), lh, 10**9, int(dim), float(timeout_s), float(sleep_s))
    else:
        main()
