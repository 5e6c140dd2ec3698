"""Where the instances of a training group come from: a pluggable source.

``SpotInterruptionSensor`` asks its source for the group's members (EC2 instance ids and
Kubernetes node names) on every look, so a group relaunched on other nodes is followed.
A source is plain data that survives deferral: ``serialize()`` returns its dotted class
path and keyword arguments, like a trigger's.

Built in:

- ``StaticInstances``: the ids and names you give (the local backend, fixed fleets, tests).
- ``airflow_dtrain.kubernetes.nodes.KubernetesGroupNodes``: the nodes the group's pods run on,
  through the cncf.kubernetes provider's ``KubernetesHook``; instance ids from each node's
  ``spec.providerID`` (``aws:///<zone>/<instance id>``), and it also reports the nodes'
  interruption taints.

Your own: subclass ``InstanceSource``, implement ``members`` (and ``node_notices`` if it
can see taints) and ``serialize``; pass an instance as ``instance_source=``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

from airflow_dtrain.spot.events import InterruptionNotice

_MOVED_SOURCES = {
    "airflow_dtrain.spot.members.KubernetesGroupNodes": (
        "airflow_dtrain.kubernetes.nodes.KubernetesGroupNodes"
    ),
}
"""Old class path -> new, for built-in sources that moved: triggers deferred before the move
carry the old one."""


@dataclass(frozen=True)
class GroupMembers:
    instance_ids: frozenset[str] = field(default_factory=frozenset)
    node_names: frozenset[str] = field(default_factory=frozenset)

    def __contains__(self, notice: InterruptionNotice) -> bool:
        return (notice.instance_id is not None and notice.instance_id in self.instance_ids) or (
            notice.node_name is not None and notice.node_name in self.node_names
        )


class InstanceSource(abc.ABC):
    """Tells which instances and nodes host a group."""

    @abc.abstractmethod
    def members(self, group: str) -> GroupMembers:
        """The instance ids and node names hosting ``group`` now."""

    def node_notices(self, group: str) -> list[InterruptionNotice]:
        """Notices the group's nodes carry (taints); sources that cannot see nodes return []."""
        return []

    @abc.abstractmethod
    def serialize(self) -> tuple[str, dict[str, Any]]:
        """(dotted class path, keyword arguments): how to rebuild this source elsewhere."""


def deserialize_source(classpath: str, kwargs: dict[str, Any]) -> InstanceSource:
    """Rebuild a source from its ``serialize()`` output."""
    from airflow.sdk.module_loading import import_string

    cls = import_string(_MOVED_SOURCES.get(classpath, classpath))
    if not (isinstance(cls, type) and issubclass(cls, InstanceSource)):
        raise ValueError(f"instance_source: {classpath!r} is not an InstanceSource")
    return cls(**kwargs)


class StaticInstances(InstanceSource):
    """A fixed list of instance ids and/or node names.

    :param instance_ids: EC2 instance ids (``i-...``) of the group.
    :param node_names: Kubernetes node names of the group.
    """

    def __init__(
        self, *, instance_ids: list[str] | tuple[str, ...] = (), node_names: list[str] | tuple[str, ...] = ()
    ):
        if isinstance(instance_ids, str) or isinstance(node_names, str):
            raise ValueError(
                f"instance_ids / node_names: expected lists, got {instance_ids!r} / {node_names!r}"
            )
        self.instance_ids = sorted(instance_ids)
        self.node_names = sorted(node_names)

    def members(self, group: str) -> GroupMembers:
        return GroupMembers(frozenset(self.instance_ids), frozenset(self.node_names))

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "airflow_dtrain.spot.members.StaticInstances",
            {"instance_ids": list(self.instance_ids), "node_names": list(self.node_names)},
        )
