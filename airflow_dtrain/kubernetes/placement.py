"""Where a group's pods ran: each node index's node, zone, instance type and capacity type.

The launcher records it on the Job (annotation ``airflow-dtrain/placement``) the first time it
sees every pod of the group bound to a node (or when the group ends first), reading each node's
well-known labels, so the summary can say where the group ran after its pods are gone. Pure
functions, no client: the launcher hands in the pods and a way to read a node's labels.

Reading a node is cluster-scoped (``get`` on ``nodes``: the ClusterRole in docker/rbac.yaml,
which the spot interruption watch needs too). Without it the placement still names each pod's
node, with the zone and types unknown.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow_dtrain.kubernetes.status import pod_index
from airflow_dtrain.job.checks import INSTANCE_TYPE_LABEL, ZONE_LABEL
from trainer.money.capacity import Capacity

# Capacity-type labels of Karpenter and EKS managed node groups, in their own spellings.
_CAPACITY_LABELS = ("karpenter.sh/capacity-type", "eks.amazonaws.com/capacityType")


def capacity_of(labels: dict[str, str]) -> str | None:
    """The node's capacity type in the one vocabulary (``spot``, ``on_demand``), from its labels."""
    for key in _CAPACITY_LABELS:
        if key in labels:
            try:
                return Capacity(labels[key].lower()).value
            except ValueError:
                return labels[key]
    return None


def node_names(pods: list[dict[str, Any]]) -> dict[int, str]:
    """The node of each node index (its newest pod's ``spec.nodeName``), for the pods bound so far."""
    found: dict[int, str] = {}
    for pod in pods:  # oldest first: a replacement pod's node wins
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            found[pod_index(pod)] = node
    return found


def placement(
    nodes: dict[int, str], labels_of: Callable[[str], dict[str, str] | None]
) -> list[dict[str, Any]]:
    """One entry per node index: its node and that node's zone, instance type and capacity type.

    :param labels_of: a node's labels by name (None: unknown, e.g. not allowed to read nodes).
    """
    out, seen = [], {}
    for index in sorted(nodes):
        name = nodes[index]
        if name not in seen:
            seen[name] = labels_of(name)
        labels = seen[name]
        out.append({
            "node_index": index, "node": name,
            "zone": None if labels is None else labels.get(ZONE_LABEL),
            "instance_type": None if labels is None else labels.get(INSTANCE_TYPE_LABEL),
            "capacity_type": None if labels is None else capacity_of(labels),
        })  # fmt: skip
    return out
