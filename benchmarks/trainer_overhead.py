"""Steps/s of the trainer against a bare PyTorch loop, measured side by side in one run.

    python benchmarks/trainer_overhead.py [--steps 20] [--rounds 10] [--seq-len 128] [--batch 8]
    torchrun --nproc-per-node 2 benchmarks/trainer_overhead.py
    python benchmarks/trainer_overhead.py --quick   # 2 rounds x 2 steps at seq_len 32: a check that it runs

Both drive the same model (the debug flavour, as the trainer lays it out: FSDP2-sharded on
several ranks or a GPU, a plain module on one CPU process, see trainer.model.parallelize.needs_fsdp)
with the same AdamW and schedule:

* plain:   (one process only) the same Llama as a plain ``nn.Module`` built by hand, with the
           same weights, AdamW and schedule, in the same bare loop: what a single-device
           PyTorch script would run.
* fsdp2:   (one process only) the same, wrapped with FSDP2 as it would be on a GPU or on
           several ranks: what the wrapper costs on one rank, which the trainer no longer pays.
* bare:    forward, cross-entropy, backward, clip, optimizer.step(), on batches prepared up
           front, on the trainer's model. No data loader, telemetry, progress file, stop
           agreement or checkpoint.
* trainer: ``trainer.train.Job.step()``, the body of the real training loop, with
           everything it does every step: the data loader, the loss all-reduce, the
           non-finite check, metrics and a JSON line every log interval, the progress.json
           rewrite, the stop-flag all-reduce, the cost ledger. A checkpoint directory is
           set, but no interval saves (their cost is benchmarks/checkpoint.py's question).

They alternate step by step (bare-trainer, then trainer-bare, ..., plain among them), so drift and load
from other processes hit both alike; on a shared 2-core machine whole-second stalls are
common and a block-wise comparison mostly measures them. Each step is timed on its own
(after a barrier across ranks). Prints steps/s of each, trainer/bare over all steps, and the
median and range of the ratio per round of --steps pairs; the target is >= 0.98. With one
process it also prints trainer/plain (the target: >= 0.98 of a plain script) and FSDP2/plain
(what the wrapper would cost on one rank).
Start-up (resume, the first progress.json) is not per step and is not counted.
"""

import argparse
import contextlib
import io
import os
import platform
import shutil
import statistics
import tempfile
import time

import _common  # noqa: F401 - the repository on sys.path, before the trainer

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from trainer.config.job_config import TrainConfig  # noqa: E402
from trainer.train import Job  # noqa: E402
from trainer.step.process_group import setup_distributed


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20, help="steps per variant per round (ratios per round)")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--flavor", default="debug")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=8, help="global batch = micro-batch (no accumulation)")
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="(one process) also profile N steps of plain and of bare with torch.profiler and print "
        "the ops where bare (FSDP2) spends more CPU time than plain: what the wrapper costs",
    )
    p.add_argument("--quick", action="store_true", help="--steps 2 --rounds 2 --seq-len 32")
    args = p.parse_args()
    if args.quick:
        args.steps, args.rounds, args.seq_len = 2, 2, 32
    return args


def make_config(args: argparse.Namespace, world: int, root: str) -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "model": {"flavor": args.flavor},
            "data": {"seq_len": args.seq_len},
            "steps": 10**9,  # never the last step: no final save inside the measurement
            "global_batch_size": args.batch,
            "micro_batch_size": args.batch // world,
            "checkpoint": {"uri": root, "every": 0},
            "metrics": {"log_every": 10},
        }
    )


def one_process_variants(model, cfg: TrainConfig, d, batches) -> dict:
    """The same model unwrapped (what a plain single-device script runs), and wrapped with FSDP2."""
    from trainer.model.llama import Llama
    from trainer.model.parallelize import build_optimizer, build_scheduler

    variants = {}
    with torch.device(d.device):
        plain_model = Llama(model.args)
    plain_model.init_weights(cfg.seed)
    plain_opt = build_optimizer(plain_model, cfg.optim)
    plain_sched = build_scheduler(plain_opt, cfg.optim, cfg.steps)

    variants["plain"] = bare_loop(plain_model, plain_opt, plain_sched, batches, cfg.optim.grad_clip)

    from trainer.model.parallelize import parallelize

    with torch.device("meta"):
        fsdp_model = Llama(model.args)
    parallelize(fsdp_model, d.mesh, cfg.parallel, shard=True)
    fsdp_model.to_empty(device=d.device)
    fsdp_model.init_weights(cfg.seed)
    fsdp_opt = build_optimizer(fsdp_model, cfg.optim)
    variants["fsdp2"] = bare_loop(
        fsdp_model,
        fsdp_opt,
        build_scheduler(fsdp_opt, cfg.optim, cfg.steps),
        batches,
        cfg.optim.grad_clip,
    )
    return variants


def job_step(job: Job):
    """One step of the real training loop (``Job.step``), its JSON lines produced, not shown."""
    quiet = io.StringIO()  # the trainer's JSON lines are produced, not shown
    step = job.start()

    def trainer_step(i: int) -> None:
        nonlocal step
        step += 1
        with contextlib.redirect_stdout(quiet):
            assert not job.step(step)
        quiet.seek(0)
        quiet.truncate()

    return trainer_step


def time_variants(args: argparse.Namespace, variants: dict, job: Job) -> dict[str, list[float]]:
    """Every variant's step times, alternating step by step after a warm-up."""
    for i in range(3):  # warm-up: allocator, first-iteration FSDP set-up
        for fn in variants.values():
            fn(i)
    times = {name: [] for name in variants}
    for i in range(args.steps * args.rounds):
        order = list(variants.items())
        for name, fn in order if i % 2 == 0 else reversed(order):
            dist.barrier()
            start = time.perf_counter()
            fn(i)
            if name == "trainer" and i == args.steps * args.rounds - 1:
                job.settle()  # the last step's values, read as the next step would
            times[name].append(time.perf_counter() - start)
    return times


def print_rates(args: argparse.Namespace, d, times: dict[str, list[float]]) -> None:
    """Steps/s of each, trainer/bare over all steps and per round, and against plain on one process."""
    bare_sps = len(times["bare"]) / sum(times["bare"])
    trainer_sps = len(times["trainer"]) / sum(times["trainer"])
    rounds = [slice(r * args.steps, (r + 1) * args.steps) for r in range(args.rounds)]
    per_round = [sum(times["bare"][r]) / sum(times["trainer"][r]) for r in rounds]
    print(
        f"{platform.node()}: {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, world size {d.world_size}, device {d.device}"
    )
    print(
        f"flavour {args.flavor}, seq_len {args.seq_len}, global batch {args.batch}, "
        f"{args.rounds} rounds x {args.steps} steps per variant, interleaved step by step"
    )
    print(f"bare PyTorch loop: {bare_sps:8.3f} steps/s")
    print(f"trainer:           {trainer_sps:8.3f} steps/s")
    print(
        f"trainer/bare:      {trainer_sps / bare_sps:8.3f}  (target >= 0.98; per round: "
        f"median {statistics.median(per_round):.3f}, min {min(per_round):.3f}, "
        f"max {max(per_round):.3f})"
    )
    if "plain" in times:
        plain_sps = len(times["plain"]) / sum(times["plain"])
        for label, other in (
            ("trainer/plain", "trainer"),
            ("bare/plain", "bare"),
            ("FSDP2/plain", "fsdp2"),
        ):
            ratios = [sum(times["plain"][r]) / sum(times[other][r]) for r in rounds]
            ratio = (len(times[other]) / sum(times[other])) / plain_sps
            print(
                f"{label + ':':19}{ratio:8.3f}  (per round: "
                f"median {statistics.median(ratios):.3f}, min {min(ratios):.3f}, "
                f"max {max(ratios):.3f}; plain {plain_sps:.3f} steps/s)"
            )


def main() -> None:
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    # One directory for all ranks: progress.json is written there, as in a real run.
    root = os.path.join(
        tempfile.gettempdir(), f"dtrain-bench-{os.environ.get('TORCHELASTIC_RUN_ID', os.getpid())}"
    )
    try:
        cfg = make_config(args, world, root)
        cfg.validate_world_size(world)
        d = setup_distributed(cfg.parallel)
        job = Job.build(cfg, d)
        model, optimizer, scheduler = job.model, job.optimizer, job.scheduler
        batches = [job.data.next_batch() for _ in range(8)]  # the bare loop's data, prepared up front
        variants = one_process_variants(model, cfg, d, batches) if world == 1 else {}
        bare_step = bare_loop(model, optimizer, scheduler, batches, cfg.optim.grad_clip)
        variants.update(bare=bare_step, trainer=job_step(job))
        times = time_variants(args, variants, job)
        job.ckpt.close()
        if d.rank == 0:
            print_rates(args, d, times)
        if args.profile and "plain" in variants and d.rank == 0:
            print_profile_difference(variants["plain"], variants["fsdp2"], args.profile)
        dist.destroy_process_group()
    finally:
        if os.environ.get("RANK", "0") == "0":
            shutil.rmtree(root, ignore_errors=True)


def bare_loop(model, optimizer, scheduler, batches, grad_clip: float):
    """One step of a bare training loop over pre-made ``batches``: forward, loss, backward, clip, AdamW."""

    def step(i: int) -> None:
        [(inputs, targets)] = batches[i % len(batches)]
        loss = F.cross_entropy(model(inputs).flatten(0, 1).float(), targets.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip, foreach=True)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def print_profile_difference(plain, bare, steps: int, top: int = 12) -> None:
    """Self CPU time per op over ``steps`` steps of each; the ops where bare spends the most more than
    plain."""
    from torch.profiler import ProfilerActivity, profile

    totals = {}
    for name, fn in (("plain", plain), ("bare", bare)):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(steps):
                fn(i)
        totals[name] = {e.key: e.self_cpu_time_total / 1e3 / steps for e in prof.key_averages()}
    keys = set(totals["plain"]) | set(totals["bare"])
    diff = sorted(((totals["bare"].get(k, 0.0) - totals["plain"].get(k, 0.0), k) for k in keys), reverse=True)
    print(
        f"profile, self CPU ms per step: plain {sum(totals['plain'].values()):.1f}, "
        f"bare (FSDP2) {sum(totals['bare'].values()):.1f}; where bare spends more:"
    )
    for extra, key in diff[:top]:
        print(
            f"  {extra:+7.2f} ms  {key}  (plain {totals['plain'].get(key, 0.0):.2f}, "
            f"bare {totals['bare'].get(key, 0.0):.2f})"
        )


if __name__ == "__main__":
    main()
