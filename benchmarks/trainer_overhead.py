"""What the trainer's bookkeeping costs per step, measured side by side in one run.

    python benchmarks/trainer_overhead.py [--steps 30] [--flavor debug] [--seq-len 128]
    torchrun --nproc-per-node 2 benchmarks/trainer_overhead.py

Three loops over the same model and data, interleaved in rounds so that load from other
processes hits all of them alike:

* bare:     train_step() only
* trainer:  train_step() + what train.Job.run() adds every step (progress.json write,
            the stop-flag all_reduce, metrics)
* checkpoint: one synchronous save, expressed in steps

Prints ratios, not absolute targets: "trainer/bare" should stay close to 1.0.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch.distributed as dist  # noqa: E402

from trainer.config import TrainConfig  # noqa: E402
from trainer.train import Job, setup_distributed, train_step  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--flavor", default="debug")
    p.add_argument("--seq-len", type=int, default=128)
    args = p.parse_args()
    # One directory for all ranks (a per-rank temp dir would split the checkpoint).
    root = os.path.join(tempfile.gettempdir(), f"dtrain-bench-{os.environ.get('TORCHELASTIC_RUN_ID', os.getpid())}")
    try:
        total = 2 * args.steps * args.rounds + 10
        cfg = TrainConfig.from_dict({"model": {"flavor": args.flavor}, "data": {"seq_len": args.seq_len},
                                     "steps": total, "checkpoint": {"uri": root}, "metrics": {"log_every": 10**6}})
        cfg.validate_world_size(int(os.environ.get("WORLD_SIZE", "1")))
        d = setup_distributed()
        job = Job.build(cfg, d)
        job.progress.start(None, None, 0)
        step = 0

        def bare() -> None:
            nonlocal step
            step += 1
            train_step(job.model, job.optimizer, job.scheduler, job.data.next_batch(), cfg, step, d.rank)

        def with_bookkeeping() -> None:
            nonlocal step
            step += 1
            loss, norm = train_step(job.model, job.optimizer, job.scheduler, job.data.next_batch(), cfg, step, d.rank)
            job.metrics.log_step(step=step, loss=loss, grad_norm=norm, lr=1.0, force=False)
            job.progress.update(step=step, loss=loss, tokens_seen=job.tokens(step))
            job.stops.agree()

        for _ in range(3):  # warm-up
            bare()
        times = {"bare": 0.0, "trainer": 0.0}
        for _ in range(args.rounds):
            for name, fn in (("bare", bare), ("trainer", with_bookkeeping)):
                dist.barrier()
                start = time.perf_counter()
                for _ in range(args.steps):
                    fn()
                dist.barrier()
                times[name] += time.perf_counter() - start
        dist.barrier()
        start = time.perf_counter()
        job.save(step, "interval")
        save_s = time.perf_counter() - start
        per_step = times["bare"] / (args.steps * args.rounds)
        if d.rank == 0:
            print(f"world size {d.world_size}, flavour {args.flavor}, seq_len {args.seq_len}, "
                  f"{args.steps * args.rounds} steps per variant")
            print(f"bare step:          {per_step * 1e3:8.1f} ms")
            print(f"trainer/bare:       {times['trainer'] / times['bare']:8.3f}  (per-step bookkeeping overhead)")
            print(f"checkpoint save:    {save_s / per_step:8.1f} steps ({save_s:.2f} s)")
        dist.destroy_process_group()
    finally:
        if os.environ.get("RANK", "0") == "0":
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
