"""What a group's Job remembers: where its pods ran, and the outcomes of its task's earlier groups.

A Job is deleted ``ttlSecondsAfterFinished`` after it ends, with its pods: each new Job of a task carries the
outcomes (and placements) of the task's earlier groups (annotation ``airflow-dtrain/earlier-groups``), so the
operator still counts preemptions and the summary still names where each group ran.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes.client.exceptions import ApiException

from airflow_dtrain.kubernetes import placement as group_placement, status as group_status
from airflow_dtrain.kubernetes.api import _MERGE_PATCH, KubernetesApi
from airflow_dtrain.kubernetes.names import ANNOTATION_PLACEMENT, LABEL_TASK, task_name


class GroupMemory(KubernetesApi):
    """The launcher's reads and writes of what Jobs remember; ``status`` comes from the launcher."""

    def placement(self, name: str) -> list[dict[str, Any]] | None:
        job = self._job(name)
        if job is None:
            return (self._remembered(name) or {}).get("placement")
        recorded = (job["metadata"].get("annotations") or {}).get(ANNOTATION_PLACEMENT)
        return json.loads(recorded) if recorded else None

    # -- what a group's Job remembers ----------------------------------------------------------------
    def _task_jobs(self, name: str) -> list[dict[str, Any]]:
        """The Jobs of every group of ``name``'s task, oldest first."""
        jobs = self._api(self._batch.list_namespaced_job, self.namespace,
                         label_selector=f"{LABEL_TASK}={task_name(name)}")["items"]  # fmt: skip
        return sorted(jobs, key=lambda j: (j["metadata"].get("creationTimestamp", ""), j["metadata"]["name"]))

    def _remembered(self, name: str) -> dict[str, Any] | None:
        """What a later Job of the task remembers of group ``name`` (None: nothing)."""
        for job in reversed(self._task_jobs(name)):
            entry = group_status.earlier(job).get(name)
            if entry is not None:
                return entry
        return None

    def _earlier_outcomes(self, name: str) -> dict[str, dict[str, Any]]:
        """The outcomes of the task's earlier groups, for the Job of ``name`` to carry: the operator counts
        preemptions and failures from them, and the summary names where each ran, after the earlier Jobs'
        ttlSecondsAfterFinished deleted them."""
        earlier: dict[str, dict[str, Any]] = {}
        jobs = self._task_jobs(name)
        for job in jobs:
            earlier.update(group_status.earlier(job))
        for job in jobs:
            other = job["metadata"]["name"]
            if other == name:
                continue
            status = self.status(other)
            if status.state.terminal:
                earlier[other] = group_status.entry_of(status, job["metadata"].get("creationTimestamp", ""),
                                                       self.placement(other))  # fmt: skip
        return earlier

    def _record_placement(
        self, name: str, job: dict[str, Any], pods: list[dict[str, Any]], *, ended: bool
    ) -> None:
        """Write where the pods run on the Job, once: when every node index is bound to a node (or the group
        ended with some bound)."""
        if ANNOTATION_PLACEMENT in (job["metadata"].get("annotations") or {}):
            return
        nodes = group_placement.node_names(pods)
        if not nodes or (len(nodes) < (job["spec"].get("completions") or 1) and not ended):
            return
        where = group_placement.placement(nodes, self._node_labels)
        self.log.info("Group %s runs on %s", name, ", ".join(
            f"node {p['node_index']}: {p['node']} ({p['zone'] or '?'}, {p['instance_type'] or '?'}, "
            f"{p['capacity_type'] or '?'})" for p in where))  # fmt: skip
        patch = {"metadata": {"annotations": {ANNOTATION_PLACEMENT: json.dumps(where)}}}
        self._api(self._batch.patch_namespaced_job, name, self.namespace, patch, _content_type=_MERGE_PATCH,
                  missing_ok=True)  # fmt: skip

    def _node_labels(self, node: str) -> dict[str, str] | None:
        """A node's labels; None when it is gone or the launcher may not read nodes (a ClusterRole)."""
        try:
            found = self._api(self._core.read_node, node, missing_ok=True)
        except ApiException as err:
            if err.status != 403:
                raise
            self.log.warning(
                "Cannot read node %s (403 Forbidden): the group's placement names its nodes without their "
                "zone and instance type; grant get on nodes (ClusterRole airflow-dtrain-node-reader in "
                "docker/rbac.yaml)", node,
            )  # fmt: skip
            return None
        return None if found is None else dict(found["metadata"].get("labels") or {})
