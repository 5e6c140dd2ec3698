"""What tests drive: the pods of a Job (``run``, ``log``, ``exit``, ``unschedulable``), the nodes they run
on (``add_node``, ``taint``), and looks at the fake's objects."""

from __future__ import annotations

import copy
import time
from typing import Any

from tests.kubernetes.fakeapi.wire import _image, _now, scheduling_problem


class TestDriver:
    """The test-facing side of the fake; mixed into ``FakeKubernetesApiServer``."""

    __test__ = False  # not a pytest test class

    def jobs(self, namespace: str = "default") -> list[str]:
        with self.lock:
            self.tick()
            return sorted(n for k, ns, n in self.objects if k == "jobs" and ns == namespace)

    def names(self, kind: str, namespace: str = "default") -> list[str]:
        with self.lock:
            return sorted(n for k, ns, n in self.objects if k == kind and ns == namespace)

    def get(self, kind: str, name: str, namespace: str = "default") -> dict[str, Any] | None:
        with self.lock:
            self.tick()
            obj = self.objects.get((kind, namespace, name))
            return copy.deepcopy(obj) if obj else None

    def pod(self, job: str, index: int, namespace: str = "default") -> dict[str, Any]:
        """The newest pod of ``index`` of Job ``job``."""
        with self.lock:
            pods = [o for (k, n, _), o in self.objects.items() if k == "pods" and n == namespace
                    and o["metadata"]["labels"].get("batch.kubernetes.io/job-name") == job
                    and self._index(o) == index]  # fmt: skip
            if not pods:
                raise KeyError(f"no pod of index {index} of Job {job}")
            return max(pods, key=lambda p: int(p["metadata"]["resourceVersion"]))

    def disrupt(self, pod_name: str, namespace: str = "default") -> None:
        """Pod ``pod_name`` (a Job's or a bare one) is lost with its node: Failed, DisruptionTarget."""
        with self.lock:
            pod = self.objects[("pods", namespace, pod_name)]
            pod.setdefault("status", {}).update(phase="Failed", conditions=[{
                "type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
                "message": "the node is being reclaimed", "lastTransitionTime": _now()}])  # fmt: skip
            self._version += 1
            pod["metadata"]["resourceVersion"] = str(self._version)

    def _update_pod(self, job: str, index: int, namespace: str, change) -> None:
        with self.lock:
            pod = self.pod(job, index, namespace)
            change(pod)
            self._version += 1
            pod["metadata"]["resourceVersion"] = str(self._version)
            self._sync_owner(pod)

    def unschedulable(self, job: str, index: int, message: str, namespace: str = "default") -> None:
        def change(pod):
            pod["status"]["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                    "lastTransitionTime": _now(),
                }
            ]

        self._update_pod(job, index, namespace, change)

    def add_node(
        self,
        name: str,
        instance_id: str,
        zone: str = "us-east-1a",
        *,
        instance_type: str | None = None,
        capacity: str | None = None,
    ) -> None:
        """An EC2-backed Node (``spec.providerID`` ``aws:///<zone>/<instance id>``), labelled with its zone
        and, if given, its instance type and Karpenter capacity type (``spot``, ``on-demand``)."""
        labels = {"topology.kubernetes.io/zone": zone, "kubernetes.io/hostname": name}
        if instance_type:
            labels["node.kubernetes.io/instance-type"] = instance_type
        if capacity:
            labels["karpenter.sh/capacity-type"] = capacity
        with self.lock:
            self._create("nodes", "", {"metadata": {"name": name, "labels": labels},
                                       "spec": {"providerID": f"aws:///{zone}/{instance_id}"}})  # fmt: skip

    def taint(self, node: str, key: str, effect: str = "NoSchedule") -> None:
        """A taint on a node, as aws-node-termination-handler or Karpenter put one."""
        with self.lock:
            obj = self.objects[("nodes", "", node)]
            obj["spec"].setdefault("taints", []).append({"key": key, "effect": effect, "timeAdded": _now()})
            self._version += 1
            obj["metadata"]["resourceVersion"] = str(self._version)

    def run(
        self,
        job: str,
        indexes: list[int] | None = None,
        namespace: str = "default",
        nodes: dict[int, str] | None = None,
    ) -> None:
        """Pods scheduled (onto ``nodes[index]`` when given) and their trainer container started."""
        spec = self.get("jobs", job, namespace)
        for index in indexes if indexes is not None else range(spec["spec"]["completions"]):

            def change(pod, index=index):
                if nodes and index in nodes:
                    node = self.objects.get(("nodes", "", nodes[index]))
                    problem = scheduling_problem(pod, node) if node else None
                    if problem:  # what the real scheduler would never do
                        raise ValueError(
                            f"pod {pod['metadata']['name']} cannot run on node {nodes[index]}: {problem}"
                        )
                    pod["spec"]["nodeName"] = nodes[index]
                pod["status"].update(
                    phase="Running",
                    startTime=_now(),
                    podIP=f"10.0.0.{index + 10}",
                    conditions=[
                        {"type": "PodScheduled", "status": "True"},
                        {"type": "Ready", "status": "True"},
                    ],
                    containerStatuses=[
                        {
                            "name": "trainer",
                            "ready": True,
                            "restartCount": 0,
                            **_image(pod),
                            "state": {"running": {"startedAt": _now()}},
                        }
                    ],
                )

            self._update_pod(job, index, namespace, change)

    def log(self, job: str, index: int, *lines: str, namespace: str = "default") -> None:
        with self.lock:
            pod = self.pod(job, index, namespace)
            entries = self.pod_logs.setdefault((namespace, pod["metadata"]["name"]), [])
            entries.extend((time.time(), line) for line in lines)

    def exit(
        self, job: str, index: int, code: int, namespace: str = "default", disruption: str | None = None
    ) -> None:
        """The trainer container of pod ``index`` exits ``code``; ``disruption``: the DisruptionTarget
        reason."""

        def change(pod):
            phase = "Succeeded" if code == 0 else "Failed"
            conditions = [c for c in pod["status"].get("conditions", []) if c["type"] != "Ready"]
            if disruption:
                conditions.append(
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": disruption,
                        "message": "the node is being reclaimed",
                        "lastTransitionTime": _now(),
                    }
                )
            pod["status"].update(phase=phase, conditions=conditions, containerStatuses=[{
                "name": "trainer", "ready": False, "restartCount": 0, **_image(pod),
                "state": {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                         "startedAt": _now(), "finishedAt": _now()}},
            }])  # fmt: skip

        self._update_pod(job, index, namespace, change)
