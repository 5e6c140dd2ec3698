"""What the trainer reports: one JSON line per event of rank 0, and statsd gauges.

Events (each a single line starting with "{") go to rank 0's events file, ``$DTRAIN_EVENTS_DIR/rank-0.jsonl``
(``trainer/events.py``: line-atomic, what readers read), and to its stdout for people and pod logs:

    {"event": "train", "step", "loss", "grad_norm", "lr", "tokens_per_s", "mfu", "peak_mem_mb",
                       ["gpu_utilization_pct", "gpu_memory_used_mb", "gpu_power_w", "gpu_temperature_c"]}
    {"event": "checkpoint", "step", "seconds", "path", "reason", "blocked_s", "async", "overlap_s",
                            "overlap_steps", "cost_s", "waited_s"}
                       reason: interval|final|preemption|checkpoint-now; async: written in the background;
                       what the save cost training (SaveOverlap): blocked_s, the time the loop stood still
                       (waited_s of it waiting for the previous save to commit), overlap_s, how much longer
                       the overlap_steps steps run while it was in flight took than quiet steps (null: no
                       quiet step to compare with yet), and cost_s, their sum
    {"event": "resume", "from_step", "path"}
    {"event": "preempted", "step", "seconds_to_save", "grace_period_s"}
    {"event": "done", "step", "loss", "tokens_seen"}
    {"event": "world", "step", "world_size", "nodes", "procs_per_node", "restart"}   (each attempt's start:
                       an elastic group's size after a resize)
    {"event": "startup", "step", "imports_s", "process_group_s", "build_s", "load_s", "first_step_s",
                         "total_s", "started_at", "graphs_compiled"}   (once the first step of each start
                       is done: where the start went, trainer/elastic/startup.py)

"train" values are over the log interval: tokens_per_s for the whole group, "mfu" null
where the accelerator's peak FLOP/s is unknown (CPU), peak_mem_mb this rank's peak (CUDA
allocator, else the process's max RSS). The gpu_* fields are rank 0's GPU as NVML sees it;
they are absent (not null) without a GPU or without a working NVML.

statsd: the same values as gauges named ``<metrics.statsd_prefix>.<name>`` for each name of
TRAINING_METRICS, every one tagged with ``metrics.statsd_tags`` (DogStatsD, trainer/base/statsd.py: the
operator puts the task instance and the job there). The group's series are sent by rank 0; the
per-rank ones (PER_RANK_METRICS: memory and the GPU's readings) by every rank, tagged ``node`` and
``rank`` too. Units are in the names: bytes, seconds, dollars. This module imports no torch at
module level, so the Airflow side (dashboards, tests) can import TRAINING_METRICS cheaply.
"""

from __future__ import annotations

import math
import os
import resource
import time
from collections import deque
from typing import TYPE_CHECKING

from trainer.config.sections import MetricsConfig
from trainer.events import EventLog
from trainer.base.say import say
from trainer.base.statsd import RANK_TAGS, RUN_TAGS, UNKNOWN, Sender, parse_tags

if TYPE_CHECKING:
    import torch

    from trainer.model.llama import ModelArgs

TRAINING_METRICS: tuple[str, ...] = (
    "train.loss",  # mean loss of the global batch at the logged step
    "train.grad_norm",  # global gradient norm before clipping
    "train.lr",  # learning rate the logged step used
    "train.tokens_per_s",  # tokens per second of the whole group over the interval
    "train.mfu",  # model FLOPs utilisation, 0..1 (GPUs with a known peak only)
    "train.step",  # the logged step
    "train.peak_memory_bytes",  # per rank: peak memory (CUDA allocator, else max RSS), bytes
    "startup.seconds",  # the last start of rank 0: its process's start to its first step, seconds
    "gpu.utilization_pct",  # per rank, NVML: % of time a kernel ran on the rank's GPU
    "gpu.memory_used_bytes",  # per rank, NVML: used device memory, bytes (all processes)
    "gpu.power_w",  # per rank, NVML: board power draw, W
    "gpu.temperature_c",  # per rank, NVML: GPU core temperature, °C
    "checkpoint.seconds",  # wall time of the last checkpoint save
    "checkpoint.blocked_seconds",  # of which training was held up (async: the copy to host memory)
    "checkpoint.overlap_seconds",  # async: how much longer the steps run while it was in flight took
    "checkpoint.cost_seconds",  # what the save cost training in all: blocked + overlap seconds
    "cost.dollars",  # the job's spend over all attempts (the provider sends the same series)
    "cost.gpu_hours",  # the job's GPU-hours over all attempts
    "cost.budget_dollars",  # the job's dollar cap (cost.budget_usd), when it has one
)
"""Every statsd metric the trainer emits, relative to the prefix: the full name is
``f"{prefix}.{name}"`` (prefix "dtrain" by default: ``dtrain.train.loss``). All are gauges."""
PER_RANK_METRICS: frozenset[str] = frozenset(
    {
        "train.peak_memory_bytes",
        "gpu.utilization_pct",
        "gpu.memory_used_bytes",
        "gpu.power_w",
        "gpu.temperature_c",
    }
)
"""The series every rank sends for itself, tagged ``node`` and ``rank`` too (the rest: rank 0, for the
group)."""

# Dense (no 2:4 sparsity) bf16 tensor-core peak per GPU, by device-name substring; the first
# match wins, so specific names come before the families that contain them. Sources: NVIDIA
# datasheets, whose headline figures are "with sparsity", halved here:
#   H100 SXM / H200 (SXM) / GH200: 1,979 TFLOPS sparse -> 989 dense (H100, H200 datasheets)
#   H100 PCIe: 1,513 sparse -> 756;  H100 NVL: 1,671 sparse -> 835 (H100 datasheet)
#   A100 (SXM and PCIe): 312 dense (A100 datasheet)
#   H200 NVL: 1,671 sparse -> 835 (H200 datasheet);  B200: 4.5 PFLOPS sparse -> 2,250 (HGX B200)
#   L40S: 362 dense, 733 sparse (L40S datasheet);  L4: 242 sparse -> 121 (L4 datasheet)
#   A10 / A10G: 250 sparse -> 125 (A10 datasheet; AWS's A10G is quoted at the same tensor peak)
# Boost clocks are assumed: a GPU held at lower clocks by its power limit shows a lower MFU.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),
    ("H200 NVL", 835e12),
    ("GH200", 989e12),
    ("H200", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10", 125e12),
)


def flops_per_token(args: ModelArgs, n_params_no_embedding: int, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward), PaLM appendix B's count:

    * 6 N for the matmuls, N = every weight used in a matmul: all parameters except the
      input embedding, which is a lookup. A tied output projection is added back: it is a
      vocab × dim matmul even though it shares the embedding's storage;
    * 12 · layers · dim · seq for attention's scores and weighted sum, not halved for the
      causal mask (as PaLM and torchtitan count it, so MFU figures compare with theirs).
    """
    n = n_params_no_embedding + (args.vocab_size * args.dim if args.tie_word_embeddings else 0)
    return 6 * n + 12 * args.n_layers * args.dim * seq_len


def peak_flops(device: torch.device) -> tuple[str, float] | None:
    """(device name, dense bf16 peak FLOP/s) of a known GPU; None on CPU or an unknown GPU."""
    if device.type != "cuda":
        return None
    import torch

    name = torch.cuda.get_device_name(device)
    return next(((name, v) for k, v in PEAK_BF16_FLOPS if k in name), None)


def peak_mem_mb(device: torch.device) -> float:
    if device.type == "cuda":
        import torch

        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


class GpuTelemetry:
    """NVML readings of one GPU; read() returns {} when there is no GPU or NVML fails, ever."""

    def __init__(self, device: torch.device):
        self._nvml = self._handle = None
        if device.type != "cuda":
            return
        try:
            import pynvml  # nvidia-ml-py
            import torch

            pynvml.nvmlInit()
            # By UUID: CUDA_VISIBLE_DEVICES renumbers devices for CUDA but not for NVML.
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
            except pynvml.NVMLError:
                handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            self._nvml, self._handle = pynvml, handle
        except Exception:  # no driver, no library, a container without NVML: telemetry is optional
            self._nvml = self._handle = None

    def read(self) -> dict[str, float]:
        if self._handle is None:
            return {}
        nvml, h, out = self._nvml, self._handle, {}
        readers = {
            "gpu_utilization_pct": lambda: nvml.nvmlDeviceGetUtilizationRates(h).gpu,
            "gpu_memory_used_mb": lambda: round(nvml.nvmlDeviceGetMemoryInfo(h).used / 2**20, 1),
            "gpu_power_w": lambda: round(nvml.nvmlDeviceGetPowerUsage(h) / 1000, 1),  # mW
            "gpu_temperature_c": lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
        }
        for key, reader in readers.items():
            try:
                out[key] = reader()
            except Exception:  # e.g. power readings unsupported on this board: leave that one out
                pass
        return out


def _finite_or_none(v):
    return v if not isinstance(v, float) or math.isfinite(v) else None


_GPU_GAUGES = {  # GpuTelemetry's key -> (gauge, factor to the gauge's unit)
    "gpu_utilization_pct": ("gpu.utilization_pct", 1),
    "gpu_memory_used_mb": ("gpu.memory_used_bytes", 2**20),
    "gpu_power_w": ("gpu.power_w", 1),
    "gpu_temperature_c": ("gpu.temperature_c", 1),
}


class SaveOverlap:
    """What each save cost training, an async save's overlapped steps included.

    An async save blocks the loop only for its call and for the copy to host memory (blocked_s); the
    copy, the write and the hashing then share the device, the PCIe link and the host's cores with the
    steps that run meanwhile. On a GPU most of a save's cost falls there (benchmarks/RESULTS.md, "The async
    save on a GPU": 0.014 s blocked, 5-7 s on the next step). So each step's wall time, between the ends
    of two steps (a save's call and its wait for the copy fall in the step after it), is compared with the
    mean of the last ``window`` quiet steps: no save in flight, not the first step of an attempt (warm-up,
    compilation), not the step that ran a synchronous save. A save's excess is the sum over the steps from
    its call to its commit, less its blocked time (counted there already): overlap_s, clamped at 0. The mean,
    not the median: the logged steps are a little longer, and a median would count that as overlap.
    """

    def __init__(self, window: int = 32):
        self._quiet: deque[float] = deque(maxlen=window)
        self._open: dict[int, list] = {}  # step saved in the background -> [excess s, steps, reference known]
        self._skip_next = True  # the first step of an attempt

    def reference(self) -> float | None:
        """Mean seconds of a quiet step (None before there is one)."""
        return sum(self._quiet) / len(self._quiet) if self._quiet else None

    def step(self, seconds: float) -> None:
        """One step's wall time."""
        if self._open:
            ref = self.reference()
            for acc in self._open.values():
                acc[0] += seconds - (ref or 0.0)
                acc[1] += 1
                acc[2] = acc[2] and ref is not None
        elif not self._skip_next:
            self._quiet.append(seconds)
        self._skip_next = False

    def saved(self, step: int, *, in_background: bool) -> None:
        """A save of ``step`` was called: its commit comes later (async), or the next step's time holds it."""
        if in_background:
            self._open[step] = [0.0, 0, True]
        else:
            self._skip_next = True

    def committed(self, step: int, blocked_s: float) -> dict:
        """{"overlap_s", "overlap_steps", "cost_s"} of the save of ``step``, now committed."""
        acc = self._open.pop(step, None)
        if acc is None:  # synchronous: the loop stood still for all of it
            return {"overlap_s": 0.0, "overlap_steps": 0, "cost_s": blocked_s}
        excess, steps, known = acc
        if not known:
            return {"overlap_s": None, "overlap_steps": steps, "cost_s": None}
        overlap = max(0.0, excess - blocked_s)
        return {"overlap_s": overlap, "overlap_steps": steps, "cost_s": blocked_s + overlap}


class Metrics:
    def __init__(
        self,
        cfg: MetricsConfig,
        *,
        is_rank0: bool,
        world_size: int,
        device: torch.device,
        flops_per_token: float,
        rank: int = 0,
    ):
        self.cfg, self.is_rank0, self.device = cfg, is_rank0, device
        self.world_size = world_size
        self.flops_per_token = flops_per_token
        peak = peak_flops(device)
        self.peak = peak[1] if peak else None
        self._sender = Sender(cfg.statsd_host, cfg.statsd_port) if cfg.statsd_host else None
        # rank 0's readings go into its JSON lines; every rank's into its own statsd series
        self.gpu = GpuTelemetry(device) if is_rank0 or self._sender is not None else None
        # the same keys on every line (one label set per metric), whatever the config names
        self.tags = {**dict.fromkeys(RUN_TAGS, UNKNOWN), **parse_tags(cfg.statsd_tags)}
        # torchrun's GROUP_RANK: the node's index in the group (rank = node x procs per node + local rank)
        self.rank_tags = {**self.tags, RANK_TAGS[0]: os.environ.get("GROUP_RANK", "0"),
                          RANK_TAGS[1]: str(0 if is_rank0 else rank)}  # fmt: skip
        if is_rank0 and device.type == "cuda":
            said = (
                f"{peak[0]}: {peak[1] / 1e12:.0f} TFLOP/s dense bf16 per GPU"
                if peak
                else f"{torch_device_name(device)}: peak unknown, mfu will be null"
            )
            say(
                f"[trainer] MFU = tokens/s × {flops_per_token / 1e9:.2f} GFLOP/token ÷ "
                f"(peak × {world_size} GPUs); peak of {said}",
            )
        self._window_start, self._window_tokens = time.perf_counter(), 0
        self._events: EventLog | None = None

    def emit(self, event: str, **fields) -> None:
        """One event (rank 0 only): a line of its events file and of stdout (``trainer/events.py``)."""
        if not self.is_rank0:
            return
        if self._events is None:
            self._events = EventLog.from_env()
        self._events.emit(event, **{k: _finite_or_none(v) for k, v in fields.items()})

    def gauge(self, name: str, value: float, kind: str = "g") -> None:
        """Send ``<prefix>.<name>``, tagged; name must be one of TRAINING_METRICS (one scheme, one list).
        A per-rank series goes from every rank with its node and rank; the group's from rank 0 only."""
        if name not in TRAINING_METRICS:
            raise ValueError(
                f"{name!r} is not in trainer.report.metrics.TRAINING_METRICS; add it there first"
            )
        if self._sender is None or value is None:
            return
        if name in PER_RANK_METRICS:
            self._sender.send(f"{self.cfg.statsd_prefix}.{name}", value, kind, self.rank_tags)
        elif self.is_rank0:
            self._sender.send(f"{self.cfg.statsd_prefix}.{name}", value, kind, self.tags)

    def start_window(self) -> None:
        """Start timing throughput from now (call when the training loop starts)."""
        self._window_start, self._window_tokens = time.perf_counter(), 0

    def count_tokens(self, n: int) -> None:
        self._window_tokens += n

    def log_step(self, *, step: int, loss: float, grad_norm: float, lr: float, force: bool) -> float | None:
        """Every log_every steps (or when forced): the train event and its gauges, averaged over the window;
        returns the window's tokens/s (None between logged steps)."""
        if not (force or step % self.cfg.log_every == 0):
            return None
        elapsed = time.perf_counter() - self._window_start
        tokens_per_s = self._window_tokens / elapsed if elapsed > 0 else 0.0
        mfu = None
        if self.peak:
            mfu = tokens_per_s * self.flops_per_token / (self.peak * self.world_size)
        peak_mb = peak_mem_mb(self.device)
        fields = {
            "step": step,
            "loss": round(loss, 6),
            "grad_norm": round(grad_norm, 6),
            "lr": lr,
            "tokens_per_s": round(tokens_per_s, 1),
            "mfu": None if mfu is None else round(mfu, 4),
            "peak_mem_mb": round(peak_mb, 1),
        }
        gpu = self.gpu.read() if self.gpu is not None else {}
        self.emit("train", **fields, **gpu)
        for name in ("step", "loss", "grad_norm", "lr", "tokens_per_s", "mfu"):
            self.gauge(f"train.{name}", fields[name])
        self.gauge("train.peak_memory_bytes", round(peak_mb * 2**20))
        for key, value in gpu.items():
            name, factor = _GPU_GAUGES[key]
            self.gauge(name, round(value * factor) if factor != 1 else value)
        self._window_start, self._window_tokens = time.perf_counter(), 0
        return tokens_per_s

    def close(self) -> None:
        if self._sender is not None:
            self._sender.close()
        if self._events is not None:
            self._events.close()


def torch_device_name(device: torch.device) -> str:
    import torch

    return torch.cuda.get_device_name(device)
