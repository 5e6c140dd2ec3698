"""Steps/s of the trainer against a bare PyTorch loop, measured side by side in one run.

    python benchmarks/trainer_overhead.py [--steps 20] [--rounds 5] [--seq-len 128] [--batch 8]
    torchrun --nproc-per-node 2 benchmarks/trainer_overhead.py

Both drive the same model (the debug flavour, FSDP2-sharded by the trainer) with the same
AdamW and schedule:

* bare:    for each step: forward, cross-entropy, backward, clip, optimizer.step(), on
           batches prepared up front. No data loader, telemetry, progress file, stop
           agreement or checkpoint.
* trainer: the real ``trainer.train.Job.run()`` loop for the same number of steps, with
           everything it does every step (data loader, non-finite check, metrics and
           JSON lines every log interval, progress.json, the stop-flag all_reduce, the
           cost ledger), a checkpoint directory set, and only the checkpoint saves
           stubbed out (their cost is a separate question).

The two alternate in rounds (bare first in even rounds, trainer first in odd ones), so
drift and load from other processes hit both alike. Prints steps/s of each and
trainer/bare; the target is >= 0.98.
"""

import argparse
import contextlib
import io
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from trainer.config import TrainConfig  # noqa: E402
from trainer.train import Job, setup_distributed  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20, help="steps per variant per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--flavor", default="debug")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=8, help="global batch = micro-batch (no accumulation)")
    args = p.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    # One directory for all ranks: progress.json is written there, as in a real run.
    root = os.path.join(tempfile.gettempdir(), f"dtrain-bench-{os.environ.get('TORCHELASTIC_RUN_ID', os.getpid())}")
    try:
        cfg = TrainConfig.from_dict({
            "model": {"flavor": args.flavor}, "data": {"seq_len": args.seq_len}, "steps": args.steps,
            "global_batch_size": args.batch, "micro_batch_size": args.batch // world,
            "checkpoint": {"uri": root}, "metrics": {"log_every": 10},
        })
        cfg.validate_world_size(world)
        d = setup_distributed(cfg.parallel)
        job = Job.build(cfg, d)
        job.save = lambda step, reason, blocking=False: 0.0  # no checkpoints in either variant
        model, optimizer, scheduler = job.model, job.optimizer, job.scheduler
        batches = [job.data.next_batch() for _ in range(8)]  # the bare loop's data, prepared up front

        def bare(n: int) -> None:
            for i in range(n):
                [(inputs, targets)] = batches[i % len(batches)]
                loss = F.cross_entropy(model(inputs).flatten(0, 1).float(), targets.flatten())
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip, foreach=True)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)

        def trainer(n: int) -> None:
            with contextlib.redirect_stdout(io.StringIO()):  # its JSON lines are produced, not shown
                assert job.run() == 0  # steps 1..n: nothing is saved, so every run() starts afresh

        bare(3)  # warm-up: allocator, first-iteration FSDP set-up
        trainer(args.steps)
        times = {"bare": [], "trainer": []}
        for r in range(args.rounds):
            order = (("bare", bare), ("trainer", trainer)) if r % 2 == 0 else (("trainer", trainer), ("bare", bare))
            for name, fn in order:
                dist.barrier()
                start = time.perf_counter()
                fn(args.steps)
                dist.barrier()
                times[name].append(time.perf_counter() - start)
        if d.rank == 0:
            bare_sps = args.steps * args.rounds / sum(times["bare"])
            trainer_sps = args.steps * args.rounds / sum(times["trainer"])
            per_round = [b / t for b, t in zip(times["bare"], times["trainer"])]
            print(f"{platform.node()}: {os.cpu_count()} CPUs, torch {torch.__version__}, "
                  f"{torch.get_num_threads()} threads, world size {d.world_size}, device {d.device}")
            print(f"flavour {args.flavor}, seq_len {args.seq_len}, global batch {args.batch}, "
                  f"{args.rounds} rounds x {args.steps} steps per variant, interleaved")
            print(f"bare PyTorch loop: {bare_sps:8.3f} steps/s")
            print(f"trainer:           {trainer_sps:8.3f} steps/s")
            print(f"trainer/bare:      {trainer_sps / bare_sps:8.3f}  (target >= 0.98; per round: "
                  f"median {statistics.median(per_round):.3f}, min {min(per_round):.3f}, max {max(per_round):.3f})")
        dist.destroy_process_group()
    finally:
        if os.environ.get("RANK", "0") == "0":
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
