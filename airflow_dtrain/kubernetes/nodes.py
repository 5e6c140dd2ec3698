"""The nodes a training group's pods run on, as an ``InstanceSource`` for ``SpotInterruptionSensor``.

Read through the cncf.kubernetes provider's ``KubernetesHook`` (imported on the first look, not
at import time): the group's pods by label, then their nodes. Instance ids come from each node's
``spec.providerID`` (``aws:///<zone>/<instance id>``), and the nodes' interruption taints
(aws-node-termination-handler, Karpenter) are reported as notices; parsing both is
``airflow_dtrain.spot.events``'s.
"""

from __future__ import annotations

from typing import Any

from airflow_dtrain.kubernetes.names import LABEL_GROUP
from airflow_dtrain.spot.events import InterruptionNotice, instance_id_of_provider_id, notice_from_node
from airflow_dtrain.spot.members import GroupMembers, InstanceSource


class KubernetesGroupNodes(InstanceSource):
    """The nodes that the group's pods are scheduled on.

    :param namespace: the namespace of the group's pods.
    :param label_selector: selects the group's pods; ``{group}`` is replaced by the group's
        name. Must match the labels the Kubernetes launcher puts on its pods.
    :param kubernetes_conn_id: the cncf.kubernetes connection.
    """

    def __init__(
        self,
        *,
        namespace: str = "default",
        label_selector: str = f"{LABEL_GROUP}={{group}}",
        kubernetes_conn_id: str = "kubernetes_default",
    ):
        self.namespace = namespace
        self.label_selector = label_selector
        self.kubernetes_conn_id = kubernetes_conn_id

    def _api(self):
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        return KubernetesHook(conn_id=self.kubernetes_conn_id).core_v1_client

    def _nodes(self, group: str) -> list[dict[str, Any]]:
        api = self._api()
        pods = api.list_namespaced_pod(self.namespace, label_selector=self.label_selector.format(group=group))
        names = sorted({p.spec.node_name for p in pods.items if p.spec and p.spec.node_name})
        nodes = []
        for name in names:
            node = api.read_node(name)
            nodes.append(api.api_client.sanitize_for_serialization(node))
        return nodes

    def members(self, group: str) -> GroupMembers:
        nodes = self._nodes(group)
        ids = {instance_id_of_provider_id((n.get("spec") or {}).get("providerID")) for n in nodes}
        return GroupMembers(frozenset(i for i in ids if i), frozenset(n["metadata"]["name"] for n in nodes))

    def node_notices(self, group: str) -> list[InterruptionNotice]:
        return [notice for notice in map(notice_from_node, self._nodes(group)) if notice is not None]

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "airflow_dtrain.kubernetes.nodes.KubernetesGroupNodes",
            {
                "namespace": self.namespace,
                "label_selector": self.label_selector,
                "kubernetes_conn_id": self.kubernetes_conn_id,
            },
        )
