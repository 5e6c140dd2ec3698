"""Is the data path ever the bottleneck? Tokens/s it delivers per rank against tokens/s the trainer
consumes on this machine, and the peak memory of loading a Hugging Face model with ``init_from``.

    python benchmarks/data_throughput.py [--corpus-mb 32] [--world 2] [--seq-len 128] [--batch 8] [--steps 40]
                                         [--layers 16 --hidden 2048 --ffn 8192 --heads 32 --kv-heads 8 --vocab 128256]
    python benchmarks/data_throughput.py --quick          # small corpus and model: a check that it runs

1. Two token stores from one generated JSON-lines corpus (the built-in corpus's grammar, one
   document a line), written by ``trainer.prepare_data.prepare``: byte-level (uint16 ids) and a
   locally trained byte-level BPE padded to a vocabulary of --tokenizer-vocab ids (uint32 above
   65,535; tests/hf_tokenizer_assets.py, no download).
2. The data path as the trainer runs it: ``trainer.data.TrainBatches.next_batch()`` for each rank
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
     ``trainer.hf.local_copy`` and ``model_args``, ``trainer.train.build_model(..., random_init=False)``
     (meta device; FSDP2 on --world ranks, a plain module on one CPU process; only the rotary tables
     computed) then ``trainer.hf.load_weights``; each rank's parameter bytes are its shard's (fp32 on CPU);
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
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

TARGET = 10.0
MiB, GiB = 1 << 20, 1 << 30


# --------------------------------------------------------------------------- memory, in the measured process


def proc_status() -> dict[str, int]:
    """VmRSS, RssAnon, RssFile of this process, in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    return out


class PeakSampler:
    """The highest RssAnon and RssFile seen, polled every few ms in a thread (ru_maxrss gives only their sum)."""

    def __init__(self):
        self.peak = proc_status()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            for key, value in proc_status().items():
                self.peak[key] = max(self.peak[key], value)

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join()
        for key, value in proc_status().items():
            self.peak[key] = max(self.peak[key], value)
        return self.peak


def max_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def worker_trainer_load(model_dir: str, seq_len: int) -> None:
    """One rank of the trainer's init_from load, as ``Job.build`` runs it for a fresh job; prints one JSON
    line (every rank)."""
    import torch
    from torch.distributed.tensor import DTensor

    from trainer import hf
    from trainer.config import TrainConfig
    from trainer.data import default_data_dir
    from trainer.train import build_model, setup_distributed

    world = int(os.environ.get("WORLD_SIZE", "1"))
    baseline = proc_status()["VmRSS"]
    sampler = PeakSampler()
    cfg = TrainConfig.from_dict(
        {
            "model": {"init_from": model_dir},
            "data": {"seq_len": seq_len},
            "global_batch_size": world,
            "micro_batch_size": 1,
        }
    )
    d = setup_distributed(cfg.parallel)
    start = time.perf_counter()
    hf_dir = hf.local_copy(cfg.model.init_from, default_data_dir())  # a local directory: itself
    # No checkpoint to resume and a model loaded whole: Job.build skips the random draw (random_init=False).
    model = build_model(cfg, d, hf.model_args(cfg, hf_dir), random_init=False)
    build_s = time.perf_counter() - start
    after_build = max_rss()
    start = time.perf_counter()
    n = hf.load_weights(model, hf_dir, cfg.model.init_from)
    load_s = time.perf_counter() - start
    peak = max_rss()  # the parameters are copies: resident already
    split = sampler.stop()
    params = list(model.parameters())
    # DTensors on several ranks; plain tensors on one CPU process (trainer.parallelize.needs_fsdp)
    local = sum((p.to_local() if isinstance(p, DTensor) else p).numel() * p.element_size() for p in params)
    full = sum(p.numel() * p.element_size() for p in params)
    print(
        json.dumps(
            {
                "rank": d.rank,
                "world": d.world_size,
                "tensors": n,
                "baseline": baseline,
                "peak_after_build": after_build,
                "peak": peak,
                "peak_anon": split["RssAnon"],
                "peak_file": split["RssFile"],
                "param_bytes": local,
                "model_bytes": full,
                "dtype": str(params[0].dtype),
                "build_s": round(build_s, 2),
                "load_s": round(load_s, 2),
            }
        ),
        flush=True,
    )
    torch.distributed.destroy_process_group()


def worker_hf_load(model_dir: str, dtype: str) -> None:
    """transformers' own load of the same directory; prints one JSON line."""
    import torch
    from transformers import AutoModelForCausalLM

    baseline = proc_status()["VmRSS"]
    sampler = PeakSampler()
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    load_s = time.perf_counter() - start
    peak_load = max_rss()
    # A parameter in the file's dtype may still be a view of the memory-mapped file, its pages not
    # read yet: read every one (a sum allocates nothing the size of the tensor) so that the figures
    # are those of a model in memory, as the trainer's are.
    with torch.no_grad():
        for p in model.parameters():
            p.sum()
    peak = max_rss()
    split = sampler.stop()
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    print(
        json.dumps(
            {
                "baseline": baseline,
                "peak_load": peak_load,
                "peak": peak,
                "peak_anon": split["RssAnon"],
                "peak_file": split["RssFile"],
                "param_bytes": nbytes,
                "model_bytes": nbytes,
                "dtype": str(next(model.parameters()).dtype),
                "load_s": round(load_s, 2),
            }
        ),
        flush=True,
    )


def worker_build(model_dir: str, spec: dict) -> None:
    """Save a randomly initialised Llama of ``spec``'s shape in bf16 (as tests/hf_model_assets.py does)."""
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=spec["vocab"], hidden_size=spec["hidden"], intermediate_size=spec["ffn"],
        num_hidden_layers=spec["layers"], num_attention_heads=spec["heads"], num_key_value_heads=spec["kv_heads"],
        max_position_embeddings=2048, tie_word_embeddings=spec["tie"], rms_norm_eps=1e-5,
    )  # fmt: skip
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # built in the dtype it is saved in: half the memory
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(model_dir, safe_serialization=True, max_shard_size=spec["max_shard_size"])


# --------------------------------------------------------------------------- the driver's parts


def run_json(cmd: list[str], env: dict | None = None) -> list[dict]:
    """Run a measuring subprocess; its JSON lines (one per rank)."""
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def make_corpus(path: str, megabytes: float) -> list[str]:
    """A JSON-lines corpus of about `megabytes` MB in the built-in corpus's grammar; returns its first documents."""
    from trainer.data import DOC_SEPARATOR, generate_builtin_text

    docs = generate_builtin_text(int(megabytes * 1e6), seed=7).split(DOC_SEPARATOR)
    with open(path, "w") as f:
        for doc in docs:
            f.write(json.dumps({"text": doc.decode()}) + "\n")
    return [d.decode() for d in docs[:500]]


def data_rate(store: str, world: int, seq_len: int, batch: int, seconds: float) -> list[float]:
    """Tokens/s TrainBatches.next_batch() delivers to each rank of `world` (one rank at a time, for `seconds` each)."""
    import torch

    from trainer.data import TrainBatches

    rates = []
    for rank in range(world):
        loader = TrainBatches(
            store, seq_len, batch, batch // world, rank, world, seed=0, device=torch.device("cpu")
        )
        for _ in range(20):  # warm-up: shard memmaps opened, first pages touched
            loader.next_batch()
        calls, start = 0, time.perf_counter()
        while True:
            micro_batches = loader.next_batch()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        tokens = sum(inputs.numel() for inputs, _ in micro_batches)  # (micro_batch, seq_len) each
        assert tokens == batch // world * seq_len
        rates.append(calls * tokens / elapsed)
    return rates


def trainer_rate(
    store: str, world: int, seq_len: int, batch: int, steps: int, log_every: int, model: list[str], env: dict
) -> tuple[float, list[float]]:
    """Tokens/s per rank the real trainer consumes (group tokens_per_s / world), and the windows' group figures."""
    cmd = [
        sys.executable,
        "-m",
        "trainer.launch",
        "--standalone",
        "--nproc-per-node",
        str(world),
        "-m",
        "trainer",
        *model,
        "--dataset",
        store,
        "--steps",
        str(steps),
        "--set",
        f"data.seq_len={seq_len}",
        "--set",
        f"global_batch_size={batch}",
        "--set",
        f"micro_batch_size={batch // world}",
        "--set",
        f"metrics.log_every={log_every}",
        "--set",
        "optim.warmup_steps=2",
    ]
    events = run_json(cmd, env)
    windows = [e["tokens_per_s"] for e in events if e.get("event") == "train"]
    if len(windows) < 2:
        sys.exit(f"the trainer logged {len(windows)} train events; raise --steps")
    # Equal windows (log_every steps each): the group's rate over all of them is the harmonic mean.
    return statistics.harmonic_mean(windows[1:]) / world, windows


def fmt_bytes(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB"


def main() -> int:
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
    if args.worker == "trainer-load":
        worker_trainer_load(args.model_dir, args.seq_len)
        return 0
    if args.worker == "hf-load":
        worker_hf_load(args.model_dir, args.dtype)
        return 0
    if args.worker == "build":
        worker_build(args.model_dir, json.loads(args.spec))
        return 0
    if args.quick:
        args.corpus_mb, args.steps, args.data_seconds = 2, 10, 0.5
        args.layers, args.hidden, args.ffn, args.heads, args.kv_heads, args.vocab = 2, 256, 768, 4, 2, 32_000
    if args.batch % args.world:
        sys.exit(f"--batch {args.batch} is not divisible by --world {args.world}")

    import numpy as np
    import tokenizers
    import torch
    import transformers

    from tests.hf_model_assets import tiny_llama
    from tests.hf_tokenizer_assets import tiny_tokenizer
    from trainer.prepare_data import prepare
    from trainer.token_store import read_meta

    transformers.utils.logging.disable_progress_bar()
    tmp = tempfile.mkdtemp(prefix="dtrain-data-bench-")
    env = dict(
        os.environ,
        DTRAIN_DATA_DIR=os.path.join(tmp, "cache"),
        PYTHONPATH=REPO,
        HF_HUB_DISABLE_PROGRESS_BARS="1",
    )
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        print(
            f"{platform.node()}: {os.cpu_count()} CPUs, {ram / GiB:.1f} GiB RAM, python {platform.python_version()}, "
            f"torch {torch.__version__}, numpy {np.__version__}, transformers {transformers.__version__}, "
            f"tokenizers {tokenizers.__version__}, load average {os.getloadavg()[0]:.2f}"
        )

        # ---- 1. the stores
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
            f"corpus: {os.path.getsize(corpus) / 1e6:.1f} MB JSON lines; set-up {time.perf_counter() - start:.1f} s"
        )

        # ---- 2-3. data path, trainer, data path again
        per_rank = args.batch // args.world
        print(
            f"\nseq_len {args.seq_len}, global batch {args.batch} = {args.world} ranks x micro-batch {per_rank}: "
            f"{per_rank * args.seq_len} tokens per rank per step"
        )
        data = {
            name: [data_rate(store, args.world, args.seq_len, args.batch, args.data_seconds)]
            for name, store in stores.items()
        }
        src_model = tiny_llama(
            os.path.join(tmp, "tiny-llama"), vocab_size=read_meta(stores["bpe"])["vocab_size"]
        )
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

        print("\ndata path (TrainBatches.next_batch, tokens/s per rank; before / after the trainer runs):")
        delivered = {}
        for name, (before, after) in data.items():
            delivered[name] = min(min(before), min(after))
            ranks = ", ".join(f"rank {r}: {b:,.0f} / {a:,.0f}" for r, (b, a) in enumerate(zip(before, after)))
            print(
                f"  {name:5s} ({read_meta(stores[name])['dtype']}): {ranks} -> slowest {delivered[name]:,.0f}"
            )
        print(
            f"trainer ({args.world} ranks, torchrun, gloo; {args.steps} steps, first of "
            f"{args.steps // args.log_every} log windows dropped; tokens/s per rank):"
        )
        for label, (rate, windows) in trainer.items():
            print(f"  {label}: {rate:,.0f} (group windows: {', '.join(f'{w:,.0f}' for w in windows)})")
        debug = trainer["debug flavour, bytes store"][0]
        ratios = {
            "bytes store / debug trainer": delivered["bytes"] / debug,
            "bpe (uint32) store / init_from trainer": delivered["bpe"] / trainer[list(consumers)[1]][0],
            "bpe (uint32) store / debug trainer": delivered["bpe"] / debug,
        }
        print("ratio data/trainer (target >= 10):")
        for label, ratio in ratios.items():
            print(f"  {label}: {ratio:,.0f}")

        # ---- 4. peak memory of an init_from load
        if not args.no_model:
            spec = {
                "layers": args.layers,
                "hidden": args.hidden,
                "ffn": args.ffn,
                "heads": args.heads,
                "kv_heads": args.kv_heads,
                "vocab": args.vocab,
                "tie": not args.untied,
                "max_shard_size": args.max_shard_size,
            }
            model_dir = os.path.join(tmp, "model")
            start = time.perf_counter()
            me = [sys.executable, os.path.abspath(__file__)]
            run_json([*me, "--worker", "build", "--model-dir", model_dir, "--spec", json.dumps(spec)], env)
            files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
            on_disk = sum(os.path.getsize(os.path.join(model_dir, f)) for f in files)
            print(
                f"\nmodel: Llama {json.dumps(spec)}; {len(files)} safetensors files, {fmt_bytes(on_disk)} bf16 on "
                f"disk; built and saved in {time.perf_counter() - start:.0f} s"
            )
            rows = []
            load = ["--worker", "trainer-load", "--model-dir", model_dir, "--seq-len", str(args.seq_len)]
            rows += [("trainer, 1 process", r) for r in run_json([*me, *load], env)]
            rows += [
                (f"trainer, torchrun {args.world} ranks", r)
                for r in run_json(
                    [
                        sys.executable,
                        "-m",
                        "trainer.launch",
                        "--standalone",
                        "--nproc-per-node",
                        str(args.world),
                        os.path.abspath(__file__),
                        *load,
                    ],
                    env,
                )
            ]
            for dtype in ("float32", "bfloat16"):
                rows += [
                    (f"transformers from_pretrained({dtype})", r)
                    for r in run_json(
                        [*me, "--worker", "hf-load", "--model-dir", model_dir, "--dtype", dtype], env
                    )
                ]
            print(
                f"{'process':42s} {'params held':>12s} {'after imports':>14s} {'peak RSS':>10s} "
                f"{'peak-imports':>12s} {'/ params':>8s} {'peak anon':>10s} {'peak file':>10s} {'load s':>7s}"
            )
            for label, r in sorted(rows, key=lambda x: (x[0], x[1].get("rank", 0))):
                who = f"{label}" + (f", rank {r['rank']}" if r.get("world", 1) > 1 else "")
                grew = r["peak"] - r["baseline"]
                print(
                    f"{who:42s} {fmt_bytes(r['param_bytes']):>12s} {fmt_bytes(r['baseline']):>14s} "
                    f"{fmt_bytes(r['peak']):>10s} {fmt_bytes(grew):>12s} {grew / r['param_bytes']:>8.2f} "
                    f"{fmt_bytes(r['peak_anon']):>10s} {fmt_bytes(r['peak_file']):>10s} {r['load_s']:>7.1f}"
                )
                if "peak_after_build" in r:
                    print(
                        f"{'':42s} (peak RSS through build_model, before load_weights: "
                        f"{fmt_bytes(r['peak_after_build'])}, {r['build_s']:.1f} s; "
                        f"model {fmt_bytes(r['model_bytes'])} {r['dtype']})"
                    )
                if "peak_load" in r:
                    print(
                        f"{'':42s} (peak RSS when from_pretrained returned, before every parameter was read: "
                        f"{fmt_bytes(r['peak_load'])})"
                    )

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
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
