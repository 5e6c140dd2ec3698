"""Does a node's warm-up before it joins (``trainer/elastic/warm_join.py``) serve the world it then trains
in, on this machine's device? Not part of CI: a check for a lent GPU (``bash benchmarks/gpu_check.sh
warm-join``), where the compiled blocks are Triton kernels in bf16 under FSDP2's mixed precision, not the
CPU's C++ ones.

One process, as one training process of a joining node: it builds the model and runs a step in a fake world
of ``--world`` ranks (the group's full size, 16 by default) as its local rank 0, then trains ``--steps``
steps as rank 0 of a real world of 1 (the trainer's own ``main``, with its events). Beside it, the same
training with no warm-up (a node that joins at once). It prints, per variant: the warm-up's seconds, the
trainer's start-up phases and the graphs compiled at its first step. The claim holds when the warmed-up
variant compiles 0 graphs and its first step takes about what a step does. On a CPU one process trains an
unsharded model (``trainer.model.parallelize.needs_fsdp``), which dynamo guards on: there only ``--world 1``
matches (0 graphs; ``--world 2``: 1); on a GPU every world is sharded.

    python benchmarks/studies/warm_join_check.py [--world 16] [--steps 3] [--set KEY=VALUE ...] [--flavor F]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHILD = """
import sys, time
from trainer.elastic import warm_join
from trainer.elastic import worker_host
from trainer.__main__ import main
world, argv = int(sys.argv[1]), sys.argv[2:]
if world:
    t = time.perf_counter()
    step_s = warm_join.warm_up(argv, 0, world, worker_host.free_the_last_round)
    print("WARM " + str(round(time.perf_counter() - t, 3)) + " " + str(round(step_s, 3)), flush=True)
sys.exit(main(argv))
"""


def one(world: int, argv: list[str], env: dict) -> dict:
    """Train ``argv`` in a new process, after a warm-up in a fake world of ``world`` (0: none); its startup
    event, with the warm-up's seconds."""
    from trainer.events import EVENTS_DIR_ENV, read_events

    with tempfile.TemporaryDirectory(prefix="dtrain-warm-join-") as tmp:
        run_env = {**env, EVENTS_DIR_ENV: tmp, "PYTHONPATH": str(REPO)}
        ckpt = ["--checkpoint-uri", os.path.join(tmp, "ckpt")]
        out = subprocess.run([sys.executable, "-c", CHILD, str(world), *argv, *ckpt], env=run_env, cwd=REPO,
                             capture_output=True, text=True, check=False)  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(f"exit {out.returncode}:\n{out.stderr[-3000:]}")
        startup = next(e for e in read_events(tmp) if e["event"] == "startup")
    warm = next((ln.split()[1:] for ln in out.stdout.splitlines() if ln.startswith("WARM ")), ["0", "0"])
    return {**startup, "warm_up_s": float(warm[0]), "warm_step_s": float(warm[1])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=16, help="the fake world's size: the group's full size")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--flavor", default="debug")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a trainer setting")
    args = p.parse_args()
    argv = ["--flavor", args.flavor, "--steps", str(args.steps), "--set", "parallel.compile=true",
            *(a for kv in args.set for a in ("--set", kv))]  # fmt: skip
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="dtrain-warm-join-cache-")}
    one(0, argv, env)  # fills the compile cache: both variants then find it warm, as a job's attempts do
    shown = ("warm_up_s", "warm_step_s", "build_s", "load_s", "first_step_s", "graphs_compiled")
    for label, world in (("joins at once", 0), (f"warm-up in a fake world of {args.world}", args.world)):
        row = one(world, argv, env)
        print(f"{label}: " + json.dumps({k: row[k] for k in shown}), flush=True)


if __name__ == "__main__":
    main()
