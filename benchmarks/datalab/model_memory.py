"""Step 4 of the data-throughput benchmark: the peak memory of loading a Hugging Face model with
``init_from``, against transformers' own load, each in a fresh process (``workers``)."""

import json
import os
import sys
import time

from _common import launch_command

from .rates import fmt_bytes, run_json


def build_model_dir(args, tmp: str, env: dict, script: str) -> str:
    """A randomly initialised Llama of the options' shape, saved in bf16 under ``tmp``; its directory."""
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
    me = [sys.executable, script]
    run_json([*me, "--worker", "build", "--model-dir", model_dir, "--spec", json.dumps(spec)], env)
    files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    on_disk = sum(os.path.getsize(os.path.join(model_dir, f)) for f in files)
    print(
        f"\nmodel: Llama {json.dumps(spec)}; {len(files)} safetensors files, {fmt_bytes(on_disk)} bf16 on "
        f"disk; built and saved in {time.perf_counter() - start:.0f} s"
    )
    return model_dir


def measure_loads(args, model_dir: str, env: dict, script: str) -> list[tuple[str, dict]]:
    """(label, figures) of every measuring process: the trainer on 1 and --world ranks, transformers
    in fp32 and bf16."""
    me = [sys.executable, script]
    rows = []
    load = ["--worker", "trainer-load", "--model-dir", model_dir, "--seq-len", str(args.seq_len)]
    rows += [("trainer, 1 process", r) for r in run_json([*me, *load], env)]
    rows += [
        (f"trainer, torchrun {args.world} ranks", r)
        for r in run_json(launch_command(args.world, script, *load), env)
    ]
    for dtype in ("float32", "bfloat16"):
        rows += [
            (f"transformers from_pretrained({dtype})", r)
            for r in run_json([*me, "--worker", "hf-load", "--model-dir", model_dir, "--dtype", dtype], env)
        ]
    return rows


def print_memory_table(rows: list[tuple[str, dict]]) -> None:
    """One line per process (and rank): parameters held, RSS after imports and at its peak, the split."""
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


def model_memory(args, tmp: str, env: dict, script: str) -> None:
    """Build the model, load it in every way, print the table (``script``: data_throughput.py, whose
    ``--worker`` modes are the measuring processes)."""
    model_dir = build_model_dir(args, tmp, env, script)
    print_memory_table(measure_loads(args, model_dir, env, script))
