"""Training job configuration: what the trainer runs, validated before anything starts.

Every field is declared once with ``trainer.config.fields.setting`` (default, help, bounds,
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
  lease, see trainer/checkpoint/directory.py): this one stopped without committing; never relaunched.
* anything else -- a failure (non-finite loss, crash); retrying may not help.
"""

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

from trainer.config.sections import (
    CHECKPOINTS,
    JOB_PATTERN,
    MODEL_AND_DATA,
    CheckpointConfig,
    CostConfig,
    DataConfig,
    MetricsConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
)
from trainer.config.fields import ConfigError, check, coerce, field_types, setting

STORAGE_EXIT_CODE = 74
"""A checkpoint could not be written (EX_IOERR: ENOSPC, EACCES, EROFS, S3 AccessDenied): the older
checkpoints are intact; a failure, never a relaunch -- the same storage fails the same way until someone frees
or fixes it."""
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
        "",
        arg="job",
        section=CHECKPOINTS,
        title="Job",
        pattern=JOB_PATTERN,
        rule="must be 1-63 lowercase letters, digits, '-', '_' or '.', starting and ending with a letter or "
        "digit",
        help="The job's name: what outlives one DAG run. Its checkpoints, its spend ledger and its budget "
        "belong "
        "to it; a run of the same job continues it. Checkpoints of another job are never resumed or pruned.",
    )
    owner: str = setting(
        "",
        cli=False,
        help="Who the job belongs to (a team the platform admin maps: "
        "airflow_dtrain.trust.ownership.owner_of), set by the operator once the directory is known to be the "
        "owner's; every manifest records it.",
    )
    simulate_preemption_at_step: int = setting(
        0,
        ge=0,
        arg="simulate_preemption_at_step",
        section=CHECKPOINTS,
        title="Simulate a preemption at step",
        help="0 = off. k > 0: after step k the group gets a SIGTERM once, as from a spot reclaim "
        "(every rank saves, the group is relaunched); a run resumed at a step >= k does not do it again.",
    )

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
        """Raise ConfigError unless the global batch splits evenly into micro-batches on every rank (with
        ``parallel.uneven_batch``: unless some rank would have no sequence)."""
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ConfigError(f"world_size: must be a positive integer, got {world_size!r}")
        if self.parallel.uneven_batch:
            if world_size > self.global_batch_size:
                raise ConfigError(
                    f"global_batch_size {self.global_batch_size} is less than world size {world_size}: "
                    "parallel.uneven_batch still needs one sequence per rank"
                )
        elif self.global_batch_size % (world_size * self.micro_batch_size):
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
        """Micro-steps per optimizer step on each rank (uneven shares: the largest share's)."""
        self.validate_world_size(world_size)
        largest_share = -(-self.global_batch_size // world_size)  # ceil: the even case's share exactly
        return -(-largest_share // self.micro_batch_size)

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
