"""What each node of a group asks for (``JobSpec.resources``; the operator's ``node_resources``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from trainer.config.fields import check, coerce, field_types, setting

from airflow_dtrain.errors import SpecError, checked

_QUANTITY = r"[0-9]+(\.[0-9]+)?([mkMGTPE]i?)?"


@dataclass(frozen=True, kw_only=True)
class Resources:
    """What each node of the group asks for."""

    cpu: str | None = setting(
        None,
        pattern=_QUANTITY,
        rule="not a Kubernetes quantity",
        help='CPU per node, a Kubernetes quantity ("8", "7500m"): on Kubernetes the trainer container\'s '
        "request and "
        "limit. Empty: 4 per GPU, else 1 per process.",
    )
    memory: str | None = setting(
        None, pattern=_QUANTITY, rule="not a Kubernetes quantity",
        help='Memory per node, a Kubernetes quantity ("64Gi"): on Kubernetes the request and limit (the '
        "memory-backed /dev/shm counts against it). Empty: 32Gi per GPU, else 4Gi per process.",
    )  # fmt: skip
    ephemeral_storage: str | None = setting(
        None,
        pattern=_QUANTITY,
        rule="not a Kubernetes quantity",
        help='Node-local disk per node, a Kubernetes quantity ("200Gi"): on Kubernetes the request and limit '
        "of "
        "ephemeral-storage, which the writable /tmp holds (caches, the token-store cache, the staging of "
        "s3:// "
        "checkpoints). A pod over it is evicted. Empty: 100Gi with GPUs, else 20Gi.",
    )
    gpus_per_node: int = setting(0, ge=0, help="GPUs per node; 0 trains on CPU with gloo.")

    def __post_init__(self) -> None:
        for name in ("cpu", "memory", "ephemeral_storage"):
            if isinstance(getattr(self, name), (int, float)) and not isinstance(getattr(self, name), bool):
                object.__setattr__(self, name, str(getattr(self, name)))
        checked(check, self, "resources")

    @classmethod
    def from_value(cls, value: Any) -> Resources:
        if value is None:
            return cls()
        if isinstance(value, Resources):
            return value
        if not isinstance(value, dict):
            raise SpecError(f"resources: expected a mapping, got {value!r}")
        unknown = sorted(set(value) - set(field_types(cls)))
        if unknown:
            raise SpecError(f"resources: unknown key {unknown[0]!r} (allowed: {', '.join(field_types(cls))})")
        types = field_types(cls)
        return cls(**{k: checked(coerce, f"resources.{k}", types[k], v) for k, v in value.items()})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
