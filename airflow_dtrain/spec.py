"""The job spec: what to train (the trainer's own config) and where (the pod group).

A ``JobSpec`` is plain data: it serialises to JSON for XComs, triggers and the
command line, and it is validated when built, so a bad spec fails in the DAG
file or before anything is launched -- never halfway through a launch. The
training half is the trainer's ``TrainConfig`` itself (``trainer/config.py`` is
stdlib-only, so importing it here costs nothing at parse time).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from trainer.config import ConfigError, TrainConfig

BACKENDS = ("local",)
"""Backends this version can launch. ``kubernetes`` arrives with its launcher."""

# Operator keyword arguments that map onto a field of the trainer's config.
TRAIN_FIELDS: dict[str, str] = {
    "flavor": "model.flavor",
    "dataset": "data.dataset",
    "seq_len": "data.seq_len",
    "steps": "steps",
    "global_batch_size": "global_batch_size",
    "micro_batch_size": "micro_batch_size",
    "seed": "seed",
    "lr": "optim.lr",
    "warmup_steps": "optim.warmup_steps",
    "weight_decay": "optim.weight_decay",
    "grad_clip": "optim.grad_clip",
    "checkpoint_uri": "checkpoint.uri",
    "checkpoint_every": "checkpoint.every",
    "checkpoint_keep": "checkpoint.keep",
    "log_every": "metrics.log_every",
    "simulate_preemption_at_step": "simulate_preemption_at_step",
}
_ARGUMENT_OF = {dotted: arg for arg, dotted in TRAIN_FIELDS.items()}

_MAX_NAME = 46  # leaves room for Kubernetes' "-<index>-<5 chars>" pod suffixes within 63


class SpecError(ValueError):
    """A job spec is invalid. The message names the field and the value."""


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


_DEFAULTS = _flatten(TrainConfig().to_dict())


def _coerce(field_name: str, dotted: str, value: Any) -> Any:
    """Turn a rendered template string into the field's type ("50" -> 50)."""
    default = _DEFAULTS.get(dotted)
    if not isinstance(value, str) or isinstance(default, str) or default is None:
        return value
    text = value.strip()
    try:
        if isinstance(default, bool):
            if text.lower() in ("true", "false"):
                return text.lower() == "true"
            raise ValueError
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
    except ValueError:
        raise SpecError(
            f"{field_name}: expected {type(default).__name__}, got {value!r}"
        ) from None
    return value


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class Resources:
    """What each node of the group asks for."""

    cpu: str | None = None
    """CPU request per node, Kubernetes quantity ("8", "7500m")."""
    memory: str | None = None
    """Memory request per node, Kubernetes quantity ("64Gi")."""
    gpus_per_node: int = 0
    """GPUs per node; 0 trains on CPU with gloo."""

    @classmethod
    def from_value(cls, value: Any) -> Resources:
        if value is None:
            return cls()
        if isinstance(value, Resources):
            return value
        if not isinstance(value, dict):
            raise SpecError(f"resources: expected a mapping, got {value!r}")
        unknown = sorted(set(value) - {"cpu", "memory", "gpus_per_node"})
        if unknown:
            raise SpecError(
                f"resources: unknown key {unknown[0]!r} (allowed: cpu, memory, gpus_per_node)"
            )
        gpus = _positive_int("resources.gpus_per_node", value.get("gpus_per_node", 0), minimum=0)
        cpu = value.get("cpu")
        memory = value.get("memory")
        for key, quantity in (("cpu", cpu), ("memory", memory)):
            if quantity is not None and not re.fullmatch(r"[0-9]+(\.[0-9]+)?([mkMGTPE]i?)?", str(quantity)):
                raise SpecError(f"resources.{key}: not a Kubernetes quantity: {quantity!r}")
        return cls(
            cpu=None if cpu is None else str(cpu),
            memory=None if memory is None else str(memory),
            gpus_per_node=gpus,
        )

    def to_dict(self) -> dict[str, Any]:
        return {"cpu": self.cpu, "memory": self.memory, "gpus_per_node": self.gpus_per_node}


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """One training job: the trainer's config plus the shape of its pod group."""

    train: TrainConfig = field(default_factory=TrainConfig)
    """What every process trains (``trainer.config.TrainConfig``)."""
    num_nodes: int = 1
    """Nodes in the group; each runs one torchrun agent."""
    procs_per_node: int = 1
    """Training processes per node (one per GPU on GPU nodes)."""
    backend: str = "local"
    """Where the group runs: ``local`` (processes on this machine)."""
    resources: Resources = field(default_factory=Resources)
    """Per-node resource requests."""
    max_preemptions: int = 3
    """How many times a preempted group is relaunched from its checkpoint."""

    def __post_init__(self) -> None:
        _positive_int("num_nodes", self.num_nodes)
        _positive_int("procs_per_node", self.procs_per_node)
        _positive_int("max_preemptions", self.max_preemptions, minimum=0)
        if self.backend not in BACKENDS:
            raise SpecError(f"backend: unknown backend {self.backend!r} (choose from {', '.join(BACKENDS)})")
        if self.resources.gpus_per_node and self.resources.gpus_per_node != self.procs_per_node:
            raise SpecError(
                f"procs_per_node: {self.procs_per_node} processes per node, but "
                f"resources.gpus_per_node is {self.resources.gpus_per_node}: run one process per GPU"
            )
        try:
            self.train.validate_world_size(self.world_size)
        except ConfigError as err:
            raise SpecError(
                f"{err} (world size = num_nodes {self.num_nodes} × procs_per_node {self.procs_per_node})"
            ) from None

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.procs_per_node

    def to_dict(self) -> dict[str, Any]:
        return {
            "train": self.train.to_dict(),
            "num_nodes": self.num_nodes,
            "procs_per_node": self.procs_per_node,
            "backend": self.backend,
            "resources": self.resources.to_dict(),
            "max_preemptions": self.max_preemptions,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSpec:
        data = dict(data)
        try:
            train = TrainConfig.from_dict(data.pop("train", {}))
        except ConfigError as err:
            raise SpecError(str(err)) from None
        resources = Resources.from_value(data.pop("resources", None))
        unknown = sorted(set(data) - {"num_nodes", "procs_per_node", "backend", "max_preemptions"})
        if unknown:
            raise SpecError(f"{unknown[0]}: unknown job spec field")
        return cls(train=train, resources=resources, **data)

    @classmethod
    def from_arguments(
        cls,
        *,
        config: dict[str, Any] | None = None,
        num_nodes: Any = 1,
        procs_per_node: Any = 1,
        backend: str = "local",
        resources: Any = None,
        max_preemptions: Any = 3,
        **train_arguments: Any,
    ) -> JobSpec:
        """Build a spec from operator-style arguments (``flavor=``, ``steps=``, ...).

        ``config`` is a full or partial trainer config (nested or dotted keys) for
        everything the flat arguments do not cover; the flat arguments win.
        """
        unknown = sorted(set(train_arguments) - set(TRAIN_FIELDS))
        if unknown:
            raise SpecError(f"{unknown[0]}: unknown argument")
        overrides: dict[str, Any] = {}
        if config:
            if not isinstance(config, dict):
                raise SpecError(f"config: expected a mapping, got {config!r}")
            overrides.update(_flatten(config))
        for name, value in train_arguments.items():
            if value is None:
                continue
            overrides[TRAIN_FIELDS[name]] = _coerce(name, TRAIN_FIELDS[name], value)
        try:
            train = TrainConfig().with_overrides(overrides)
        except ConfigError as err:
            raise SpecError(_name_argument(str(err))) from None
        return cls(
            train=train,
            num_nodes=_positive_int("num_nodes", num_nodes),
            procs_per_node=_positive_int("procs_per_node", procs_per_node),
            backend=str(backend),
            resources=Resources.from_value(resources),
            max_preemptions=_positive_int("max_preemptions", max_preemptions, minimum=0),
        )


def _name_argument(message: str) -> str:
    """Add the operator argument to a trainer error: "checkpoint.uri (argument checkpoint_uri): ..."."""
    dotted, sep, rest = message.partition(":")
    argument = _ARGUMENT_OF.get(dotted.strip())
    if sep and argument and argument != dotted.strip():
        return f"{dotted} (argument {argument}):{rest}"
    return message


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def group_base_name(dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
    """A deterministic, DNS-1035-safe name for the groups of one task instance.

    The same dag_id/run_id/task_id/map_index always gives the same name, which is
    what lets a restarted task find its group again instead of launching another.
    """
    digest = hashlib.sha256(f"{dag_id}\0{run_id}\0{task_id}\0{map_index}".encode()).hexdigest()[:10]
    stem = _slug(f"{dag_id}-{task_id}")[: _MAX_NAME - len(digest) - 6].strip("-")
    if not stem or not stem[0].isalpha():
        stem = f"g{stem}"[: _MAX_NAME - len(digest) - 6].strip("-")
    return f"{stem}-{digest}"


def group_name(base: str, relaunch: int) -> str:
    """The name of relaunch number ``relaunch`` (0 for the first launch)."""
    return f"{base}-r{relaunch}"


def relaunch_index(base: str, name: str) -> int | None:
    """The relaunch number of ``name`` if it belongs to ``base``, else None."""
    match = re.fullmatch(re.escape(base) + r"-r([0-9]+)", name)
    return int(match.group(1)) if match else None
