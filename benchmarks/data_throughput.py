"""Is the data path ever the bottleneck? Tokens/s it delivers per rank against tokens/s the trainer
consumes on this machine, and the peak memory of loading a Hugging Face model with ``init_from``.

    python benchmarks/data_throughput.py [--corpus-mb 32] [--world 2] [--seq-len 128] [--batch 8] [--steps 40]
                                         [--layers 16 --hidden 2048 --ffn 8192 --heads 32 --kv-heads 8
                                         --vocab 128256]
    python benchmarks/data_throughput.py --quick          # small corpus and model: a check that it runs

1. Two token stores from one generated JSON-lines corpus (the built-in corpus's grammar, one
   document a line), written by ``trainer.prepare_data.pipeline.prepare``: byte-level (uint16 ids) and a
   locally trained byte-level BPE padded to a vocabulary of --tokenizer-vocab ids (uint32 above
   65,535; tests/hf_tokenizer_assets.py, no download).
2. The data path as the trainer runs it: ``trainer.data.loader.TrainBatches.next_batch()`` for each rank
   r of --world, with the trainer's global batch, micro-batch and seed: shard memmaps, the
   per-epoch permutation, np.stack, the int64 cast and the numpy -> torch (-> device) conversion.
   Tokens/s delivered per rank = the rank's (batch / world) x seq_len tokens per call over the time
   of the calls; the slowest rank is reported. The store is in the page cache (see RESULTS.md).
   Measured before and after the trainer runs; the lower figure counts.
3. Tokens/s the trainer consumes: ``python -m trainer.launch --standalone --nproc-per-node W -m
   trainer`` (torchrun, gloo) for --steps steps at the same seq_len and batch, read from its
   "train" events (tokens_per_s is the whole group's: per rank = / W; the first log interval,
   with the first iterations' set-up, is dropped). Two runs: the debug flavour on the byte-level
   store (the fastest consumer on this machine: the harshest test of the data path), and a
   2-layer init_from Llama whose vocabulary is the BPE's, on the uint32 store. The ratio
   data/trainer is printed for each, and for the uint32 data path against the debug trainer;
   the target is >= 10 for all of them: the loader runs synchronously in the training loop, so a
   ratio of 10 costs at most ~9 % of a step. Exit 1 if any is below 10.
4. Peak memory of loading a model as large as fits (default: Llama 3.2 1B's shape, 1.24 B
   parameters, saved in bf16 by transformers' ``save_pretrained`` in files of at most --max-shard-size):
   each measurement is a fresh process reporting ``getrusage(RUSAGE_SELF).ru_maxrss``, plus its
   anonymous / file-backed split sampled from /proc/self/status (the safetensors files are
   memory-mapped: their pages count in RSS while mapped, but are page cache, not allocations):
   * trainer, 1 rank and --world ranks under torchrun: Job.build's init_from path for a fresh job:
     ``trainer.model.hf.local_copy`` and ``model_args``,
     ``trainer.step.train_step.build_model(..., random_init=False)`` (meta device; FSDP2 on --world ranks, a
     plain module on one CPU process; only the rotary tables computed) then ``trainer.model.hf.load_weights``;
     each rank's parameter bytes are its shard's (fp32 on CPU);
   * reference: ``transformers.AutoModelForCausalLM.from_pretrained`` on the same directory,
     in fp32 (the trainer's parameter dtype on CPU) and in the checkpoint's bf16; every parameter
     is then read once (in bf16 they may still be views of the mapped file, not in memory yet).
   The model directory is a temporary one, removed at the end.

Prints every figure with its setup; asserts nothing else.
"""

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time

from _common import REPO
from datalab.model_memory import model_memory
from datalab.rates import GiB, data_rate, make_corpus, trainer_rate
from datalab.workers import worker_build, worker_hf_load, worker_trainer_load

TARGET = 10.0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help="every part, small (a 2 MB corpus, 10 steps, a 0.01 B model): a check that it runs",
    )
    p.add_argument("--corpus-mb", type=float, default=32, help="size of the generated JSON-lines corpus")
    p.add_argument(
        "--tokenizer-vocab", type=int, default=70_000, help="BPE vocabulary (> 65,535: uint32 ids)"
    )
    p.add_argument("--world", type=int, default=2, help="ranks: the data path's views and torchrun's workers")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument(
        "--batch", type=int, default=8, help="global batch (= world x micro-batch, no accumulation)"
    )
    p.add_argument("--steps", type=int, default=40, help="trainer steps per run")
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--data-seconds", type=float, default=2.0, help="time per rank per data-path measurement")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--ffn", type=int, default=8192)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=128_256)
    p.add_argument(
        "--untied", action="store_true", help="a separate lm_head (default: tied, as Llama 3.2 1B)"
    )
    p.add_argument(
        "--max-shard-size",
        default="5GB",
        help="save_pretrained's max_shard_size (default: the hub's usual 5 GB files)",
    )
    p.add_argument("--no-model", action="store_true", help="skip the model-loading memory measurement")
    p.add_argument("--worker", choices=("trainer-load", "hf-load", "build"), help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:
        args.corpus_mb, args.steps, args.data_seconds = 2, 10, 0.5
        args.layers, args.hidden, args.ffn, args.heads, args.kv_heads, args.vocab = 2, 256, 768, 4, 2, 32_000
    if args.batch % args.world:
        sys.exit(f"--batch {args.batch} is not divisible by --world {args.world}")
    return args


def run_worker(args: argparse.Namespace) -> bool:
    """This process is a measuring one (``--worker``): run it; False when it is the driver."""
    if args.worker == "trainer-load":
        worker_trainer_load(args.model_dir, args.seq_len)
        return True
    if args.worker == "hf-load":
        worker_hf_load(args.model_dir, args.dtype)
        return True
    if args.worker == "build":
        worker_build(args.model_dir, json.loads(args.spec))
        return True
    return False


def print_machine() -> None:
    """The machine and the versions the figures were measured with."""
    import numpy as np
    import tokenizers
    import torch
    import transformers

    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    print(
        f"{platform.node()}: {os.cpu_count()} CPUs, {ram / GiB:.1f} GiB RAM, python "
        f"{platform.python_version()}, "
        f"torch {torch.__version__}, numpy {np.__version__}, transformers {transformers.__version__}, "
        f"tokenizers {tokenizers.__version__}, load average {os.getloadavg()[0]:.2f}"
    )


def build_stores(args: argparse.Namespace, tmp: str) -> dict[str, str]:
    """1. The byte-level and the BPE token store of one generated corpus: {name: directory}."""
    from tests.hf_tokenizer_assets import tiny_tokenizer
    from trainer.prepare_data.pipeline import prepare
    from trainer.data.token_store import read_meta

    corpus = os.path.join(tmp, "corpus.jsonl")
    start = time.perf_counter()
    sample = make_corpus(corpus, args.corpus_mb)
    tok_dir = tiny_tokenizer(os.path.join(tmp, "bpe"), vocab_size=args.tokenizer_vocab, corpus=sample)
    stores = {}
    for name, tokenizer in (("bytes", None), ("bpe", tok_dir)):
        stores[name] = os.path.join(tmp, f"store-{name}")
        t0 = time.perf_counter()
        prepare([corpus], stores[name], tokenizer=tokenizer, log=lambda m: None)
        meta = read_meta(stores[name])
        print(
            f"store {name}: {meta['splits']['train']['tokens']:,} train tokens, {meta['dtype']}, vocab "
            f"{meta['vocab_size']:,}, prepared in {time.perf_counter() - t0:.1f} s"
        )
    print(
        f"corpus: {os.path.getsize(corpus) / 1e6:.1f} MB JSON lines; set-up "
        f"{time.perf_counter() - start:.1f} s"
    )
    return stores


def measure_rates(args: argparse.Namespace, stores: dict, tmp: str, env: dict) -> tuple[dict, dict]:
    """2-3. The data path's rates per rank before and after the trainer's runs, and the trainer's."""
    from tests.hf_model_assets import tiny_llama
    from trainer.data.token_store import read_meta

    per_rank = args.batch // args.world
    print(
        f"\nseq_len {args.seq_len}, global batch {args.batch} = {args.world} ranks x micro-batch {per_rank}: "
        f"{per_rank * args.seq_len} tokens per rank per step"
    )
    data = {
        name: [data_rate(store, args.world, args.seq_len, args.batch, args.data_seconds)]
        for name, store in stores.items()
    }
    src_model = tiny_llama(os.path.join(tmp, "tiny-llama"), vocab_size=read_meta(stores["bpe"])["vocab_size"])
    consumers = {
        "debug flavour, bytes store": ("bytes", ["--flavor", "debug"]),
        "init_from 2-layer Llama (dim 64, BPE vocab), bpe store": ("bpe", ["--init-from", src_model]),
    }
    trainer = {}
    for label, (store, model) in consumers.items():
        trainer[label] = trainer_rate(
            stores[store], args.world, args.seq_len, args.batch, args.steps, args.log_every, model, env
        )
    for name, store in stores.items():
        data[name].append(data_rate(store, args.world, args.seq_len, args.batch, args.data_seconds))
    return data, trainer


def print_rates(args: argparse.Namespace, stores: dict, data: dict, trainer: dict) -> dict[str, float]:
    """The data path's and the trainer's rates, and their ratios (returned: {label: data/trainer})."""
    from trainer.data.token_store import read_meta

    print("\ndata path (TrainBatches.next_batch, tokens/s per rank; before / after the trainer runs):")
    delivered = {}
    for name, (before, after) in data.items():
        delivered[name] = min(min(before), min(after))
        ranks = ", ".join(f"rank {r}: {b:,.0f} / {a:,.0f}" for r, (b, a) in enumerate(zip(before, after)))
        print(f"  {name:5s} ({read_meta(stores[name])['dtype']}): {ranks} -> slowest {delivered[name]:,.0f}")
    print(
        f"trainer ({args.world} ranks, torchrun, gloo; {args.steps} steps, first of "
        f"{args.steps // args.log_every} log windows dropped; tokens/s per rank):"
    )
    for label, (rate, windows) in trainer.items():
        print(f"  {label}: {rate:,.0f} (group windows: {', '.join(f'{w:,.0f}' for w in windows)})")
    debug = trainer["debug flavour, bytes store"][0]
    ratios = {
        "bytes store / debug trainer": delivered["bytes"] / debug,
        "bpe (uint32) store / init_from trainer": delivered["bpe"] / trainer[list(trainer)[1]][0],
        "bpe (uint32) store / debug trainer": delivered["bpe"] / debug,
    }
    print("ratio data/trainer (target >= 10):")
    for label, ratio in ratios.items():
        print(f"  {label}: {ratio:,.0f}")
    return ratios


def report_target(ratios: dict[str, float]) -> int:
    """Exit status: 1 when any ratio is below the target."""
    worst = min(ratios.values())
    if worst < TARGET:
        print(
            f"\nNOT MET: the data path delivers only {worst:.1f}x what the trainer consumes "
            f"(target >= {TARGET:g}x)",
            file=sys.stderr,
        )
        return 1
    print(f"\ntarget met: the data path delivers >= {worst:,.0f}x what the trainer consumes")
    return 0


def main() -> int:
    args = parse_args()
    if run_worker(args):
        return 0
    import transformers

    transformers.utils.logging.disable_progress_bar()
    tmp = tempfile.mkdtemp(prefix="dtrain-data-bench-")
    env = dict(
        os.environ,
        DTRAIN_DATA_DIR=os.path.join(tmp, "cache"),
        PYTHONPATH=str(REPO),
        HF_HUB_DISABLE_PROGRESS_BARS="1",
    )
    try:
        print_machine()
        stores = build_stores(args, tmp)
        data, trainer = measure_rates(args, stores, tmp, env)
        ratios = print_rates(args, stores, data, trainer)
        # 4. peak memory of an init_from load
        if not args.no_model:
            model_memory(args, tmp, env, os.path.abspath(__file__))
        return report_target(ratios)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
