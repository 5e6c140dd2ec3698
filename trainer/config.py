"""Training job configuration: what the trainer runs, validated before anything starts.

This module is imported by the Airflow provider at DAG-parse time to validate job
specs, so it must stay standard-library only: no torch, no numpy, not even lazily
at module level.

Exit codes of ``python -m trainer`` (and of ``python -m trainer.launch`` per node):

* ``0`` -- every step ran; the final checkpoint (if a checkpoint URI is set) is committed.
* ``2`` -- the configuration is invalid; nothing was trained.
* ``PREEMPTED_EXIT_CODE`` (75, ``EX_TEMPFAIL`` from sysexits.h) -- the job was asked
  to stop (SIGTERM/SIGINT), saved a checkpoint of the step it had reached and can be
  resumed by starting it again with the same checkpoint URI.
* anything else -- a failure (non-finite loss, crash); retrying may not help.
"""

import dataclasses
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

PREEMPTED_EXIT_CODE = 75
"""Exit status meaning "preempted, resumable" (EX_TEMPFAIL): a checkpoint of the current step was saved."""

# Model shapes. "debug" is a few million parameters so that every test can run on
# CPU under torchrun in seconds; the llama3 flavours are the published shapes
# (Llama 3.2 1B/3B, Llama 3.1 8B) so that an exported checkpoint loads in transformers.
FLAVORS: dict[str, dict] = {
    "debug": {
        "dim": 256,
        "n_layers": 4,
        "n_heads": 4,
        "n_kv_heads": 2,
        "ffn_dim": 768,
        "vocab_size": 256,  # byte-level tokens: the built-in corpus needs no tokenizer
        "norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "tie_word_embeddings": False,
    },
    "llama3_1b": {
        "dim": 2048,
        "n_layers": 16,
        "n_heads": 32,
        "n_kv_heads": 8,
        "ffn_dim": 8192,
        "vocab_size": 128256,
        "norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "tie_word_embeddings": True,
    },
    "llama3_3b": {
        "dim": 3072,
        "n_layers": 28,
        "n_heads": 24,
        "n_kv_heads": 8,
        "ffn_dim": 8192,
        "vocab_size": 128256,
        "norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "tie_word_embeddings": True,
    },
    "llama3_8b": {
        "dim": 4096,
        "n_layers": 32,
        "n_heads": 32,
        "n_kv_heads": 8,
        "ffn_dim": 14336,
        "vocab_size": 128256,
        "norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "tie_word_embeddings": False,
    },
}

# An S3 bucket name: 3-63 lowercase letters, digits, dots and hyphens.
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")


class ConfigError(ValueError):
    """An invalid job configuration. The message always names the dotted field and the bad value."""


# --------------------------------------------------------------------------- helpers


def _name(section: str, name: str) -> str:
    return f"{section}.{name}" if section else name


def _check_types(obj: Any, section: str) -> None:
    """Reject values of the wrong type; ints are accepted (and stored) as floats for float fields.

    bool is a subclass of int in Python, but ``steps = true`` is a mistake, not 1 step.
    """
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        where = _name(section, f.name)
        if f.type is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{where}: expected an integer, got {value!r}")
        elif f.type is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{where}: expected a number, got {value!r}")
            if not math.isfinite(value):
                raise ConfigError(f"{where}: must be finite, got {value!r}")
            object.__setattr__(obj, f.name, float(value))  # frozen: bypass to normalise 1 -> 1.0
        elif f.type is str:
            if not isinstance(value, str):
                raise ConfigError(f"{where}: expected a string, got {value!r}")
        elif f.type is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"{where}: expected true or false, got {value!r}")
        elif dataclasses.is_dataclass(f.type):
            if not isinstance(value, f.type):
                raise ConfigError(f"{where}: expected a {f.type.__name__}, got {value!r}")


def _require(ok: bool, section: str, name: str, value: Any, rule: str) -> None:
    if not ok:
        raise ConfigError(f"{_name(section, name)}: {rule}, got {value!r}")


def _check_uri(uri: str) -> None:
    """Accept "", a local path, file://<path> or s3://<bucket>[/<prefix>]."""
    if uri == "" or "://" not in uri:
        return
    scheme, _, rest = uri.partition("://")
    if scheme == "file":
        if not rest:
            raise ConfigError(f"checkpoint.uri: file:// URI has no path, got {uri!r}")
        return
    if scheme == "s3":
        bucket = rest.split("/", 1)[0]
        if not _S3_BUCKET.match(bucket):
            raise ConfigError(f"checkpoint.uri: s3 URI needs a valid bucket (s3://bucket/prefix), got {uri!r}")
        return
    raise ConfigError(
        f"checkpoint.uri: unsupported scheme {scheme + '://'!r} (use a local path, file:// or s3://), got {uri!r}"
    )


# --------------------------------------------------------------------------- sections


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Which model to train."""

    _section = "model"

    flavor: str = "debug"
    """A key of FLAVORS: "debug" for tests on CPU, or a real llama3 shape."""

    def __post_init__(self) -> None:
        _check_types(self, self._section)
        if self.flavor not in FLAVORS:
            raise ConfigError(
                f"model.flavor: unknown flavour {self.flavor!r} (choose from {', '.join(FLAVORS)})"
            )


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where the tokens come from."""

    _section = "data"

    dataset: str = "builtin"
    """"builtin" (a generated byte-level corpus, no download) or a directory written by
    ``python -m trainer.prepare_data``."""

    seq_len: int = 128
    """Tokens per training sequence."""

    def __post_init__(self) -> None:
        _check_types(self, self._section)
        _require(self.dataset != "", self._section, "dataset", self.dataset, 'must be "builtin" or a directory')
        _require(self.seq_len >= 8, self._section, "seq_len", self.seq_len, "must be >= 8")


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """AdamW with linear warmup then cosine decay."""

    _section = "optim"

    lr: float = 3e-3
    """Peak learning rate, reached at the end of warmup."""

    weight_decay: float = 0.1
    """Decoupled (AdamW) weight decay."""

    beta1: float = 0.9
    """Adam first-moment decay."""

    beta2: float = 0.95
    """Adam second-moment decay."""

    eps: float = 1e-8
    """Adam denominator epsilon."""

    grad_clip: float = 1.0
    """Max global gradient norm; 0 disables clipping (the norm is still computed and logged)."""

    warmup_steps: int = 10
    """Steps of linear warmup from ~0 to lr. It may exceed `steps` (then lr never peaks)."""

    min_lr_ratio: float = 0.1
    """The cosine decay ends at lr * min_lr_ratio on the last step."""

    def __post_init__(self) -> None:
        s = self._section
        _check_types(self, s)
        _require(self.lr > 0, s, "lr", self.lr, "must be > 0")
        _require(self.weight_decay >= 0, s, "weight_decay", self.weight_decay, "must be >= 0")
        _require(0 <= self.beta1 < 1, s, "beta1", self.beta1, "must be in [0, 1)")
        _require(0 <= self.beta2 < 1, s, "beta2", self.beta2, "must be in [0, 1)")
        _require(self.eps > 0, s, "eps", self.eps, "must be > 0")
        _require(self.grad_clip >= 0, s, "grad_clip", self.grad_clip, "must be >= 0 (0 = no clipping)")
        _require(self.warmup_steps >= 0, s, "warmup_steps", self.warmup_steps, "must be >= 0")
        _require(0 <= self.min_lr_ratio <= 1, s, "min_lr_ratio", self.min_lr_ratio, "must be in [0, 1]")


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Where and how often to save resumable checkpoints."""

    _section = "checkpoint"

    uri: str = ""
    """Local path, file://path or s3://bucket/prefix; "" disables checkpoints (and resume)."""

    every: int = 0
    """Save every N steps; 0 = only at the end, on preemption and on SIGUSR1."""

    keep: int = 3
    """Retention: keep the last K committed checkpoints."""

    grace_period_s: float = 110.0
    """Seconds the platform allows between SIGTERM and SIGKILL; a preemption save that
    takes longer is reported as a warning (the next attempt would lose those steps)."""

    async_save: bool = True
    """Interval and SIGUSR1 saves block training only for the copy to host memory; the
    write, checksums, upload and commit run in the background. The final and the
    preemption saves are always synchronous (nothing is left to overlap them with)."""

    def __post_init__(self) -> None:
        s = self._section
        _check_types(self, s)
        _check_uri(self.uri)
        _require(self.every >= 0, s, "every", self.every, "must be >= 0 (0 = only final/preemption)")
        _require(self.keep >= 1, s, "keep", self.keep, "must be >= 1")
        _require(self.grace_period_s > 0, s, "grace_period_s", self.grace_period_s, "must be > 0")


CAPACITY_TYPES = ("spot", "on_demand", "local")


@dataclass(frozen=True, kw_only=True)
class CostConfig:
    """What the job's nodes cost: the ledger every checkpoint manifest carries."""

    _section = "cost"

    price_per_node_hour: float = 0.0
    """Dollars per node-hour of the capacity this attempt runs on (0: not billed)."""

    capacity_type: str = "local"
    """One of "spot", "on_demand", "local": the ledger bucket this attempt's node-hours go to."""

    gpus_per_node: int = 0
    """GPUs per node, for gpu_hours (0 on CPU)."""

    def __post_init__(self) -> None:
        s = self._section
        _check_types(self, s)
        _require(self.price_per_node_hour >= 0, s, "price_per_node_hour", self.price_per_node_hour, "must be >= 0")
        _require(self.capacity_type in CAPACITY_TYPES, s, "capacity_type", self.capacity_type,
                 f"must be one of {', '.join(CAPACITY_TYPES)}")
        _require(self.gpus_per_node >= 0, s, "gpus_per_node", self.gpus_per_node, "must be >= 0")


@dataclass(frozen=True, kw_only=True)
class MetricsConfig:
    """Stdout JSON lines and optional statsd gauges."""

    _section = "metrics"

    log_every: int = 10
    """Emit a "train" JSON line every N steps (and at the last step)."""

    statsd_host: str = ""
    """statsd host to send gauges to over UDP; "" = statsd off."""

    statsd_port: int = 8125
    """statsd UDP port."""

    statsd_prefix: str = "dtrain"
    """Prefix of every statsd metric name."""

    def __post_init__(self) -> None:
        s = self._section
        _check_types(self, s)
        _require(self.log_every >= 1, s, "log_every", self.log_every, "must be >= 1")
        _require(1 <= self.statsd_port <= 65535, s, "statsd_port", self.statsd_port, "must be in 1..65535")
        _require(
            re.fullmatch(r"[A-Za-z0-9_.\-]*", self.statsd_prefix) is not None,
            s, "statsd_prefix", self.statsd_prefix, "may only hold letters, digits, '_', '.', '-'",
        )


ACTIVATION_CHECKPOINTING = ("none", "selective", "full")


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """How the model is laid out on the devices: sharding, recomputation, compilation, offload."""

    _section = "parallel"

    replicate_degree: int = 1
    """1 = FSDP: every parameter sharded over all ranks. R > 1 = HSDP: R replica groups of
    world_size / R ranks each; parameters are sharded inside a group and replicated across
    groups, so the per-layer all-gathers stay inside a group and only the gradient
    all-reduce crosses groups. Set R to the number of nodes, or 0 for exactly that
    (world_size / LOCAL_WORLD_SIZE, read from torchrun's environment)."""

    activation_checkpointing: str = "none"
    """"none", "selective" or "full" (recompute every block's activations in backward:
    least memory, about one extra forward of compute)."""

    selective_ac_every: int = 0
    """With activation_checkpointing = "selective": 0 = op-level (each block keeps the
    outputs of its attention and of every other matmul, and recomputes the rest);
    N >= 1 = checkpoint every N-th whole block (2 = every other block)."""

    compile: bool = False
    """torch.compile each transformer block (one compiled graph reused by every layer).
    Costs compile time at start-up; on GPUs it fuses the norms, rotary and SwiGLU pointwise ops."""

    cpu_offload: bool = False
    """Keep the sharded parameters, gradients and optimizer state in host memory
    (FSDP2 CPUOffloadPolicy); the optimizer step runs on the CPU. For models that do not
    fit otherwise; much slower. No effect when training on CPU."""

    auto_micro_batch_size: bool = False
    """Before training, find the largest micro_batch_size that fits in GPU memory (a
    divisor of global_batch_size / world size, probed with a forward and backward pass)
    and use it instead of micro_batch_size; gradient accumulation absorbs the rest.
    Skipped, with a message, on CPU."""

    def __post_init__(self) -> None:
        s = self._section
        _check_types(self, s)
        _require(self.replicate_degree >= 0, s, "replicate_degree", self.replicate_degree,
                 "must be >= 0 (1 = FSDP, R > 1 = HSDP with R replica groups, 0 = one group per node)")
        _require(self.activation_checkpointing in ACTIVATION_CHECKPOINTING, s, "activation_checkpointing",
                 self.activation_checkpointing, f"must be one of {', '.join(ACTIVATION_CHECKPOINTING)}")
        _require(self.selective_ac_every >= 0, s, "selective_ac_every", self.selective_ac_every,
                 "must be >= 0 (0 = op-level, N = every N-th block)")


# --------------------------------------------------------------------------- the job


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """A complete training job. Construct it, from_dict() it or from_file() it: all validate."""

    _section = ""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Model shape."""

    data: DataConfig = field(default_factory=DataConfig)
    """Token source and sequence length."""

    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and learning-rate schedule."""

    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoint location, interval and retention."""

    cost: CostConfig = field(default_factory=CostConfig)
    """Price and capacity type of the nodes, for the cost ledger in checkpoint manifests."""

    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    """Logging and statsd."""

    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """FSDP/HSDP layout, activation checkpointing, compile, offload, auto micro-batch size."""

    steps: int = 50
    """Optimizer steps to train for in total (a resumed run continues up to this)."""

    global_batch_size: int = 8
    """Sequences per optimizer step across all ranks."""

    micro_batch_size: int = 2
    """Sequences per rank per forward/backward; the rest is gradient accumulation."""

    seed: int = 0
    """Seeds weights and data order; the same seed and config give the same run."""

    simulate_preemption_at_step: int = 0
    """0 = off. k > 0: after step k, rank 0 sends SIGTERM to its torchrun agent (or to
    itself when not under torchrun), exercising the real preemption path once; a run
    resumed from a checkpoint at step >= k does not do it again."""

    def __post_init__(self) -> None:
        _check_types(self, "")
        _require(self.steps >= 1, "", "steps", self.steps, "must be >= 1")
        _require(self.global_batch_size >= 1, "", "global_batch_size", self.global_batch_size, "must be >= 1")
        _require(self.micro_batch_size >= 1, "", "micro_batch_size", self.micro_batch_size, "must be >= 1")
        _require(0 <= self.seed < 2**32, "", "seed", self.seed, "must be in [0, 2**32)")
        _require(
            0 <= self.simulate_preemption_at_step < self.steps,
            "", "simulate_preemption_at_step", self.simulate_preemption_at_step,
            f"must be in [0, steps={self.steps}) (0 = off)",
        )
        if self.global_batch_size % self.micro_batch_size:
            raise ConfigError(
                f"global_batch_size: {self.global_batch_size} is not divisible by "
                f"micro_batch_size {self.micro_batch_size}"
            )

    # ------------------------------------------------------------------ world size

    def validate_world_size(self, world_size: int) -> None:
        """Raise ConfigError unless the global batch splits evenly into micro-batches on every rank."""
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ConfigError(f"world_size: must be a positive integer, got {world_size!r}")
        if self.global_batch_size % (world_size * self.micro_batch_size):
            raise ConfigError(
                f"global_batch_size {self.global_batch_size} is not divisible by "
                f"world size {world_size} × micro_batch_size {self.micro_batch_size}"
            )
        replicate = self.parallel.replicate_degree
        if replicate > 1 and world_size % replicate:
            raise ConfigError(
                f"parallel.replicate_degree: {replicate} replica groups do not divide world size {world_size}"
            )

    def grad_accum_steps(self, world_size: int) -> int:
        """Micro-steps per optimizer step on each rank."""
        self.validate_world_size(world_size)
        return self.global_batch_size // (world_size * self.micro_batch_size)

    # ------------------------------------------------------------------ (de)serialisation

    def to_dict(self) -> dict:
        """Nested plain dict of JSON-able values; from_dict(to_dict()) == self."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        """Strict: unknown keys and wrongly typed values raise ConfigError naming the dotted key."""
        return _build(cls, d, "")

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "TrainConfig":
        """Load a .json or .toml file (same structure as to_dict())."""
        path = os.fspath(path)
        suffix = os.path.splitext(path)[1].lower()
        if suffix not in (".json", ".toml"):
            raise ConfigError(f"config file: expected a .json or .toml file, got {path!r}")
        try:
            if suffix == ".json":
                with open(path, encoding="utf-8") as f:
                    data = json.load(f)
            else:
                import tomllib

                with open(path, "rb") as f:
                    data = tomllib.load(f)
        except OSError as e:
            raise ConfigError(f"config file: cannot read {path!r}: {e.strerror}") from e
        except ValueError as e:  # json.JSONDecodeError and tomllib.TOMLDecodeError
            raise ConfigError(f"config file: {path!r} is not valid {suffix[1:].upper()}: {e}") from e
        return cls.from_dict(data)

    def with_overrides(self, overrides: dict[str, object]) -> "TrainConfig":
        """A copy with dotted-path overrides applied, e.g. {"model.flavor": "debug", "steps": 10}.

        String values for int/float fields are parsed ("10", "1e-3"), because overrides
        usually come from a command line or a templated Airflow field.
        """
        d = self.to_dict()
        for key, value in overrides.items():
            if not isinstance(key, str) or not key:
                raise ConfigError(f"override key must be a dotted field name, got {key!r}")
            *parents, leaf = key.split(".")
            node, klass = d, type(self)
            for part in parents:
                sub = _field_types(klass).get(part)
                if sub is None or not dataclasses.is_dataclass(sub):
                    raise ConfigError(f"{key}: unknown key {part!r} in {_section_label(klass)}")
                node, klass = node[part], sub
            ftype = _field_types(klass).get(leaf)
            if ftype is None:
                raise ConfigError(
                    f"{key}: unknown key {leaf!r} in {_section_label(klass)} "
                    f"(known: {', '.join(_field_types(klass))})"
                )
            if dataclasses.is_dataclass(ftype):
                raise ConfigError(f"{key}: is a section; override its fields, e.g. '{key}.<field>'")
            node[leaf] = _coerce(key, ftype, value)
        return type(self).from_dict(d)

    def config_hash(self) -> str:
        """Stable sha256 of the canonical JSON of to_dict(); recorded in checkpoint manifests."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


# --------------------------------------------------------------------------- from_dict internals


def _field_types(klass: type) -> dict[str, type]:
    return {f.name: f.type for f in dataclasses.fields(klass)}


def _section_label(klass: type) -> str:
    return f"section {klass._section!r}" if klass._section else "the top level"


def _build(klass: type, d: Any, section: str) -> Any:
    if not isinstance(d, dict):
        raise ConfigError(f"{section or 'config'}: expected a table/dict, got {d!r}")
    types = _field_types(klass)
    kwargs = {}
    for key, value in d.items():
        where = _name(section, str(key))
        if key not in types:
            raise ConfigError(f"{where}: unknown key (known in {_section_label(klass)}: {', '.join(types)})")
        if dataclasses.is_dataclass(types[key]):
            value = _build(types[key], value, where)
        kwargs[key] = value
    return klass(**kwargs)


def _coerce(key: str, ftype: type, value: object) -> object:
    if not isinstance(value, str) or ftype is str:
        return value
    try:
        if ftype is int:
            return int(value)
        if ftype is float:
            return float(value)
        if ftype is bool:
            if value.strip().lower() not in ("true", "false"):
                raise ValueError
            return value.strip().lower() == "true"
    except ValueError:
        kind = {int: "an integer", float: "a number", bool: "true or false"}[ftype]
        raise ConfigError(f"{key}: expected {kind}, got {value!r}") from None
    return value
