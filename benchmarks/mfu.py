"""Tokens/s and MFU of the trainer's model on one GPU (the llama3_1b flavour by default).

    python benchmarks/mfu.py                       # 1B, seq 2048, micro-batch 4, compile on, no AC
    python benchmarks/mfu.py --ac selective --micro-batch 8 --no-compile
    torchrun --nproc-per-node 1 benchmarks/mfu.py  # the same, under torchrun
    python benchmarks/mfu.py --flavor debug --allow-cpu --steps 2 --warmup 1 --seq-len 64  # CPU smoke test
    python benchmarks/mfu.py --quick               # the same on a GPU (compiled) or a CPU (eager, no MFU)

What runs is the trainer's own step: the model built by trainer.step.train_step.build_model (FSDP2
over this rank, bf16 parameters with fp32 gradient reduction and master weights),
trainer.model.parallelize's AdamW (fused on CUDA) and trainer.train.train_step, on random tokens
(no data loading), after --warmup steps (compilation, allocator). MFU is
tokens/s × trainer.report.metrics.flops_per_token ÷ the GPU's dense bf16 peak from
trainer.report.metrics.PEAK_BF16_FLOPS (989 TFLOP/s for an H100 SXM). Without a GPU it exits 2
with a message, unless --allow-cpu (a check that the script runs; no MFU).
"""

import argparse
import os
import sys
import time

import _common  # noqa: F401 - the repository on sys.path, before the trainer

import torch  # noqa: E402

from trainer.config.job_config import TrainConfig  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--flavor", default="llama3_1b")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--accum", type=int, default=1, help="micro-steps per optimizer step")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--ac", choices=("none", "selective", "full"), default="none")
    p.add_argument("--selective-ac-every", type=int, default=0)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument(
        "--compile-loss",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compile the loss too (default: with --compile, as the trainer does)",
    )
    p.add_argument(
        "--loss-chunk-tokens",
        type=int,
        default=None,
        help="parallel.loss_chunk_tokens (default: the trainer's; 0 = whole logits, no recompute)",
    )
    p.add_argument("--allow-cpu", action="store_true")
    p.add_argument(
        "--quick",
        action="store_true",
        help="--flavor debug --seq-len 64 --steps 2 --warmup 1, on a GPU or (eager) a CPU: "
        "a check that it runs",
    )
    args = p.parse_args()
    if args.quick:
        args.flavor, args.seq_len, args.steps, args.warmup = "debug", 64, 2, 1
        if not torch.cuda.is_available():  # compiling for a CPU would take most of the run, to no purpose
            args.allow_cpu, args.compile = True, False
    return args


def set_up(args: argparse.Namespace):
    """The trainer's model, optimizer and scheduler on this rank, and a fixed batch of random tokens."""
    from trainer.model.parallelize import build_optimizer, build_scheduler
    from trainer.step.process_group import setup_distributed
    from trainer.step.train_step import build_model

    world = int(os.environ.get("WORLD_SIZE", "1"))
    cfg = TrainConfig.from_dict(
        {
            "model": {"flavor": args.flavor},
            "data": {"seq_len": args.seq_len},
            "steps": args.warmup + args.steps,
            "micro_batch_size": args.micro_batch,
            "global_batch_size": args.micro_batch * args.accum * world,
            "optim": {"warmup_steps": 0, "lr": 1e-5},
            "parallel": {
                "activation_checkpointing": args.ac,
                "selective_ac_every": args.selective_ac_every,
                "compile": args.compile,
                **({} if args.loss_chunk_tokens is None else {"loss_chunk_tokens": args.loss_chunk_tokens}),
            },
        }
    )
    d = setup_distributed(cfg.parallel)
    model = build_model(cfg, d)
    if args.compile_loss is not None:
        model.compile_loss = args.compile_loss
    optimizer = build_optimizer(model, cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.optim, cfg.steps)
    vocab = model.args.vocab_size
    g = torch.Generator(device=d.device).manual_seed(d.rank)
    rows = torch.randint(
        0, vocab, (args.accum, args.micro_batch, args.seq_len + 1), device=d.device, generator=g
    )
    micro_batches = [(r[:, :-1], r[:, 1:]) for r in rows]  # each (micro_batch, seq_len)
    return cfg, d, model, optimizer, scheduler, micro_batches


def timed_steps(args: argparse.Namespace, cfg, d, model, optimizer, scheduler, micro_batches):
    """--warmup steps, then --steps timed ones: (the last loss, seconds)."""
    from trainer.step.train_step import train_step

    def sync():
        if d.device.type == "cuda":
            torch.cuda.synchronize(d.device)

    for step in range(1, args.warmup + 1):
        train_step(model, optimizer, scheduler, micro_batches, cfg)
    sync()
    if d.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(d.device)
    start = time.perf_counter()
    for step in range(args.warmup + 1, args.warmup + args.steps + 1):
        loss, _ = train_step(model, optimizer, scheduler, micro_batches, cfg)
    sync()
    elapsed = time.perf_counter() - start
    return loss, elapsed


def report(args: argparse.Namespace, cfg, d, model, loss, elapsed: float) -> None:
    """Rank 0 prints the set-up, tokens/s and the MFU against the device's bf16 peak."""
    from trainer.report.metrics import flops_per_token, peak_flops

    world = int(os.environ.get("WORLD_SIZE", "1"))
    tokens_per_s = args.steps * cfg.global_batch_size * args.seq_len / elapsed
    fpt = flops_per_token(model.args, model.num_params(exclude_embedding=True), args.seq_len)
    peak = peak_flops(d.device)
    if d.rank != 0:
        return
    name = torch.cuda.get_device_name(d.device) if d.device.type == "cuda" else "cpu"
    # one CPU process trains a plain module (trainer.model.parallelize.needs_fsdp)
    layout = (
        "bf16 FSDP2 (fp32 reduce)"
        if d.device.type == "cuda"
        else "fp32 FSDP2"
        if world > 1
        else "fp32, plain module"
    )
    print(f"device {name} x {world}, torch {torch.__version__}, cuda {torch.version.cuda}")
    print(
        f"flavour {args.flavor} ({model.num_params() / 1e9:.3f} B params), seq_len {args.seq_len}, "
        f"micro-batch {args.micro_batch} x accum {args.accum} x {world} ranks, "
        f"{layout}, "
        f"compile {args.compile} (loss {model.compile_loss}), "
        f"loss chunk {cfg.parallel.loss_chunk_tokens or 'none'}, AC {args.ac}"
        + (f" (every {args.selective_ac_every})" if args.ac == "selective" else "")
        + f", AdamW fused {d.device.type == 'cuda'}"
    )
    print(
        f"{args.steps} steps in {elapsed:.2f} s after {args.warmup} warm-up steps; "
        f"last loss {loss.item():.3f}"
    )
    print(
        f"tokens/s: {tokens_per_s:,.0f} ({tokens_per_s / world:,.0f} per GPU); "
        f"{fpt / 1e9:.2f} GFLOP/token (6N + attention)"
    )
    if peak:
        mfu = tokens_per_s * fpt / (peak[1] * world)
        print(f"MFU: {100 * mfu:.1f}% of {peak[1] / 1e12:.0f} TFLOP/s dense bf16 per GPU ({peak[0]})")
    else:
        print("MFU: n/a (no known bf16 peak for this device)")
    if d.device.type == "cuda":
        print(f"peak memory: {torch.cuda.max_memory_allocated(d.device) / 2**30:.1f} GiB")


def main() -> int:
    args = parse_args()
    if not torch.cuda.is_available() and not args.allow_cpu:
        print(
            "benchmarks/mfu.py measures a GPU: torch.cuda.is_available() is False on this machine "
            f"(torch {torch.__version__}). Not measured. (--allow-cpu runs it anyway, without MFU.)",
            file=sys.stderr,
        )
        return 2

    cfg, d, model, optimizer, scheduler, micro_batches = set_up(args)
    loss, elapsed = timed_steps(args, cfg, d, model, optimizer, scheduler, micro_batches)
    report(args, cfg, d, model, loss, elapsed)
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
