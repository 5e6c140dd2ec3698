"""Fault injection on the local backend: does every run finish (or stop at its cap) with the weights an
uninterrupted run has, the spend within the cap, one writer per checkpoint directory and every
corrupted checkpoint detected?

    python benchmarks/faults.py [--trials N] [--quick] [--seed S] [--only NAME ...]

Every run is ``python -m trainer.launch --standalone --nproc-per-node 2 -m trainer`` (torchrun with the
trainer's exit codes), debug flavour, 40 steps, a checkpoint every 5. An uninterrupted reference run is
made once; after each faulted trial the final checkpoint's tensors (model and optimizer state, unsharded)
are compared with the reference's, bit for bit. The step each fault lands on is drawn from a seeded RNG
(the seed is printed). This is a benchmark, not a test: it prints what it saw, including what did not hold.

Default trials per fault: 2 for the quick ones, 1 for the slow ones (kill -9 of a rank, of the agent, of
the supervisor, a full disk, a second writer), so the whole run stays under 15 minutes on 2 CPU cores;
``--trials N`` sets every fault's count. ``--quick`` runs the reference and one trial of two faults, a
signal (``sigterm-agent``) and a corruption (``flipped-byte-shard``): a check that the benchmark runs, in
about a minute (``--trials 1`` is one trial of every fault). Exit 1 when a property does not hold (a trial
that could not run did not finish).
"""

from __future__ import annotations

import argparse
import errno  # noqa: F401 - documented: the full-disk fault is ENOSPC
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

STEPS, EVERY = 40, 5
ARGS = [
    "--flavor",
    "debug",
    "--set",
    "data.seq_len=32",
    "--set",
    "global_batch_size=8",
    "--set",
    "micro_batch_size=4",
    "--steps",
    str(STEPS),
    "--set",
    f"checkpoint.every={EVERY}",
    "--set",
    "metrics.log_every=1",
]
NPROC = 2
QUICK = ("sigterm-agent", "flipped-byte-shard")  # --quick: a signal-based fault and a corruption
PRICE = 3600.0  # $/node-hour: a dollar a second, so the budget fault's cap is in seconds of this machine


# --------------------------------------------------------------------------- running the trainer


class Run:
    """One ``trainer.launch`` run: stdout (JSON events) and stderr to files, polled; its workers tagged."""

    def __init__(self, ckpt: Path, work: Path, env: dict | None = None, args: list[str] = ()):
        self.tag = uuid.uuid4().hex
        self.out, self.err = work / f"{self.tag}.out", work / f"{self.tag}.err"
        full_env = {**BASE_ENV, **(env or {}), "DTRAIN_BENCH_RUN": self.tag}
        cmd = [
            sys.executable,
            "-m",
            "trainer.launch",
            "--standalone",
            "--nproc-per-node",
            str(NPROC),
            "-m",
            "trainer",
            *ARGS,
            *args,
            "--checkpoint-uri",
            str(ckpt),
        ]
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                cmd, cwd=REPO, env=full_env, stdout=out, stderr=err, start_new_session=True
            )
        self._seen = 0
        self.events: list[dict] = []

    def poll_events(self) -> list[dict]:
        with open(self.out) as f:
            lines = f.read().splitlines()
        complete = lines if self.proc.poll() is not None else lines[:-1]  # the last may be half written
        new = []
        for line in complete[self._seen :]:
            if line.startswith("{"):
                try:
                    new.append(json.loads(line))
                except ValueError:
                    pass
        self._seen = len(complete)
        self.events += new
        return new

    def wait_for(self, pred, timeout: float = 300) -> dict | None:
        """The first event (from now on) matching ``pred``; None when the run ended or time ran out first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.poll_events():
                if pred(e):
                    return e
            if self.proc.poll() is not None:
                for e in self.poll_events():
                    if pred(e):
                        return e
                return None
            time.sleep(0.05)
        return None

    def wait(self, timeout: float = 400) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            rc = self.proc.wait()
        self.poll_events()
        return rc

    def stderr(self) -> str:
        return self.err.read_text()

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e.get("event") == kind]

    def workers(self) -> dict[int, psutil.Process]:
        """{rank: process} of this run's training processes."""
        out = {}
        for p in psutil.process_iter():
            try:
                env = p.environ()
                if (
                    env.get("DTRAIN_BENCH_RUN") == self.tag
                    and "RANK" in env
                    and p.status() != psutil.STATUS_ZOMBIE
                ):
                    out[int(env["RANK"])] = p
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
                continue
        return out

    def signal_all(self, sig: int) -> None:
        """``sig`` to the agent and every worker (the workers live in sessions of their own)."""
        os.killpg(self.proc.pid, sig)
        for p in self.workers().values():
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass

    def kill_all(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for p in self.workers().values():
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass


def train_event(at: int):
    return lambda e: e.get("event") == "train" and e.get("step", 0) >= at


# --------------------------------------------------------------------------- checkpoints


def load_tensors(step_dir: Path, scratch: Path) -> dict:
    """The model and optimizer tensors of a checkpoint, unsharded (``trainer.checkpoint.checkpoint_tensors``)."""
    from trainer.checkpoint import checkpoint_tensors

    return {k: v for k, v in checkpoint_tensors(str(step_dir)).items() if k.startswith(("model.", "optim."))}


def bitwise_equal(ckpt: Path, scratch: Path) -> bool | str:
    """The final checkpoint's tensors equal the reference's, bit for bit (False, or why not comparable)."""
    import torch

    final = ckpt / f"step-{STEPS:08d}"
    if not (final / "manifest.json").exists():
        return False
    try:
        ours = load_tensors(final, scratch)
    except Exception as err:  # noqa: BLE001 - reported, not raised
        print(f"    cannot load {final}: {type(err).__name__}: {err}", flush=True)
        return False
    if ours.keys() != REFERENCE.keys():
        return False
    return all(torch.equal(ours[k], REFERENCE[k]) for k in REFERENCE)


def progress(ckpt: Path) -> dict:
    try:
        return json.loads((ckpt / "progress.json").read_text())
    except (OSError, ValueError):
        return {}


def manifests(ckpt: Path) -> list[dict]:
    out = []
    for p in sorted(ckpt.glob("step-*/manifest.json")):
        try:
            out.append(json.loads(p.read_text()))
        except ValueError:
            pass
    return out


def fenced_commits(ckpt: Path, old_token: int, new_acquired_at: float) -> int:
    """Manifests the older lease's writer committed after the newer lease existed (must be 0)."""
    return sum(
        1
        for m in manifests(ckpt)
        if m.get("lease") == old_token and m.get("created_at", 0) >= new_acquired_at
    )


def lease_of(ckpt: Path, group: str):
    from trainer.checkpoint_dir import CheckpointDir

    root = CheckpointDir(str(ckpt))
    return next((root.lease(t) for t in root.leases() if root.lease(t).info.get("group") == group), None)


def row(**kw) -> dict:
    base = {
        "finished": False,
        "steps_lost": None,
        "bitwise": None,
        "spend_ratio": None,
        "writers": None,
        "fenced": None,
        "detected": None,
        "note": "",
    }
    return {**base, **kw}


# --------------------------------------------------------------------------- the faults


def f_sigterm(rng, ckpt, work):
    k = rng.randint(6, STEPS - 6)
    first = Run(ckpt, work)
    first.wait_for(train_event(k))
    first.proc.send_signal(signal.SIGTERM)
    rc1 = first.wait()
    second = Run(ckpt, work)
    rc2 = second.wait()
    pre = first.of("preempted")
    res = second.of("resume")
    lost = pre[0]["step"] - res[0]["from_step"] if pre and res else None
    return row(
        finished=rc1 == 75 and rc2 == 0,
        steps_lost=lost,
        bitwise=bitwise_equal(ckpt, work),
        note=f"SIGTERM after step {k}: exit {rc1}, then {rc2}",
    )


def f_sigusr1(rng, ckpt, work):
    k = rng.randint(6, STEPS - 6)
    run = Run(ckpt, work)
    run.wait_for(train_event(k))
    rank0 = run.workers().get(0)
    if rank0 is not None:
        rank0.send_signal(signal.SIGUSR1)
    rc = run.wait()
    now = [c["step"] for c in run.of("checkpoint") if c.get("reason") == "checkpoint-now"]
    return row(
        finished=rc == 0 and bool(now),
        steps_lost=0,
        bitwise=bitwise_equal(ckpt, work),
        note=f"SIGUSR1 to rank 0 after step {k}: saved step {now}, exit {rc}",
    )


def f_kill_rank(rng, ckpt, work):
    k, rank = rng.randint(6, STEPS - 6), rng.randint(0, NPROC - 1)
    first = Run(ckpt, work)
    first.wait_for(train_event(k))
    victim = first.workers().get(rank)
    if victim is not None:
        victim.kill()
    rc1 = first.wait()
    second = Run(ckpt, work)
    rc2 = second.wait()
    res = second.of("resume")
    return row(
        finished=rc1 == 76 and rc2 == 0,
        steps_lost=progress(ckpt).get("steps_lost"),
        bitwise=bitwise_equal(ckpt, work),
        note=f"kill -9 rank {rank} after step {k}: exit {rc1}; resumed from {res[0]['from_step'] if res else None}",
    )


def f_kill_agent(rng, ckpt, work):
    k = rng.randint(6, STEPS - 6)
    first = Run(ckpt, work)
    first.wait_for(train_event(k))
    workers = list(first.workers().values())
    first.proc.kill()
    rc1 = first.wait()
    _, alive = psutil.wait_procs(workers, timeout=90)  # parent-death SIGTERM: they save and exit
    for p in alive:
        p.kill()
    second = Run(ckpt, work)
    rc2 = second.wait()
    res = second.of("resume")
    return row(
        finished=rc2 == 0 and not alive,
        steps_lost=progress(ckpt).get("steps_lost"),
        bitwise=bitwise_equal(ckpt, work),
        note=f"kill -9 agent after step {k}: agent {rc1}, orphans exited by themselves: {not alive}; "
        f"resumed from {res[0]['from_step'] if res else None}",
    )


def f_supervisor(rng, ckpt, work):
    from airflow_dtrain.launchers.base import GroupState
    from airflow_dtrain.launchers.local import LocalLauncher
    from airflow_dtrain.spec import JobSpec

    k = rng.randint(6, STEPS - 10)
    spec = JobSpec.from_arguments(
        flavor="debug",
        seq_len=32,
        global_batch_size=8,
        micro_batch_size=4,
        log_every=1,
        steps=STEPS,
        checkpoint_every=EVERY,
        checkpoint_uri=str(ckpt),
        num_nodes=1,
        procs_per_node=NPROC,
        job="faults",
    )
    launcher = LocalLauncher(work / f"groups-{uuid.uuid4().hex[:6]}")
    base = f"faults-{uuid.uuid4().hex[:6]}"
    samples: list[set] = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            alive = set()
            for p in psutil.process_iter():
                try:
                    g = p.environ().get("DTRAIN_GROUP_NAME", "")
                    if g.startswith(base) and "RANK" in p.environ() and p.status() != psutil.STATUS_ZOMBIE:
                        alive.add(g)
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
                    continue
            samples.append(alive)
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    first, second = f"{base}-r0", f"{base}-r1"
    launcher.launch(first, spec)
    deadline = time.monotonic() + 240
    while progress(ckpt).get("step", 0) < k and time.monotonic() < deadline:
        time.sleep(0.2)
    supervisor = json.loads((launcher.state_dir / first / "supervisor.json").read_text())["pid"]
    os.kill(supervisor, signal.SIGKILL)
    launcher.launch(second, spec)  # as GroupSession's retry does: waits for the orphans, then starts r1
    deadline = time.monotonic() + 300
    while (
        launcher.status(second).state in (GroupState.PENDING, GroupState.RUNNING)
        and time.monotonic() < deadline
    ):
        time.sleep(0.5)
    state = launcher.status(second).state
    stop.set()
    sampler.join(timeout=5)
    old, new = lease_of(ckpt, first), lease_of(ckpt, second)
    fenced = fenced_commits(ckpt, old.token, new.info["acquired_at"]) if old and new else None
    return row(
        finished=state == GroupState.SUCCEEDED,
        steps_lost=progress(ckpt).get("steps_lost"),
        bitwise=bitwise_equal(ckpt, work),
        writers=max((len(s) for s in samples), default=0),
        fenced=fenced,
        note=f"kill -9 supervisor at step >= {k}; retry {state.value}; {len(samples)} samples",
    )


def _corrupt_copy(ckpt: Path, corrupt) -> None:
    shutil.copytree(REFERENCE_DIR, ckpt)
    corrupt(ckpt / f"step-{STEPS:08d}")


def _resume_corrupted(ckpt, work, note):
    run = Run(ckpt, work)
    rc = run.wait()
    res = run.of("resume")
    fell_back = bool(res) and res[0]["from_step"] == STEPS - EVERY and "fails verification" in run.stderr()
    return row(
        finished=rc == 0,
        steps_lost=(STEPS - res[0]["from_step"]) if res else None,
        detected=fell_back,
        bitwise=bitwise_equal(ckpt, work),
        note=f"{note}; resumed from {res[0]['from_step'] if res else None}",
    )


def f_flip_byte(rng, ckpt, work):
    where = {}

    def corrupt(step_dir):
        shard = rng.choice(sorted(step_dir.glob("__*_*.distcp")))
        data = bytearray(shard.read_bytes())
        i = rng.randrange(len(data))
        data[i] ^= 0xFF
        shard.write_bytes(bytes(data))
        where.update(file=shard.name, offset=i)

    _corrupt_copy(ckpt, corrupt)
    return _resume_corrupted(ckpt, work, f"flipped byte {where['offset']} of {where['file']}")


def f_truncate_manifest(rng, ckpt, work):
    where = {}

    def corrupt(step_dir):
        text = (step_dir / "manifest.json").read_text()
        cut = rng.randrange(1, len(text) - 1)
        (step_dir / "manifest.json").write_text(text[:cut])
        where.update(cut=cut, of=len(text))

    _corrupt_copy(ckpt, corrupt)
    return _resume_corrupted(ckpt, work, f"manifest cut to {where['cut']} of {where['of']} bytes")


def f_nan_manifest(rng, ckpt, work):
    field = rng.choice(["step", "step_time_s", "tokens_seen", "wall_time_s", "cost.total_dollars"])

    def corrupt(step_dir):
        m = json.loads((step_dir / "manifest.json").read_text())
        node, keys = m, field.split(".")
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = math.nan
        (step_dir / "manifest.json").write_text(json.dumps(m))

    _corrupt_copy(ckpt, corrupt)
    return _resume_corrupted(ckpt, work, f"{field} = NaN")


def f_full_disk(rng, ckpt, work):
    from trainer.checkpoint_dir import CheckpointDir
    from trainer.validate import validate_checkpoint

    k, rank = rng.choice(range(2 * EVERY, STEPS, EVERY)), rng.randint(0, NPROC - 1)
    first = Run(ckpt, work, env={"DTRAIN_TEST_ENOSPC_AT_STEP": f"{k}:{rank}"})
    rc1 = first.wait()
    err = first.stderr()
    clear = (
        f"checkpoint step {k} could not be written to {ckpt / f'step-{k:08d}'}" in err
        and "No space left on device" in err
    )
    older = [c.step for c in CheckpointDir(str(ckpt)).committed()]
    intact = True
    for step in older:
        try:
            validate_checkpoint(str(ckpt / f"step-{step:08d}"), sample_tensors=None)
        except Exception:  # noqa: BLE001 - reported
            intact = False
    partial_gone = not (ckpt / f"step-{k:08d}").exists()
    second = Run(ckpt, work)  # "space freed": the same command without the hook
    rc2 = second.wait()
    return row(
        finished=rc1 == 74 and rc2 == 0 and clear,
        steps_lost=progress(ckpt).get("steps_lost"),
        bitwise=bitwise_equal(ckpt, work),
        note=f"ENOSPC at step {k} on rank {rank}: exit {rc1}, clear line {clear}, older {older} valid {intact}, "
        f"partial removed {partial_gone}; resume exit {rc2}",
    )


def f_budget(rng, ckpt, work):
    from trainer.checkpoint_dir import CheckpointDir
    from trainer.cost import billed

    cap = round(
        rng.uniform(14.0, 20.0), 2
    )  # the job needs ~30 s = $30 here: admitted on a 100x too small estimate
    attempt = f"budget-{uuid.uuid4().hex[:6]}"
    root = CheckpointDir(str(ckpt))
    root.storage.makedirs()
    # Opened at the launch, as GroupSession does: the bill runs from the start of the process, not of training.
    root.record_spend(
        attempt,
        {
            "capacity": "any",
            "nodes": 1,
            "price_per_node_hour": PRICE,
            "gpus_per_node": 0,
            "launched_at": time.time(),
            "billed_s": 0.0,
            "node_hours": 0.0,
            "gpu_hours": 0.0,
            "dollars": 0.0,
            "budget_usd": cap,
        },
    )
    run = Run(
        ckpt,
        work,
        env={"DTRAIN_GROUP_NAME": attempt},
        args=[
            "--set",
            f"cost.budget_usd={cap}",
            "--set",
            f"cost.price_per_node_hour={PRICE}",
            "--set",
            "cost.stop_margin_s=3",
        ],
    )
    rc = run.wait()
    entry = root.spend_entry(attempt)
    root.record_spend(
        attempt, {**billed(entry, until=time.time()), "ended": True}
    )  # closed when its end is seen
    spent = root.spend().total_dollars
    latest = root.latest()
    return row(
        finished="cap" if rc == 77 else rc == 0,
        spend_ratio=spent / cap,
        note=f"cap ${cap}: exit {rc}, spent ${spent:.2f} (billed to the exit), last checkpoint "
        f"{latest.step if latest else None}",
    )


def f_second_writer(rng, ckpt, work):
    k = rng.randint(6, 20)
    first = Run(ckpt, work, env={"DTRAIN_GROUP_NAME": "writer-a"})
    first.wait_for(train_event(k))
    # The first writer stalls (a GC pause, a partitioned node) while a second one starts on the same directory
    # and takes its lease; then the first wakes up and goes on. Without the stall the second one's start-up
    # (imports, rendezvous) can outlast the first's remaining steps, and the two never overlap.
    first.signal_all(signal.SIGSTOP)
    second = Run(ckpt, work, env={"DTRAIN_GROUP_NAME": "writer-b"})
    second.wait_for(lambda e: e.get("event") in ("resume", "train"))
    first.signal_all(signal.SIGCONT)
    rc1, rc2 = first.wait(), second.wait()
    old, new = lease_of(ckpt, "writer-a"), lease_of(ckpt, "writer-b")
    fenced = fenced_commits(ckpt, old.token, new.info["acquired_at"]) if old and new else None
    after = {
        m.get("lease") for m in manifests(ckpt) if new and m.get("created_at", 0) >= new.info["acquired_at"]
    }
    res = second.of("resume")
    return row(
        finished=rc1 == 78 and rc2 == 0,
        bitwise=bitwise_equal(ckpt, work),
        fenced=fenced,
        writers=len(after),
        note=f"first writer stalled after step {k}, a second one started: first exit {rc1}, second exit {rc2} (resumed from "
        f"{res[0]['from_step'] if res else None})",
    )


FAULTS = [  # (name, function, default trials, signal-based: bitwise equality must hold)
    ("sigterm-agent", f_sigterm, 2, True),
    ("sigusr1", f_sigusr1, 2, True),
    ("kill-9-rank", f_kill_rank, 1, True),
    ("kill-9-agent", f_kill_agent, 1, True),
    ("kill-9-supervisor+retry", f_supervisor, 1, True),
    ("flipped-byte-shard", f_flip_byte, 2, False),
    ("truncated-manifest", f_truncate_manifest, 2, False),
    ("nan-in-manifest", f_nan_manifest, 2, False),
    ("full-disk", f_full_disk, 1, False),
    ("budget-cap", f_budget, 2, False),
    ("second-writer", f_second_writer, 1, False),
]


def fmt(values, kind) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "n/a"
    if kind == "bool":
        return f"{sum(v is True for v in vals)}/{len(vals)}"
    if kind == "max":
        return f"{max(vals):.3f}" if isinstance(max(vals), float) else str(max(vals))
    if kind == "sum":
        return str(sum(vals))
    return "/".join(map(str, vals))


def main() -> int:
    global BASE_ENV, REFERENCE, REFERENCE_DIR
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, help="trials per fault (default: 2, 1 for the slow ones)")
    p.add_argument("--quick", action="store_true", help=f"one trial of {' and '.join(QUICK)} only")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--only", nargs="*", help="fault names to run")
    args = p.parse_args()
    only = args.only or (QUICK if args.quick else None)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    rng = random.Random(seed)
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="dtrain-faults-"))
    BASE_ENV = {**os.environ, "PYTHONPATH": str(REPO), "DTRAIN_DATA_DIR": str(work / "data")}
    BASE_ENV.pop("RANK", None)
    os.environ.update(PYTHONPATH=str(REPO), DTRAIN_DATA_DIR=str(work / "data"))  # the local launcher's groups
    import torch

    print(f"seed {seed}; torch {torch.__version__}; {os.cpu_count()} CPUs; work dir {work}", flush=True)
    REFERENCE_DIR = work / "reference"
    ref = Run(REFERENCE_DIR, work)
    rc = ref.wait()
    REFERENCE = load_tensors(REFERENCE_DIR / f"step-{STEPS:08d}", work)
    print(f"reference: exit {rc}, {len(REFERENCE)} tensors, {time.perf_counter() - started:.0f}s", flush=True)

    results: dict[str, list[dict]] = {}
    for name, fn, default, _ in FAULTS:
        if only and name not in only:
            continue
        trials = 1 if args.quick else (args.trials or default)
        for t in range(trials):
            ckpt = work / f"{name}-{t}"
            t0 = time.perf_counter()
            try:
                r = fn(rng, ckpt, work)
            except Exception as err:  # noqa: BLE001 - a benchmark reports, it does not abort
                r = row(note=f"benchmark error: {type(err).__name__}: {err}")
            r["seconds"] = time.perf_counter() - t0
            results.setdefault(name, []).append(r)
            print(
                f"  {name} #{t}: {json.dumps({k: v for k, v in r.items() if k != 'note'}, default=str)} -- {r['note']}",
                flush=True,
            )
            shutil.rmtree(ckpt, ignore_errors=True)
            for leftover in psutil.process_iter():  # nothing of a trial may outlive it
                try:
                    if "DTRAIN_BENCH_RUN" in leftover.environ() or leftover.environ().get(
                        "DTRAIN_GROUP_NAME", ""
                    ).startswith("faults-"):
                        leftover.kill()
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
                    continue

    header = [
        "fault",
        "trials",
        "finished/cap",
        "steps lost",
        "bitwise = ref",
        "max spend/cap",
        "concurrent writers",
        "fenced commits",
        "corruption detected",
        "s/trial",
    ]
    table = [header]
    for name, rows in results.items():
        fin = [("cap" if r["finished"] == "cap" else bool(r["finished"])) for r in rows]
        table.append(
            [
                name,
                str(len(rows)),
                f"{sum(f is True or f == 'cap' for f in fin)}/{len(fin)}"
                + (" (cap)" if "cap" in fin else ""),
                fmt([r["steps_lost"] for r in rows], "list"),
                fmt([r["bitwise"] for r in rows], "bool"),
                fmt([r["spend_ratio"] for r in rows], "max"),
                fmt([r["writers"] for r in rows], "max"),
                fmt([r["fenced"] for r in rows], "sum"),
                fmt([r["detected"] for r in rows], "bool"),
                f"{sum(r['seconds'] for r in rows) / len(rows):.0f}",
            ]
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    print()
    for i, r in enumerate(table):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")

    every = [r for rows in results.values() for r in rows]
    signal_based = {n for n, _, _, s in FAULTS if s}

    held = []

    def verdict(ok: bool, what: str) -> None:
        held.append(ok)
        print(f"{'HOLDS' if ok else 'DOES NOT HOLD'}: {what}")

    print()
    verdict(all(r["finished"] for r in every), "every run finished or stopped at its cap")
    spends = [r["spend_ratio"] for r in every if r["spend_ratio"] is not None]
    verdict(
        all(s <= 1.0 for s in spends), f"spend never above the cap (max {max(spends, default=0):.3f} of it)"
    )
    fenced = [r["fenced"] for r in every if r["fenced"] is not None]
    writers = [r["writers"] for r in results.get("kill-9-supervisor+retry", []) if r["writers"] is not None]
    verdict(
        sum(fenced) == 0 and all(w <= 1 for w in writers),
        f"0 fenced commits ({sum(fenced)}) and never two groups alive at once (max {max(writers, default=0)})",
    )
    detected = [r["detected"] for r in every if r["detected"] is not None]
    verdict(
        all(detected),
        f"every corrupted checkpoint detected and the previous one used ({sum(detected)}/{len(detected)})",
    )
    bitwise = [r["bitwise"] for n, rows in results.items() if n in signal_based for r in rows]
    verdict(
        all(b is True for b in bitwise),
        f"bitwise-equal final weights for every signal-based fault "
        f"({sum(b is True for b in bitwise)}/{len(bitwise)})",
    )
    print(f"\nwall time {time.perf_counter() - started:.0f}s; seed {seed}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if all(held) else 1


BASE_ENV: dict = {}
REFERENCE: dict = {}
REFERENCE_DIR: Path = Path()

if __name__ == "__main__":
    sys.exit(main())
