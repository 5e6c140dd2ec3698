"""What the trainer reports: one JSON line per event on rank 0's stdout, and statsd gauges.

Events (each a single line starting with "{"):

    {"event": "train", "step", "loss", "grad_norm", "lr", "tokens_per_s", "mfu", "peak_mem_mb"}
    {"event": "checkpoint", "step", "seconds", "path", "reason"}   reason: interval|final|preemption|checkpoint-now
    {"event": "resume", "from_step", "path"}
    {"event": "preempted", "step", "seconds_to_save", "grace_period_s"}
    {"event": "done", "step", "loss", "tokens_seen"}

"mfu" is null where the accelerator's peak FLOP/s is unknown (CPU).
"""

import json
import math
import resource
import socket
import sys
import time

import torch

from trainer.config import MetricsConfig
from trainer.model import ModelArgs

# Dense bf16 peak FLOP/s by device-name substring, for MFU.
_PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12}


def flops_per_token(args: ModelArgs, n_params_no_embedding: int, seq_len: int) -> float:
    """Training FLOPs per token: 6N for the matmuls (forward + backward) plus attention's
    12 * layers * dim * seq (PaLM appendix B)."""
    return 6 * n_params_no_embedding + 12 * args.n_layers * args.dim * seq_len


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in _PEAK_FLOPS.items() if k in name), None)


def peak_mem_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _finite_or_none(v):
    return v if not isinstance(v, float) or math.isfinite(v) else None


class Metrics:
    def __init__(self, cfg: MetricsConfig, *, is_rank0: bool, world_size: int, device: torch.device,
                 flops_per_token: float):
        self.cfg, self.is_rank0, self.device = cfg, is_rank0, device
        self.world_size = world_size
        self.flops_per_token = flops_per_token
        self.peak = peak_flops(device)
        self._sock = None
        if is_rank0 and cfg.statsd_host:
            self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._window_start, self._window_tokens = time.perf_counter(), 0

    def emit(self, event: str, **fields) -> None:
        """Print one JSON line (rank 0 only)."""
        if not self.is_rank0:
            return
        line = json.dumps({"event": event, **{k: _finite_or_none(v) for k, v in fields.items()}})
        print(line, file=sys.stdout, flush=True)

    def gauge(self, name: str, value: float, kind: str = "g") -> None:
        if self._sock is None or value is None:
            return
        payload = f"{self.cfg.statsd_prefix}.{name}:{value}|{kind}".encode()
        try:
            self._sock.sendto(payload, (self.cfg.statsd_host, self.cfg.statsd_port))
        except OSError:
            pass  # metrics must never stop training

    def start_window(self) -> None:
        """Start timing throughput from now (call when the training loop starts)."""
        self._window_start, self._window_tokens = time.perf_counter(), 0

    def count_tokens(self, n: int) -> None:
        self._window_tokens += n

    def log_step(self, *, step: int, loss: float, grad_norm: float, lr: float, force: bool) -> None:
        """Every log_every steps (or when forced): the train event and its gauges, averaged over the window."""
        if not (force or step % self.cfg.log_every == 0):
            return
        elapsed = time.perf_counter() - self._window_start
        tokens_per_s = self._window_tokens / elapsed if elapsed > 0 else 0.0
        mfu = None
        if self.peak:
            mfu = tokens_per_s * self.flops_per_token / (self.peak * self.world_size)
        fields = {
            "step": step, "loss": round(loss, 6), "grad_norm": round(grad_norm, 6), "lr": lr,
            "tokens_per_s": round(tokens_per_s, 1), "mfu": None if mfu is None else round(mfu, 4),
            "peak_mem_mb": round(peak_mem_mb(self.device), 1),
        }
        self.emit("train", **fields)
        for name in ("step", "loss", "grad_norm", "lr", "tokens_per_s", "mfu", "peak_mem_mb"):
            self.gauge(name, fields[name])
        self._window_start, self._window_tokens = time.perf_counter(), 0

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
