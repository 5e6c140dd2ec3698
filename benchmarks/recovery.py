"""Recovery on the local backend: time from SIGTERM to the first completed step after resume,
and the steps lost.

    python benchmarks/recovery.py [--rounds 3] [--nproc 2] [--at-step 5] [--flavor debug] [--set K=V ...]
    python benchmarks/recovery.py --quick      # one round: a check that it runs
    python benchmarks/recovery.py --compile --no-elastic   # compiled: the restart with a warm, a cold cache

Each round runs ``python -m trainer.launch --standalone --nproc-per-node N -m trainer`` (the launcher a
local-backend node runs), debug flavour, sends SIGTERM to the agent once step --at-step is logged, waits for
exit 75, starts the same command again at once and stops the clock at the first "train" event after the
resume. Steps lost = the preempted step minus the resumed step (progress.json's agrees). Events are read
from each run's own directory (``$DTRAIN_EVENTS_DIR``, ``trainer.events``). ``--flavor`` and ``--set``
change the job (on a GPU: ``benchmarks/gpu_check.sh preempt``).

Beside it, in the same run, "one of two nodes lost" (``node_lost_round``), three times: a group of 2 nodes x
1 process (the same job), SIGTERM to node 1's agent only. All or nothing: the group ends and is launched
again (the operator's relaunch). Elastic (min_nodes 1): the supervisor starts node 1's replacement and node
0's agent re-rendezvouses without a relaunch; and the same with node 0 lost (the group's rendezvous store is
a process of its own). And with no node to replace it (capacity 1): node 0 trains on alone once its round
closes, when it is in (``trainer/elastic/rdzv_round.py``) beside torch's last call
(``replace_timeout_s``). Clock: SIGTERM to the first step after it. ``--no-elastic`` leaves them out.

With ``--compile`` the 1-node rows run with ``parallel.compile=true`` instead, each round twice side by side:
the restart given the first run's compile cache (``TORCHINDUCTOR_CACHE_DIR``: warm, as the local backend
gives every attempt of a job its own cache) and an empty one (cold: a new machine or pod); the 2-node rows
compile too, with the job's cache. ``--two-node relaunch,alone`` runs only those 2-node rows
(``_two_nodes.py``). ``--in-place``: the 1-node rows restart their workers under the live agent instead
(``in_place_round``: an elastic node's resize, on one node, as on one GPU). ``--compare-env
DTRAIN_KEEP_WORKERS=0`` sets an elastic group's survivors restarting their training processes beside
keeping them (``trainer/elastic/worker_host.py``).

With ``--compare-start`` every row runs twice in each round, side by side: the workers forked from their
node's fork server, which has imported torch and the trainer once (``trainer.launch``, the default), and
each started as its own ``python -m trainer`` (``DTRAIN_FORK_WORKERS=0``, torchrun's own start). With
``--compare-env KEY=VALUE`` (repeatable) every row runs also with that setting, e.g. ``DTRAIN_RDZV_POLL_S=1``
(a resize round polled once a second, as torch does: ``trainer/elastic/rdzv_round.py``) or
``DTRAIN_TORCH_PRIVATE_OFF=all`` (every private torch hook's fallback, as on a torch that changed them:
``trainer/torch_private/``). Each row also says where the time went: SIGTERM to the restarted workers'
start, then their startup phases (``trainer/elastic/startup.py``).

Target: <= 10 s and 0 steps lost for the debug flavour.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from _common import REPO, events_env, trainer_command
from _two_nodes import ROWS, join_line, node_lost_round
from _where import after_resume, startup_after
from _where import where_it_went
from trainer.checkpoint.directory import CheckpointDir
from trainer.events import EventCursor
from trainer.elastic.workers import FORK_ENV, worker_pids

STDERR = subprocess.DEVNULL  # where the trainers' stderr goes (--stderr FILE)
POLL_S = 0.01  # how often a run's events directory is looked at: the clock's resolution
# The settings every row runs with, side by side: {label: environment}; --compare-start adds "workers
# started", --compare-env KEY=VALUE adds "KEY=VALUE".
VARIANTS: dict[str, dict[str, str]] = {"workers forked": {FORK_ENV: "1"}}
ARGS = [
    "--set",
    "data.seq_len=32",
    "--set",
    "global_batch_size=8",
    "--set",
    "micro_batch_size=4",
    "--set",
    "metrics.log_every=1",
    "--steps",
    "1000",
]


def start(nproc: int, ckpt: str, env: dict, extra: list[str], events_dir: str, cmd: list | None = None):
    """A trainer run on ``ckpt`` whose events go to ``events_dir`` (its own); ``cmd``: the launcher's
    command, before ``-m trainer``, in place of a standalone one's."""
    args = (*ARGS, *extra, "--checkpoint-uri", ckpt)
    cmd = [*cmd, "-m", "trainer", *args] if cmd else trainer_command(nproc, *args)
    env = events_env(env, events_dir)
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=STDERR)


def events(proc: subprocess.Popen, events_dir: str):
    """The run's events as it writes them (its events directory, polled), until it has exited and every
    event is read. One generator per run: breaking out of a loop over it and looping again goes on where
    it stopped."""
    cursor = EventCursor(events_dir)
    while True:
        exited = proc.poll() is not None
        yield from cursor.read()
        if exited:
            return
        time.sleep(POLL_S)


def one_round(nproc: int, at_step: int, env: dict, extra: list[str], restart_env: dict | None = None) -> dict:
    """SIGTERM to a run once step ``at_step`` is logged, the same command again (with ``restart_env``, else
    ``env``) once it exits 75; the figures of the recovery."""
    ckpt = tempfile.mkdtemp(prefix="dtrain-recovery-")
    runs_dir = tempfile.mkdtemp(prefix="dtrain-recovery-events-")
    first_events, second_events = os.path.join(runs_dir, "first"), os.path.join(runs_dir, "second")
    first = start(nproc, ckpt, env, extra, first_events)
    stream = events(first, first_events)
    saves = []  # (step, async, reason) of the first process's saves, as they committed
    for e in stream:
        if e["event"] == "checkpoint":
            saves.append((e["step"], e.get("async"), e["reason"]))
        if e["event"] == "train" and e["step"] >= at_step:
            t0, t0_wall = time.perf_counter(), time.time()
            first.send_signal(signal.SIGTERM)
            break
    for e in stream:
        if e["event"] == "checkpoint":
            saves.append((e["step"], e.get("async"), e["reason"]))
        if e["event"] == "preempted":
            preempted = e
            break
    rc = first.wait()
    t_exit = time.perf_counter()
    assert rc == 75, rc
    second = start(nproc, ckpt, restart_env or env, extra, second_events)
    resume, stream = None, events(second, second_events)
    for e in stream:
        if e["event"] == "resume":
            resume = e
        if e["event"] == "train":
            t1 = time.perf_counter()
            first_step = e["step"]
            break
    where = startup_after(stream, t0_wall)
    second.send_signal(signal.SIGTERM)
    second.wait()
    progress = CheckpointDir(ckpt).progress()
    shutil.rmtree(ckpt, ignore_errors=True)
    shutil.rmtree(runs_dir, ignore_errors=True)
    return {
        "recovery_s": t1 - t0,
        "sigterm_to_exit_s": t_exit - t0,
        "save_s": preempted["seconds_to_save"],
        "restart_to_first_step_s": t1 - t_exit,
        "preempted_step": preempted["step"],
        "resumed_from": resume["from_step"],
        "first_step": first_step,
        "steps_lost": preempted["step"] - resume["from_step"],
        "progress_steps_lost": progress["steps_lost"],
        "saves": saves,
        **where,
    }


def in_place_round(nproc: int, at_step: int, env: dict, extra: list[str]) -> dict:
    """An elastic node's resize, on one node: SIGTERM to one worker (not the agent) once step ``at_step`` is
    logged; every rank saves and exits 75, the live agent starts its workers again (in the kept training
    processes, ``trainer/elastic/worker_host.py``, or new ones with ``DTRAIN_KEEP_WORKERS=0``); the clock
    stops at the first step after the resume."""
    ckpt, events_dir = tempfile.mkdtemp(prefix="dtrain-recovery-"), tempfile.mkdtemp(prefix="dtrain-events-")
    store, endpoint = _rendezvous_store(env)  # as an elastic group's: a process of its own, not the agent's
    agent = [sys.executable, "-m", "trainer.launch", "--nnodes", "1", "--nproc-per-node", str(nproc),
             "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "in-place", "--rdzv-conf",
             "is_host=0", "--max-restarts", "3"]  # fmt: skip
    run = start(nproc, ckpt, env, extra, events_dir, agent)
    stream = events(run, events_dir)
    for e in stream:
        if e["event"] == "train" and e["step"] >= at_step:
            t0, t0_wall = time.perf_counter(), time.time()
            os.kill(min(worker_pids(run.pid)), signal.SIGTERM)
            break
    seen = after_resume(stream, "preempted")
    t1, first_step, preempted, resume = (seen[k] for k in ("t1", "first_step", "preempted", "resume"))
    where = startup_after(stream, t0_wall)
    run.send_signal(signal.SIGTERM)
    run.wait()
    store.terminate()
    store.wait()
    shutil.rmtree(ckpt, ignore_errors=True)
    shutil.rmtree(events_dir, ignore_errors=True)
    return {
        "recovery_s": t1 - t0,
        "save_s": preempted["seconds_to_save"],
        "first_step": first_step,
        "steps_lost": preempted["step"] - resume["from_step"],
        **where,
    }


def _rendezvous_store(env: dict) -> tuple[subprocess.Popen, str]:
    """``python -m trainer.elastic.rdzv_store`` on a free port of 127.0.0.1, serving once it says so."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = subprocess.Popen([sys.executable, "-m", "trainer.elastic.rdzv_store", "127.0.0.1", str(port)],
                             cwd=REPO,
                             env=env, stdout=subprocess.PIPE, stderr=STDERR, text=True)  # fmt: skip
    store.stdout.readline()  # "rendezvous store serving on ..."
    return store, f"127.0.0.1:{port}"


def in_place_rows(rounds: int, nproc: int, at_step: int, env: dict, extra: list[str], compiled: bool) -> None:
    """``in_place_round``, ``rounds`` times for each variant, side by side; ``compiled``: each run compiles
    into a cache of its own, which a new process finds warm at the restart."""
    extra = [*extra, "--set", "parallel.compile=true"] if compiled else extra
    rows: dict[str, list[dict]] = {start: [] for start in VARIANTS}
    for r in range(rounds):
        for variant in _alternated(r):
            caches = tempfile.mkdtemp(prefix="dtrain-recovery-compile-")
            run_env = {**_variant_env(variant, env), "TORCHINDUCTOR_CACHE_DIR": caches}
            rows[variant].append(in_place_round(nproc, at_step, run_env, extra))
            shutil.rmtree(caches, ignore_errors=True)
            figures = {k: round(v, 3) if isinstance(v, float) else v for k, v in rows[variant][-1].items()}
            print(
                f"1 node, workers restarted in place, {variant}, round {r}: {json.dumps(figures)}", flush=True
            )
    for variant, rs in rows.items():
        print(
            f"1 node, workers restarted in place{', compiled' if compiled else ''}, {variant}: SIGTERM to a "
            f"worker -> first step after it: median "
            f"{statistics.median(row['recovery_s'] for row in rs):.2f} s; "
            f"steps lost: max {max(row['steps_lost'] for row in rs)}\n  {where_it_went(rs)}",
            flush=True,
        )


def plain_rows(rounds: int, nproc: int, at_step: int, env: dict, extra: list[str]) -> None:
    """The 1-node recovery, ``rounds`` times: each round's figures, then their medians."""
    rows: dict[str, list[dict]] = {start: [] for start in VARIANTS}
    for r in range(rounds):
        for start in _alternated(r):
            rows[start].append(one_round(nproc, at_step, _variant_env(start, env), extra))
            figures = {k: round(v, 3) if isinstance(v, float) else v for k, v in rows[start][-1].items()}
            print(f"round {r}, {start}: {json.dumps(figures)}", flush=True)
    for start, rs in rows.items():
        med = {
            k: statistics.median(row[k] for row in rs)
            for k in ("recovery_s", "sigterm_to_exit_s", "save_s", "restart_to_first_step_s")
        }
        lost = max(row["steps_lost"] for row in rs)
        print(
            f"\nwhole-group relaunch, {start}: SIGTERM -> first step after resume: median "
            f"{med['recovery_s']:.2f} s (save {med['save_s']:.2f} s, SIGTERM -> exit 75 "
            f"{med['sigterm_to_exit_s']:.2f} s, restart -> first step "
            f"{med['restart_to_first_step_s']:.2f} s); steps lost: max {lost}  [target <= 10 s, 0 steps]\n"
            f"  {where_it_went(rs)}"
        )


def _variant_env(label: str, env: dict) -> dict:
    """``env`` with the settings of variant ``label`` and none of the other variants'."""
    others = {k for v in VARIANTS.values() for k in v}
    return {**{k: v for k, v in env.items() if k not in others}, **VARIANTS[label]}


def _alternated(r: int) -> list[str]:
    """The variants of round ``r``, the first of them alternating from round to round."""
    starts = list(VARIANTS)
    return starts if r % 2 == 0 else starts[::-1]


def compiled_rows(rounds: int, nproc: int, at_step: int, env: dict, extra: list[str]) -> None:
    """The same recovery with ``parallel.compile=true``, the restart finding the first run's compile cache
    (warm: as the local backend gives every attempt of a job its own cache) or an empty one (cold: a new
    machine, or a replacement pod), side by side in each round."""
    extra = [*extra, "--set", "parallel.compile=true"]
    rows: dict[str, list[dict]] = {"warm": [], "cold": []}
    for r in range(rounds):
        for kind in ("warm", "cold") if r % 2 == 0 else ("cold", "warm"):
            caches = tempfile.mkdtemp(prefix="dtrain-recovery-compile-")
            first = {**env, "TORCHINDUCTOR_CACHE_DIR": os.path.join(caches, "job")}
            restart = (
                first if kind == "warm" else {**env, "TORCHINDUCTOR_CACHE_DIR": os.path.join(caches, "new")}
            )
            rows[kind].append(one_round(nproc, at_step, first, extra, restart))
            shutil.rmtree(caches, ignore_errors=True)
            figures = {k: round(v, 3) for k, v in rows[kind][-1].items() if isinstance(v, float)}
            print(f"compiled, {kind} cache, round {r}: {json.dumps(figures)}", flush=True)
    med = {kind: statistics.median(row["restart_to_first_step_s"] for row in rs) for kind, rs in rows.items()}
    lost = max(row["steps_lost"] for rs in rows.values() for row in rs)
    print(
        f"compiled (parallel.compile=true): restart -> first step: median warm {med['warm']:.2f} s, cold "
        f"{med['cold']:.2f} s (warm/cold {med['warm'] / med['cold']:.0%}); steps lost: max {lost}\n"
        f"  warm: {where_it_went(rows['warm'])}\n  cold: {where_it_went(rows['cold'])}",
        flush=True,
    )


def _node_lost_rows(rounds: int, at_step: int, flavor: str, which: list[str], compiled: bool) -> None:
    """The 2-node rows ``which`` (``_two_nodes.ROWS``), side by side in this run."""
    for key in which:
        elastic, lost, more, label = ROWS[key]
        label += ", compiled" if compiled else ""
        rows: dict[str, list[dict]] = {start: [] for start in VARIANTS}
        for r in range(rounds):
            for start in _alternated(r):
                environ = _variant_env(start, dict(os.environ))  # the launcher's supervisor and agents
                os.environ.clear()  # inherit it
                os.environ.update(environ)
                rows[start].append(node_lost_round(at_step, flavor, elastic, lost, compiled=compiled, **more))
                figures = {k: round(v, 3) if isinstance(v, float) else v for k, v in rows[start][-1].items()}
                print(f"{label}, {start}, round {r}: {json.dumps(figures)}", flush=True)
        for start, rs in rows.items():
            print(
                f"{label}, {start}: SIGTERM to node {lost} -> first step after it: median "
                f"{statistics.median(row['recovery_s'] for row in rs):.2f} s (save "
                f"{statistics.median(row['save_s'] for row in rs):.2f} s; resumed at "
                f"{sorted({row['nodes_after'] for row in rs})} node(s)); steps lost: max "
                f"{max(row['steps_lost'] for row in rs)}{join_line(rs)}\n  {where_it_went(rs)}",
                flush=True,
            )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--at-step", type=int, default=5)
    p.add_argument("--flavor", default="debug")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a trainer setting (repeatable)"
    )
    p.add_argument(
        "--stderr", metavar="FILE", help="append the trainers' stderr to FILE (default: discarded)"
    )
    p.add_argument("--quick", action="store_true", help="--rounds 1")
    p.add_argument(
        "--no-elastic", action="store_true", help="without the 2-node rows (elastic and all or nothing)"
    )
    p.add_argument(
        "--compare-start",
        action="store_true",
        help="every row also with each worker started as its own python -m trainer (DTRAIN_FORK_WORKERS=0), "
        "side by side with the forked workers",
    )
    p.add_argument(
        "--compare-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="every row also with KEY=VALUE in the trainers' environment, side by side (repeatable), e.g. "
        "DTRAIN_RDZV_POLL_S=1 (torch's polling of a resize round)",
    )
    p.add_argument(
        "--in-place",
        action="store_true",
        help="the 1-node rows restart their workers under the live agent, as an elastic node's resize does "
        "(SIGTERM to a worker), in place of a relaunch; with --compare-env DTRAIN_KEEP_WORKERS=0 beside new "
        "processes",
    )
    p.add_argument(
        "--two-node",
        metavar="ROW,...",
        help=f"only these of the 2-node rows: {', '.join(ROWS)} (default: all)",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="the 1-node recovery with parallel.compile=true, restarted with a warm and with a cold compile "
        "cache, side by side (in place of the plain one); the 2-node rows compiled too",
    )
    return p


def main() -> None:
    p = _parser()
    args = p.parse_args()
    if args.quick:
        args.rounds = 1
    if args.compare_start:
        VARIANTS["workers started"] = {FORK_ENV: "0"}
    for kv in args.compare_env:
        key, _, value = kv.partition("=")
        VARIANTS[kv] = {key: value}
    global STDERR
    STDERR = open(args.stderr, "a") if args.stderr else subprocess.DEVNULL  # noqa: SIM115 - open for the run
    extra = ["--flavor", args.flavor, *(a for kv in args.set for a in ("--set", kv))]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if args.in_place:
        in_place_rows(args.rounds, args.nproc, args.at_step, env, extra, args.compile)
    elif args.compile:
        compiled_rows(args.rounds, args.nproc, args.at_step, env, extra)
    else:
        plain_rows(args.rounds, args.nproc, args.at_step, env, extra)
    if args.no_elastic:
        return
    which = args.two_node.split(",") if args.two_node else list(ROWS)
    if unknown := set(which) - set(ROWS):
        p.error(f"--two-node: unknown row(s) {sorted(unknown)}; one of {list(ROWS)}")
    _node_lost_rows(args.rounds, args.at_step, args.flavor, which, args.compile)


if __name__ == "__main__":
    main()
