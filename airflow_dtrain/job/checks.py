"""The checks of a ``JobSpec`` that look at more than one of its fields: an elastic group's sizes, and what
the kubernetes backend needs. Each raises ``SpecError`` naming the field and the value, before anything runs.
Stdlib only."""

from __future__ import annotations

import dataclasses
from typing import Any

from trainer.config.fields import ConfigError

from airflow_dtrain.errors import SpecError

ZONE_LABEL = "topology.kubernetes.io/zone"
"""The well-known node label of a node's availability zone (``JobSpec.zone``)."""
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
"""The well-known node label of a node's instance type (``JobSpec.instance_type``)."""


def uneven_batch(train: Any) -> Any:
    """``train`` (a ``TrainConfig``) with ``parallel.uneven_batch`` on: an elastic group's sizes need not
    divide the global batch (its shares differ by at most one sequence; the gradient is the same mean)."""
    if train.parallel.uneven_batch:
        return train
    return dataclasses.replace(train, parallel=dataclasses.replace(train.parallel, uneven_batch=True))


def check_elastic(spec: Any) -> None:
    """``min_nodes`` is at most ``num_nodes``, and the group can train at every size from it (the global batch
    stays the same across a resize, split unevenly where the size does not divide it: ``uneven_batch``)."""
    if spec.min_nodes is None:
        return
    if spec.min_nodes > spec.num_nodes:
        raise SpecError(f"min_nodes: {spec.min_nodes} is more than num_nodes {spec.num_nodes}")
    if spec.own_program:  # a program of your own owns its batch arithmetic
        return
    for nodes in range(spec.min_nodes, spec.num_nodes):
        try:
            spec.train.validate_world_size(nodes * spec.procs_per_node)
        except ConfigError as err:
            raise SpecError(
                f"min_nodes: {spec.min_nodes} lets the group train on {nodes} node(s) × procs_per_node "
                f"{spec.procs_per_node}, and there {err}: choose a min_nodes at which every size up to "
                "num_nodes can train"
            ) from None


def check_kubernetes(spec: Any) -> None:
    """What the kubernetes backend needs: an image, a checkpoint location every pod reaches, and a zone and
    instance type its node selector allows."""
    if spec.backend != "kubernetes":
        return
    if not spec.kubernetes.image:
        raise SpecError(
            "kubernetes.image: required for backend 'kubernetes' (the trainer image, see docker/)"
        )
    problem = spec.kubernetes.checkpoint_problem(spec.train.checkpoint.uri)
    if problem:
        raise SpecError(
            f"checkpoint.uri (argument checkpoint_uri): backend 'kubernetes' {problem}, "
            f"got {spec.train.checkpoint.uri!r}"
        )
    for name, label in (("zone", ZONE_LABEL), ("instance_type", INSTANCE_TYPE_LABEL)):
        chosen, required = getattr(spec, name), spec.kubernetes.node_selector.get(label)
        if chosen and required and chosen != required:
            raise SpecError(
                f"{name}: {chosen!r} was chosen, but kubernetes.node_selector requires {label}={required!r}: "
                "no node could run the group"
            )
