"""What runs in a measuring process (``data_throughput.py --worker ...``): its memory, polled, and the
three workers: the trainer's init_from load, transformers' own load, and the model's build."""

import json
import os
import resource
import sys
import threading
import time

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
    """The highest RssAnon and RssFile seen, polled every few ms in a thread (ru_maxrss gives only their
    sum)."""

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


def print_json_line(obj: dict) -> None:
    """``obj`` as one JSON line in a single write: under PYTHONUNBUFFERED, ``print`` writes the text and its
    newline apart, and the ranks sharing one stdout pipe could put another rank's line between them (a
    line shorter than PIPE_BUF is written whole)."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def max_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def worker_trainer_load(model_dir: str, seq_len: int) -> None:
    """One rank of the trainer's init_from load, as ``Job.build`` runs it for a fresh job; prints one JSON
    line (every rank)."""
    import torch
    from torch.distributed.tensor import DTensor

    from trainer.model import hf
    from trainer.config.job_config import TrainConfig
    from trainer.data.loader import default_data_dir
    from trainer.step.process_group import setup_distributed
    from trainer.step.train_step import build_model

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
    # DTensors on several ranks; plain tensors on one CPU process (trainer.model.parallelize.needs_fsdp)
    local = sum((p.to_local() if isinstance(p, DTensor) else p).numel() * p.element_size() for p in params)
    full = sum(p.numel() * p.element_size() for p in params)
    print_json_line(
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
    print_json_line(
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
    )


def worker_build(model_dir: str, spec: dict) -> None:
    """Save a randomly initialised Llama of ``spec``'s shape in bf16 (as tests/hf_model_assets.py does)."""
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=spec["vocab"],
        hidden_size=spec["hidden"],
        intermediate_size=spec["ffn"],
        num_hidden_layers=spec["layers"],
        num_attention_heads=spec["heads"],
        num_key_value_heads=spec["kv_heads"],
        max_position_embeddings=2048,
        tie_word_embeddings=spec["tie"],
        rms_norm_eps=1e-5,
    )
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # built in the dtype it is saved in: half the memory
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(model_dir, safe_serialization=True, max_shard_size=spec["max_shard_size"])
