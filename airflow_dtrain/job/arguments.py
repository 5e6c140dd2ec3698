"""A ``JobSpec`` from what the operator is given: its keyword arguments (rendered templates are strings,
coerced to each field's type; a trainer error names the argument), or the plain dict of ``to_dict``.

An older DAG's config may carry the cost section that now belongs to the group (capacity, prices): its values
are the group's defaults. The functions take the spec's class, so this module needs none of ``spec``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from airflow_dtrain.errors import SpecError, checked
from airflow_dtrain.job.resources import Resources
from airflow_dtrain.kubernetes.spec import kubernetes_and_capacity
from trainer.config.fields import ConfigError, coerce, field_types, flatten, meta, walk
from trainer.config.job_config import TrainConfig

if TYPE_CHECKING:
    from airflow_dtrain.job.spec import JobSpec

TRAIN_ARGUMENTS: dict[str, str] = {meta(f).arg: dotted for dotted, f, _ in walk(TrainConfig) if meta(f).arg}
"""Operator keyword arguments that set a field of the trainer's config: ``{"flavor": "model.flavor",
...}``."""
_ARGUMENT_OF = {dotted: arg for arg, dotted in TRAIN_ARGUMENTS.items()}


def spec_from_dict(cls: type[JobSpec], data: dict[str, Any]) -> JobSpec:
    """``JobSpec.to_dict``'s values read back; an unknown key is refused by name."""
    data = dict(data)
    train = checked(TrainConfig.from_dict, data.pop("train", {}))
    resources = Resources.from_value(data.pop("resources", None))
    kubernetes, capacity = kubernetes_and_capacity(data.pop("kubernetes", None), data.pop("capacity", None))
    entrypoint = data.pop("entrypoint", None)
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)} - {"budget_usd"})
    if unknown:
        raise SpecError(f"{unknown[0]}: unknown job spec field")
    if capacity is None:
        capacity = train.cost.capacity_type
    data.setdefault("price_per_node_hour", train.cost.price_per_node_hour)
    data.setdefault("price_ceiling_per_node_hour", train.cost.price_ceiling_per_node_hour)
    if data.get("budget_usd") is not None:  # to_dict() shows the cap beside the group: it is the train's
        cost = checked(dataclasses.replace, train.cost, budget_usd=data["budget_usd"])
        train = dataclasses.replace(train, cost=cost)
    data.pop("budget_usd", None)
    return cls(
        train=train,
        resources=resources,
        kubernetes=kubernetes,
        entrypoint=entrypoint,
        capacity=capacity,
        **data,
    )


def spec_from_arguments(
    cls: type[JobSpec],
    *,
    config: dict[str, Any] | None = None,
    resources: Any = None,
    kubernetes: Any = None,
    entrypoint: Any = None,
    **arguments: Any,
) -> JobSpec:
    """Build a spec from operator-style arguments (``flavor=``, ``steps=``, ``num_nodes=``, ...).

    Strings (rendered templates) are coerced to the field's type. ``config`` is a full or partial trainer
    config (nested or dotted keys) for everything the flat arguments do not cover; the flat arguments win.
    None means "the default". ``entrypoint`` is taken as it is (``parse_entrypoint``): the DAG author's, never
    a rendered value.
    """
    group_types = {
        f.name: t for f, t in zip(dataclasses.fields(cls), field_types(cls).values()) if meta(f).arg
    }
    unknown = sorted(set(arguments) - set(TRAIN_ARGUMENTS) - set(group_types))
    if unknown:
        raise SpecError(f"{unknown[0]}: unknown argument")
    if config and not isinstance(config, dict):
        raise SpecError(f"config: expected a mapping, got {config!r}")
    overrides: dict[str, Any] = flatten(config) if config else {}
    group: dict[str, Any] = {}
    for name, value in arguments.items():
        if value is None:
            continue
        if name in group_types:
            group[name] = checked(coerce, name, group_types[name], value)
        else:
            overrides[TRAIN_ARGUMENTS[name]] = value
    legacy_capacity = _take_legacy_cost(overrides, group)
    try:
        train = TrainConfig().with_overrides(overrides)
    except ConfigError as err:
        raise SpecError(_name_argument(str(err))) from None
    kubernetes, k8s_capacity = kubernetes_and_capacity(kubernetes, group.pop("capacity", None))
    capacity = k8s_capacity or legacy_capacity
    if capacity is not None:
        group["capacity"] = capacity
    return cls(
        train=train,
        resources=Resources.from_value(resources),
        kubernetes=kubernetes,
        entrypoint=entrypoint,
        **group,
    )


def _take_legacy_cost(overrides: dict[str, Any], group: dict[str, Any]) -> Any:
    """Take the cost section out of a config's ``overrides`` (older DAGs set it there): its prices become
    the group's where the arguments give none; its capacity is returned, for the same."""
    capacity = overrides.pop("cost.capacity_type", None)
    overrides.pop("cost.gpus_per_node", None)
    for name in ("price_per_node_hour", "price_ceiling_per_node_hour"):
        legacy = overrides.pop(f"cost.{name}", None)
        if name not in group and legacy not in (None, ""):
            group[name] = checked(coerce, name, float, legacy)
    return capacity


def _name_argument(message: str) -> str:
    """Add the operator argument to a trainer error: "checkpoint.uri (argument checkpoint_uri): ..."."""
    dotted, sep, rest = message.partition(":")
    argument = _ARGUMENT_OF.get(dotted.strip())
    if sep and argument and argument != dotted.strip():
        return f"{dotted} (argument {argument}):{rest}"
    return message
