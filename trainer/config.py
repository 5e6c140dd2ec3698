"""Training job configuration: what the trainer runs, validated before anything starts.

Every field is declared once with ``trainer.fields.setting`` (default, help, bounds,
choices, operator argument, trigger-form section); validation, the trainer's command line,
the DAG's trigger form and the README's reference table are all derived from these
declarations. This module is imported by the Airflow provider at DAG-parse time, so it
stays standard-library only: no torch, no numpy, not even lazily at module level.

Exit codes of ``python -m trainer`` (and of ``python -m trainer.launch`` per node):

* ``0`` -- every step ran; the final checkpoint (if a checkpoint URI is set) is committed.
* ``2`` -- the configuration is invalid; nothing was trained.
* ``PREEMPTED_EXIT_CODE`` (75, ``EX_TEMPFAIL`` from sysexits.h) -- the job was asked
  to stop (SIGTERM/SIGINT), saved a checkpoint of the step it had reached and can be
  resumed by starting it again with the same checkpoint URI.
* ``WORKER_LOST_EXIT_CODE`` (76, from ``python -m trainer.launch``) -- a training process was killed by
  a signal (OOM killer, kill -9); resumable from the last committed checkpoint.
* ``BUDGET_EXIT_CODE`` (77) -- the job's dollar cap (``cost.budget_usd``) would have been passed before the
  next checkpoint: the current step was saved and the job stopped. Relaunching it spends past the cap.
* ``STORAGE_EXIT_CODE`` (74, ``EX_IOERR`` from sysexits.h) -- a checkpoint could not be written (a full
  disk, no permission, a read-only filesystem, S3 AccessDenied): the partial step directory was removed,
  the older checkpoints are intact, and the one line the trainer printed names the path and the cause.
  Never relaunched as is: a full disk does not fix itself; free space (or fix the permissions) and
  start the job again to resume from the last committed checkpoint.
* ``FENCED_EXIT_CODE`` (78) -- another group took over the checkpoint directory (a newer writer
  lease, see trainer/checkpoint_dir.py): this one stopped without committing; never relaunched.
* anything else -- a failure (non-finite loss, crash); retrying may not help.
"""

import dataclasses
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from trainer.capacity import Capacity
from trainer.fields import ConfigError, check, coerce, field_types, setting
from trainer.flavors import FLAVORS
from trainer.statsd import TAGS_PATTERN

__all__ = [
    "ACTIVATION_CHECKPOINTING", "FLAVORS", "BUDGET_EXIT_CODE", "FENCED_EXIT_CODE", "PREEMPTED_EXIT_CODE", "STORAGE_EXIT_CODE", "WORKER_LOST_EXIT_CODE", "CheckpointConfig", "ConfigError", "CostConfig",
    "DataConfig", "MetricsConfig", "ModelConfig", "OptimConfig", "ParallelConfig", "TrainConfig",
]  # fmt: skip

STORAGE_EXIT_CODE = 74
"""A checkpoint could not be written (EX_IOERR: ENOSPC, EACCES, EROFS, S3 AccessDenied): the older checkpoints are
intact; a failure, never a relaunch -- the same storage fails the same way until someone frees or fixes it."""
PREEMPTED_EXIT_CODE = 75
"""Exit status meaning "preempted, resumable" (EX_TEMPFAIL): a checkpoint of the current step was saved."""
WORKER_LOST_EXIT_CODE = 76
"""A node's exit status when a training process was killed by a signal (the OOM killer's or anyone's
SIGKILL): nothing was saved, the group can resume from its last committed checkpoint; relaunches for
this are bounded by the job's ``max_failures``."""
BUDGET_EXIT_CODE = 77
"""The job stopped at its dollar cap: the step it reached is saved; do not relaunch it."""
FENCED_EXIT_CODE = 78
"""Another group took over the checkpoint directory (its writer lease is newer than this group's): this
group stopped before committing anything more. A failure, never a relaunch: the newer group is the writer."""

# Trigger-form sections (airflow_dtrain.params): where a field is shown.
MODEL_AND_DATA = "Model & data"
CHECKPOINTS = "Checkpoints"
BUDGET_AND_SPOT = "Budget & spot"

# An S3 bucket name: 3-63 lowercase letters, digits, dots and hyphens.
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
JOB_PATTERN = r"^$|^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$"
"""A job name ("" = none): usable in a path, an object key and a Kubernetes label value."""
URI_PATTERN = r"^$|^/|^file://.+|^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?$"
"""What the trigger form accepts as a checkpoint URI (the trainer also takes relative paths)."""


def _check_uri(uri: str, name: str = "checkpoint.uri") -> None:
    """Accept "", a local path, file://<path> or s3://<bucket>[/<prefix>]; errors name the field ``name``."""
    if uri == "" or "://" not in uri:
        return
    scheme, _, rest = uri.partition("://")
    if scheme == "file":
        if not rest:
            raise ConfigError(f"{name}: file:// URI has no path, got {uri!r}")
        return
    if scheme == "s3":
        bucket = rest.split("/", 1)[0]
        if not _S3_BUCKET.match(bucket):
            raise ConfigError(f"{name}: s3 URI needs a valid bucket (s3://bucket/prefix), got {uri!r}")
        return
    raise ConfigError(
        f"{name}: unsupported scheme {scheme + '://'!r} (use a local path, file:// or s3://), got {uri!r}"
    )


# --------------------------------------------------------------------------- sections


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Which model to train."""

    _section = "model"

    flavor: str = setting(
        "debug", choices=tuple(FLAVORS), rule="flavour", arg="flavor", section=MODEL_AND_DATA, title="Model flavour",
        help='Model shape: "debug" (a few million parameters, for CPU tests) or a published Llama 3 shape.',
    )  # fmt: skip
    init_from: str = setting(
        "", arg="init_from", section=MODEL_AND_DATA, title="Initialise from (Hugging Face model)",
        help="A Hugging Face Llama model (config.json + safetensors) in a directory or under an s3:// prefix to "
        "continue pre-training from: its config.json gives the shape (flavor is then not used) and its weights "
        "the starting point. Used when the job has no checkpoint yet; a resumed job continues its checkpoint.",
    )  # fmt: skip

    def __post_init__(self) -> None:
        check(self, self._section)
        _check_uri(self.init_from, "model.init_from")


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where the tokens come from."""

    _section = "data"

    dataset: str = setting(
        "builtin", arg="dataset", section=MODEL_AND_DATA, title="Dataset", pattern=r".+", rule='must be "builtin", a directory or an s3:// store',
        help='"builtin" (a generated byte-level corpus, no download), or a token store written by '
        "python -m trainer.prepare_data: a directory, or s3://bucket/prefix (copied to a node-local "
        "cache under $DTRAIN_DATA_DIR first).",
    )  # fmt: skip
    seq_len: int = setting(
        128,
        ge=8,
        arg="seq_len",
        section=MODEL_AND_DATA,
        title="Sequence length",
        help="Tokens per training sequence.",
    )

    def __post_init__(self) -> None:
        check(self, self._section)


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """AdamW with linear warmup then cosine decay."""

    _section = "optim"

    lr: float = setting(
        3e-3,
        gt=0,
        arg="lr",
        section=MODEL_AND_DATA,
        title="Learning rate",
        help="Peak learning rate, reached at the end of warmup.",
    )
    weight_decay: float = setting(0.1, ge=0, arg="weight_decay", help="Decoupled (AdamW) weight decay.")
    beta1: float = setting(0.9, ge=0, lt=1, help="Adam first-moment decay.")
    beta2: float = setting(0.95, ge=0, lt=1, help="Adam second-moment decay.")
    eps: float = setting(1e-8, gt=0, help="Adam denominator epsilon.")
    grad_clip: float = setting(
        1.0,
        ge=0,
        rule="must be >= 0 (0 = no clipping)",
        arg="grad_clip",
        help="Max global gradient norm; 0 disables clipping (the norm is still logged).",
    )
    warmup_steps: int = setting(
        10,
        ge=0,
        arg="warmup_steps",
        help="Steps of linear warmup from ~0 to lr; may exceed steps (then lr never peaks).",
    )
    min_lr_ratio: float = setting(
        0.1, ge=0, le=1, help="The cosine decay ends at lr × min_lr_ratio on the last step."
    )

    def __post_init__(self) -> None:
        check(self, self._section)


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Where and how often to save resumable checkpoints."""

    _section = "checkpoint"

    uri: str = setting(
        "", arg="checkpoint_uri", section=CHECKPOINTS, title="Checkpoint URI",
        help='Local path, file://path or s3://bucket/prefix; "" disables checkpoints (and resume).',
    )  # fmt: skip
    every: int = setting(
        0,
        ge=0,
        rule="must be >= 0 (0 = only final/preemption)",
        arg="checkpoint_every",
        section=CHECKPOINTS,
        title="Checkpoint every N steps",
        help="Save every N steps; 0 = only at the end, on preemption and on SIGUSR1.",
    )
    keep: int = setting(
        3, ge=1, arg="checkpoint_keep", help="Retention: keep the last K committed checkpoints."
    )
    grace_period_s: float = setting(
        110.0, gt=0,
        help="Seconds the platform allows between SIGTERM and SIGKILL; a preemption save that takes longer "
        "is reported as a warning (the next attempt would lose those steps).",
    )  # fmt: skip
    async_save: bool | None = setting(
        None,
        help="Interval and SIGUSR1 saves block training only for the copy to host memory; the write, checksums, "
        "upload and commit run in the background. Final and preemption saves are always synchronous. Unset "
        "(auto): async where the model is on a GPU, synchronous on a CPU-only node, whose cores the background "
        "save would take from training (benchmarks/RESULTS.md: blocked + overlapped cost > a sync save there).",
    )  # fmt: skip
    write_threads: int = setting(
        4, ge=1, le=64,
        help="Files each rank writes in parallel per save (DCP's FileSystemWriter thread_count); each file is "
        "hashed in its own thread too.",
    )  # fmt: skip

    continue_job: str = setting(
        "", pattern=JOB_PATTERN,
        rule="must be 1-63 lowercase letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
        help="A run of one job refuses a directory holding another job's checkpoints; naming that job here "
        "continues it instead (resumes from and retires its checkpoints) under this run's job name.",
    )  # fmt: skip

    def __post_init__(self) -> None:
        check(self, self._section)
        _check_uri(self.uri)


@dataclass(frozen=True, kw_only=True)
class CostConfig:
    """What the job's nodes cost: the ledger every checkpoint manifest carries.

    Set by the provider from the group (``JobSpec``): its capacity, its price and its GPUs.
    """

    _section = "cost"

    price_per_node_hour: float = setting(
        0.0, ge=0, help="Dollars per node-hour of this attempt's capacity (0: not billed)."
    )
    capacity_type: Capacity = setting(Capacity.ANY, help="The ledger bucket this attempt's node-hours go to.")
    gpus_per_node: int = setting(0, ge=0, help="GPUs per node, for gpu_hours (0 on CPU).")
    budget_usd: float | None = setting(
        None, gt=0, arg="budget_usd", section=BUDGET_AND_SPOT, title="Budget (US$)",
        help="The job's dollar cap over every relaunch, retry, run and sweep member that shares its spend "
        "ledger (empty: none). The trainer saves and stops (exit 77) before its projected spend to the next "
        "check passes it.",
    )  # fmt: skip
    price_ceiling_per_node_hour: float = setting(
        0.0, ge=0,
        help="The most a node-hour of this attempt can cost (spot: the max price, else on-demand); the cap's "
        "projection uses it, so a spot price rising during the run cannot carry the spend past the cap. "
        "0: price_per_node_hour.",
    )  # fmt: skip
    stop_margin_s: float = setting(
        30.0, ge=0,
        help="Seconds still billed after the trainer decides to stop (the save, process exit, node release); "
        "added to the cap's projection.",
    )  # fmt: skip
    ledger_uri: str = setting(
        "",
        help="Where the job's spend ledger lives (spend/<attempt>.json per attempt). Empty: the checkpoint "
        "directory. Sweep members share their sweep's.",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.budget_usd == 0 and not isinstance(self.budget_usd, bool):
            # configs and manifests written before None meant "no budget" spell it 0
            object.__setattr__(self, "budget_usd", None)
        check(self, self._section)
        _check_uri(self.ledger_uri, "cost.ledger_uri")


@dataclass(frozen=True, kw_only=True)
class MetricsConfig:
    """Stdout JSON lines and optional statsd gauges (DogStatsD-tagged, trainer/statsd.py)."""

    _section = "metrics"

    log_every: int = setting(
        10, ge=1, arg="log_every", help='Emit a "train" JSON line every N steps (and at the last).'
    )
    statsd_host: str = setting("", help='statsd host to send gauges to over UDP; "" = statsd off.')
    statsd_port: int = setting(8125, ge=1, le=65535, help="statsd UDP port.")
    statsd_prefix: str = setting(
        "dtrain",
        pattern=r"[A-Za-z0-9_.\-]*",
        rule="may only hold letters, digits, '_', '.', '-'",
        help="Prefix of every statsd metric name.",
    )
    statsd_tags: str = setting(
        "", pattern=TAGS_PATTERN, rule="must be comma-separated key:value pairs (no '|', '#' or spaces)",
        help="DogStatsD tags on every metric, key:value,key:value (trainer/statsd.py). FSDPTrainOperator sets "
        "dag_id, run_id, task_id, map_index and job, so concurrent runs are separate series; per-rank series "
        "add node and rank.",
    )  # fmt: skip

    def __post_init__(self) -> None:
        check(self, self._section)


ACTIVATION_CHECKPOINTING = ("none", "selective", "full")


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """How the model is laid out on the devices: sharding, recomputation, compilation, offload."""

    _section = "parallel"

    collective_timeout_s: float = setting(
        600.0, gt=0,
        help="Seconds a collective may wait for a peer before the process gives up. A hung or vanished peer "
        "then ends the group as lost (exit 76), relaunched from the last checkpoint within max_failures.",
    )  # fmt: skip
    replicate_degree: int = setting(
        1, ge=0, rule="must be >= 0 (1 = FSDP, R > 1 = HSDP with R replica groups, 0 = one group per node)",
        help="1 = FSDP (every parameter sharded over all ranks). R > 1 = HSDP: R replica groups, parameters "
        "sharded inside a group and replicated across, so only the gradient all-reduce crosses groups. "
        "0 = one group per node (world_size / LOCAL_WORLD_SIZE).",
    )  # fmt: skip
    activation_checkpointing: str = setting(
        "none", choices=ACTIVATION_CHECKPOINTING,
        help='"none", "selective" or "full" (recompute every block in backward: least memory, ~one extra forward).',
    )  # fmt: skip
    selective_ac_every: int = setting(
        0, ge=0, rule="must be >= 0 (0 = op-level, N = every N-th block)",
        help='With "selective": 0 = op-level (keep attention and every other matmul output, recompute the rest); '
        "N >= 1 = checkpoint every N-th whole block.",
    )  # fmt: skip
    loss_chunk_tokens: int = setting(
        4096, ge=0,
        help="Cross-entropy over this many tokens at a time, each chunk's logits recomputed in backward, so a "
        "micro-batch's full logits (16.8 GB in fp32 for 16 × 2048 tokens of a 128k vocabulary) never exist; "
        "0 = whole logits (with parallel.compile the loss is fused and 0 is faster: no recomputation).",
    )  # fmt: skip
    compile: bool = setting(
        False, help="torch.compile each transformer block (one graph reused by every layer) and the loss (projection, "
        "fp32 upcast and cross-entropy fused). On a GPU, with loss_chunk_tokens=0 where memory allows.",
    )  # fmt: skip
    cpu_offload: bool = setting(
        False,
        help="Keep sharded parameters, gradients and optimizer state in host memory (FSDP2 CPUOffloadPolicy).",
    )
    auto_micro_batch_size: bool = setting(
        False,
        help="Before training, find the largest micro_batch_size that fits in GPU memory (a divisor of "
        "global_batch_size / world size) and use it; gradient accumulation absorbs the rest. Skipped on CPU.",
    )  # fmt: skip

    def __post_init__(self) -> None:
        check(self, self._section)


# --------------------------------------------------------------------------- the job


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """A complete training job. Construct it, from_dict() it or from_file() it: all validate."""

    _section = ""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    steps: int = setting(
        50,
        ge=1,
        arg="steps",
        section=MODEL_AND_DATA,
        title="Steps",
        help="Optimizer steps to train for in total (a resumed run continues up to this).",
    )
    global_batch_size: int = setting(
        8,
        ge=1,
        arg="global_batch_size",
        section=MODEL_AND_DATA,
        help="Sequences per optimizer step across all ranks.",
    )
    micro_batch_size: int = setting(
        2,
        ge=1,
        arg="micro_batch_size",
        section=MODEL_AND_DATA,
        help="Sequences per rank per forward/backward; the rest is gradient accumulation.",
    )
    seed: int = setting(
        0,
        ge=0,
        lt=2**32,
        rule="must be in [0, 2**32)",
        arg="seed",
        help="Seeds weights and data order; the same seed and config give the same run.",
    )
    job: str = setting(
        "", arg="job", section=CHECKPOINTS, title="Job", pattern=JOB_PATTERN,
        rule="must be 1-63 lowercase letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
        help="The job's name: what outlives one DAG run. Its checkpoints, its spend ledger and its budget belong "
        "to it; a run of the same job continues it. Checkpoints of another job are never resumed or pruned.",
    )  # fmt: skip
    owner: str = setting(
        "", cli=False,
        help="Who the job belongs to (a team the platform admin maps: airflow_dtrain.trust.owner_of), set by the "
        "operator once the directory is known to be the owner's; every manifest records it.",
    )  # fmt: skip
    simulate_preemption_at_step: int = setting(
        0, ge=0, arg="simulate_preemption_at_step", section=CHECKPOINTS, title="Simulate a preemption at step",
        help="0 = off. k > 0: after step k the group gets a SIGTERM once, as from a spot reclaim "
        "(every rank saves, the group is relaunched); a run resumed at a step >= k does not do it again.",
    )  # fmt: skip

    def __post_init__(self) -> None:
        try:
            check(self, "")
        except ConfigError as err:
            if str(err).startswith("simulate_preemption_at_step"):
                raise ConfigError(self._preemption_rule()) from None
            raise
        if not self.simulate_preemption_at_step < self.steps:
            raise ConfigError(self._preemption_rule())
        if self.global_batch_size % self.micro_batch_size:
            raise ConfigError(
                f"global_batch_size: {self.global_batch_size} is not divisible by "
                f"micro_batch_size {self.micro_batch_size}"
            )

    def _preemption_rule(self) -> str:
        return (
            f"simulate_preemption_at_step: must be in [0, steps={self.steps}) (0 = off), "
            f"got {self.simulate_preemption_at_step!r}"
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
        return json.loads(json.dumps(dataclasses.asdict(self)))

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
                sub = field_types(klass).get(part)
                if sub is None or not dataclasses.is_dataclass(sub):
                    raise ConfigError(f"{key}: unknown key {part!r} in {_section_label(klass)}")
                node, klass = node[part], sub
            ftype = field_types(klass).get(leaf)
            if ftype is None:
                raise ConfigError(
                    f"{key}: unknown key {leaf!r} in {_section_label(klass)} "
                    f"(known: {', '.join(field_types(klass))})"
                )
            if dataclasses.is_dataclass(ftype):
                raise ConfigError(f"{key}: is a section; override its fields, e.g. '{key}.<field>'")
            node[leaf] = coerce(key, ftype, value)
        return type(self).from_dict(d)

    def config_hash(self) -> str:
        """Stable sha256 of the canonical JSON of to_dict(); recorded in checkpoint manifests."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


# --------------------------------------------------------------------------- from_dict internals


def _section_label(klass: type) -> str:
    return f"section {klass._section!r}" if klass._section else "the top level"


def _build(klass: type, d: Any, section: str) -> Any:
    if not isinstance(d, dict):
        raise ConfigError(f"{section or 'config'}: expected a table/dict, got {d!r}")
    types = field_types(klass)
    kwargs = {}
    for key, value in d.items():
        where = f"{section}.{key}" if section else str(key)
        if key not in types:
            raise ConfigError(f"{where}: unknown key (known in {_section_label(klass)}: {', '.join(types)})")
        if dataclasses.is_dataclass(types[key]):
            value = _build(types[key], value, where)
        kwargs[key] = value
    return klass(**kwargs)
