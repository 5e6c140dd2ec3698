"""The ``kubernetes`` backend: a pod group as an Indexed Job and a headless Service.

Every API call goes through the cncf.kubernetes provider's ``KubernetesHook`` (its
connection, its client configuration) and its retry policy (``generic_api_retry``:
429 and 5xx answers and dropped connections are retried with backoff, honouring
Retry-After). The hook is built on first use: constructing this class calls nothing
(importing it imports the kubernetes client: ``factory.get_launcher`` does so only when
a Kubernetes launcher is asked for).

The Job controller does most of the work (see ``objects.pod_failure_policy``; an elastic group's Job
re-creates only a lost index, ``elastic_job``); what it cannot express -- a disrupted pod ends an
all-or-nothing group as preempted, an elastic group below min_nodes too long is preempted, a group pending
too long fails with "no capacity" -- is decided by ``status`` (``elastic_status``) and written on the Job
(annotation ``airflow-dtrain/outcome``), so any later look -- a restarted worker, the
triggerer -- sees the same outcome. Ending a group's pods runs its Job into its deadline (``_settle``).

The launcher's parts: ``api`` (the hook, retries, reads), ``memory`` (what a Job remembers of its
task's earlier groups and where it ran), ``group_logs`` and ``checkpoint_now``; this module creates,
watches, settles and stops groups.
"""

from __future__ import annotations

import json
import logging
import time
from functools import cached_property
from typing import TYPE_CHECKING, Any

from kubernetes.client.exceptions import ApiException

from airflow_dtrain.kubernetes import elastic_status, status as group_status
from airflow_dtrain.kubernetes.api import _MERGE_PATCH, Conflict
from airflow_dtrain.kubernetes.checkpoint_now import CheckpointNow
from airflow_dtrain.kubernetes.group_logs import GroupLogs
from airflow_dtrain.kubernetes.memory import GroupMemory
from airflow_dtrain.kubernetes.names import (
    ANNOTATION_DEADLINE,
    ANNOTATION_EARLIER,
    ANNOTATION_NODE_TIMES,
    ANNOTATION_OUTCOME,
    LABEL_GROUP,
    LABEL_MANAGED_BY,
    LABEL_TASK,
    MANAGED_BY,
    config_map_name,
    store_name,
    task_name,
)
from airflow_dtrain.kubernetes.objects import render_group
from airflow_dtrain.kubernetes.policy import KubernetesPolicy
from airflow_dtrain.launchers.base import (
    GroupState,
    GroupStatus,
    PodGroupLauncher,
    PredecessorStillRunning,
    deadline_moves,
)

if TYPE_CHECKING:
    from airflow_dtrain.job.spec import JobSpec


class KubernetesLauncher(GroupLogs, CheckpointNow, GroupMemory, PodGroupLauncher):
    """Runs pod groups as Indexed Jobs through the cncf.kubernetes provider's ``KubernetesHook``.

    :param kubernetes_conn_id: the Kubernetes connection (``kubernetes_default``: in-cluster or
        ~/.kube/config).
    :param namespace: the groups' namespace; default: the connection's, else ``default``.
    :param poll_interval: seconds between looks while waiting on the cluster (stop, relaunch).
    :param predecessor_wait_s: how long a launch waits for the pods of an earlier group of the same
        task to end before it fails; default: their terminationGracePeriodSeconds + 30.
    """

    backend = "kubernetes"
    log = logging.getLogger(__name__)

    def __init__(
        self,
        *,
        kubernetes_conn_id: str = "kubernetes_default",
        namespace: str | None = None,
        poll_interval: float = 1.0,
        predecessor_wait_s: float | None = None,
    ) -> None:
        self.kubernetes_conn_id = kubernetes_conn_id
        self._namespace = namespace
        self.poll_interval = poll_interval
        self.predecessor_wait_s = predecessor_wait_s

    # -- launch -----------------------------------------------------------------------------------
    @cached_property
    def policy(self) -> KubernetesPolicy:
        """The platform admin's policy, from the connection's extra (``dtrain_policy``)."""
        return KubernetesPolicy.from_extra(self.hook.conn_extras)

    def launch(self, name: str, spec: JobSpec, *, spent_usd: float = 0.0) -> GroupStatus:
        """Create the group's ConfigMap, headless Service and Indexed Job.

        :param spent_usd: what the job has spent so far (its ledger): the Job's activeDeadlineSeconds is
            what the rest of the budget buys at the group's price (``launchers.base.budget_deadline``).
        """
        if spec.kubernetes.namespace:
            self.namespace = spec.kubernetes.namespace  # overrides the cached default
        self.policy.check(spec, namespace=self.namespace, log=self.log)  # before any API call
        if self._job(name) is not None:
            raise ValueError(f"group {name!r} already exists in namespace {self.namespace}")
        self._wait_for_predecessors(name)
        objects = render_group(name, spec, namespace=self.namespace, spent_usd=spent_usd,
                               compile_cache_claim=self.policy.compile_cache_claim)  # fmt: skip
        (config_map, service), store, job = objects[:2], objects[2:-1], objects[-1]
        earlier = self._earlier_outcomes(name)
        if earlier:
            job["metadata"]["annotations"][ANNOTATION_EARLIER] = json.dumps(earlier, sort_keys=True)
        deadline = job["spec"].get("activeDeadlineSeconds")
        self.log.info(
            "Creating group %s in namespace %s: Indexed Job of %d pod(s), image %s, %s capacity%s%s; %s",
            name, self.namespace, spec.num_nodes, spec.kubernetes.image, spec.capacity,
            f" in {spec.zone}" if spec.zone else "",
            f" on {spec.instance_type}" if spec.instance_type else "",
            f"the cluster stops it after {deadline}s (the budget left at its price)" if deadline
            else "no deadline (no budget, or no price)",
        )  # fmt: skip
        created: list[tuple[Any, str]] = []
        try:
            self._api(self._core.create_namespaced_config_map, self.namespace, config_map)
            created.append((self._core.delete_namespaced_config_map, config_map["metadata"]["name"]))
            self._api(self._core.create_namespaced_service, self.namespace, service)
            created.append((self._core.delete_namespaced_service, name))
            for obj in store:  # an elastic group's rendezvous store, up before its nodes (kubernetes.store)
                create, _, delete = self._verbs(obj["kind"])
                self._api(create, self.namespace, obj)
                created.append((delete, obj["metadata"]["name"]))
            job = self._api(self._batch.create_namespaced_job, self.namespace, job)
        except (ApiException, Conflict) as err:
            for delete, object_name in created:  # leave nothing half-made behind
                self._api(delete, object_name, self.namespace, missing_ok=True)
            if isinstance(err, Conflict):
                raise ValueError(f"group {name!r} already exists in namespace {self.namespace}") from None
            raise
        # Owned by the Job: deleting the Job (kubectl delete job, TTL) garbage-collects them too.
        owner = {"metadata": {"ownerReferences": [{
            "apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job["metadata"]["uid"],
            "blockOwnerDeletion": False,
        }]}}  # fmt: skip
        self._api(self._core.patch_namespaced_config_map, config_map_name(name), self.namespace, owner,
                  _content_type=_MERGE_PATCH)  # fmt: skip
        self._api(
            self._core.patch_namespaced_service, name, self.namespace, owner, _content_type=_MERGE_PATCH
        )
        for obj in store:
            _, patch, _ = self._verbs(obj["kind"])
            self._api(patch, obj["metadata"]["name"], self.namespace, owner, _content_type=_MERGE_PATCH)
        return self.status(name)

    def _verbs(self, kind: str) -> tuple[Any, Any, Any]:
        """(create, patch, delete) of a store object: a Service or a Pod."""
        core = self._core
        if kind == "Pod":
            return core.create_namespaced_pod, core.patch_namespaced_pod, core.delete_namespaced_pod
        return core.create_namespaced_service, core.patch_namespaced_service, core.delete_namespaced_service

    def _wait_for_predecessors(self, name: str) -> None:
        """Earlier groups of this task must be gone: two groups never write one checkpoint at once.

        Their pods get their grace period to save and exit (the pods of a Job ended by the launcher or
        deleted are saving their step); a pod still there after it (a node that stopped answering, a pod
        stuck terminating) fails the launch, naming the group, rather than starting a second writer.
        """
        selector = f"{LABEL_TASK}={task_name(name)},{LABEL_GROUP}!={name}"
        deadline = None
        while True:
            alive = [
                p for p in self._pods(selector)
                if p["status"].get("phase") in ("Pending", "Running")
                or p["metadata"].get("deletionTimestamp")
            ]  # fmt: skip
            if not alive:
                return
            if deadline is None:
                wait = self.predecessor_wait_s
                if wait is None:
                    wait = max(p["spec"].get("terminationGracePeriodSeconds", 30) for p in alive) + 30
                deadline = time.monotonic() + wait
            if time.monotonic() > deadline:
                groups = sorted({p["metadata"].get("labels", {}).get(LABEL_GROUP, "?") for p in alive})
                raise PredecessorStillRunning(
                    f"group {name} not launched: group {', '.join(groups)} of the same task is still "
                    f"running in namespace {self.namespace} ({len(alive)} pod(s): "
                    f"{', '.join(p['metadata']['name'] for p in alive)}) after {wait:.0f}s; two groups would "
                    f"write one checkpoint directory. Delete it (kubectl delete job {groups[0]}) or wait, "
                    "then retry"
                )
            self.log.info(
                "Waiting for %d pod(s) of an earlier group to end (saving their checkpoint)", len(alive)
            )
            time.sleep(self.poll_interval)

    # -- find / status ---------------------------------------------------------------------------
    def find(self, prefix: str) -> list[str]:
        """The groups whose Jobs exist, and the earlier groups their Jobs remember (TTL-deleted ones)."""
        jobs = self._api(
            self._batch.list_namespaced_job, self.namespace, label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY}"
        )["items"]
        created: dict[str, str] = {}
        for job in jobs:
            for other, entry in group_status.earlier(job).items():
                if other.startswith(prefix):
                    created.setdefault(other, entry.get("created", ""))
        for job in jobs:
            if job["metadata"]["name"].startswith(prefix):
                created[job["metadata"]["name"]] = job["metadata"].get("creationTimestamp", "")
        return sorted(created, key=lambda n: (created[n], n))

    def status(self, name: str) -> GroupStatus:
        job = self._job(name)
        if job is None:
            entry = self._remembered(name)
            if entry is not None:  # its Job is gone (TTL), a later group of the task remembers its outcome
                return group_status.status_of_entry(name, entry)
            return GroupStatus(name, GroupState.NOT_FOUND, f"no Job {name!r} in namespace {self.namespace}")
        recorded = group_status.recorded(name, job)
        if recorded is not None:
            return recorded
        pods = self._pods(f"{LABEL_GROUP}={name}")
        settings = elastic_status.settings(job)
        elastic = settings is not None
        if elastic and settings.get("standalone_store"):
            store = self._api(
                self._core.read_namespaced_pod, store_name(name), self.namespace, missing_ok=True
            )
            seen = elastic_status.observe(name, job, pods, self._log_tail, store_pod=store)
        else:
            observe = elastic_status.observe if elastic else group_status.observe
            seen = observe(name, job, pods, self._log_tail)
        self._record_placement(name, job, pods, ended=seen.settle or seen.status.state.terminal)
        if elastic:
            self._record_node_times(name, job, pods)
        if seen.settle:
            return self._settle(name, job, seen.status, end_pods=seen.end_pods)
        return seen.status

    def node_changes(self, name: str) -> list[tuple[float, int]]:
        """(wall time, pods running from then on) of group ``name``, for billing: an elastic group's from when
        each pod started and ended (ends with 0 once all ended), an all-or-nothing group's one entry at its
        Job's start with num_nodes; [] when unknown (not started, or its Job is gone: bill num_nodes)."""
        job = self._job(name)
        if job is None:
            return []
        if elastic_status.settings(job) is None:
            started = group_status.parse_time((job.get("status") or {}).get("startTime"))
            return [] if started is None else [(started, job["spec"].get("completions") or 1)]
        times = self._record_node_times(name, job, self._pods(f"{LABEL_GROUP}={name}"))
        return elastic_status.node_timeline(times)

    def _record_node_times(
        self, name: str, job: dict[str, Any], pods: list[dict[str, Any]]
    ) -> elastic_status.Times:
        """Bring the pods' run times written on the Job up to date (a patch only when they changed): the
        pods go (replaced, ended, TTL), the node count over time stays."""
        recorded = elastic_status.recorded_times(job)
        times = elastic_status.pod_times(recorded, pods, time.time())
        if times != recorded and not job["metadata"].get("deletionTimestamp"):
            patch = {"metadata": {"annotations": {ANNOTATION_NODE_TIMES: json.dumps(times, sort_keys=True)}}}
            self._api(self._batch.patch_namespaced_job, name, self.namespace, patch,
                      _content_type=_MERGE_PATCH, missing_ok=True)  # fmt: skip
        return times

    def _settle(self, name: str, job: dict[str, Any], status: GroupStatus, *, end_pods: bool) -> GroupStatus:
        """Write the verdict on the Job; with ``end_pods`` also end its pods.

        The pods are ended by the Job's own deadline: activeDeadlineSeconds becomes 1, long passed, so the Job
        controller deletes them (SIGTERM and terminationGracePeriodSeconds: every rank still alive saves its
        step, as on a preemption notice) and fails the Job (DeadlineExceeded, read no further: the verdict
        written here is the outcome). A failed Job is finished, so ``ttlSecondsAfterFinished`` deletes it
        with its Service and ConfigMap; a suspended one is not finished and would stay for ever, and Kueue
        requeues a Job that is suspended, not one that failed at its deadline (kubernetes-sigs/kueue#1091):
        re-admitted, the ended group's pods would start again beside its successor. A Job that never started
        (suspended, waiting for Kueue's admission: no pods, and no startTime for a deadline to count from) is
        suspended.
        """
        patch: dict[str, Any] = {
            "metadata": {"annotations": {ANNOTATION_OUTCOME: json.dumps(status.to_dict())}}
        }
        if end_pods:
            started = (job.get("status") or {}).get("startTime") and not job["spec"].get("suspend")
            patch["spec"] = {"activeDeadlineSeconds": 1} if started else {"suspend": True}
        self.log.info("Group %s is %s: %s", name, status.state.value, status.message.splitlines()[0])
        self._api(self._batch.patch_namespaced_job, name, self.namespace, patch, _content_type=_MERGE_PATCH,
                  missing_ok=True)  # fmt: skip
        if (elastic_status.settings(job) or {}).get("standalone_store"):
            self._end_store(name)  # nothing left to rendezvous: not kept until the Job's TTL
        return status

    def _end_store(self, name: str) -> None:
        """Delete an elastic group's store pod and Service (absent ones are fine)."""
        for kind in ("Pod", "Service"):
            self._api(self._verbs(kind)[2], store_name(name), self.namespace, missing_ok=True)

    def move_deadline(self, name: str, deadline: dict[str, Any]) -> int | None:
        """Patch the running Job's activeDeadlineSeconds (a field a Job may change while it runs) and its
        deadline annotation, which the at-budget verdict quotes; never on a Job that ended."""
        job = self._job(name)
        current = (job or {}).get("spec", {}).get("activeDeadlineSeconds")
        if (
            job is None
            or current is None
            or not deadline_moves(current, deadline["seconds"])
            or group_status.recorded(name, job)
        ):
            return None
        patch = {"metadata": {"annotations": {ANNOTATION_DEADLINE: json.dumps(deadline, sort_keys=True)}},
                 "spec": {"activeDeadlineSeconds": deadline["seconds"]}}  # fmt: skip
        self._api(self._batch.patch_namespaced_job, name, self.namespace, patch, _content_type=_MERGE_PATCH,
                  missing_ok=True)  # fmt: skip
        return int(current)

    def stop(self, name: str, grace_period_s: float = 30.0) -> GroupStatus:
        """Delete the Job (foreground: its pods first), its Service and ConfigMap.

        The pods get SIGTERM and their terminationGracePeriodSeconds to save a checkpoint;
        this waits up to ``grace_period_s`` (+ a margin) for them to be gone.
        """
        job = self._job(name)
        if job is None:
            return GroupStatus(name, GroupState.NOT_FOUND, f"no Job {name!r} in namespace {self.namespace}")
        self.log.info("Deleting group %s (Job, Service, ConfigMap) in namespace %s", name, self.namespace)
        foreground = {"propagationPolicy": "Foreground"}
        self._api(self._batch.delete_namespaced_job, name, self.namespace, body=foreground, missing_ok=True)
        self._api(
            self._core.delete_namespaced_service, name, self.namespace, body=foreground, missing_ok=True
        )
        self._api(
            self._core.delete_namespaced_config_map, config_map_name(name), self.namespace, missing_ok=True
        )
        if (elastic_status.settings(job) or {}).get("standalone_store"):
            self._end_store(name)
        deadline = time.monotonic() + grace_period_s + 15
        while self._job(name) is not None:
            if time.monotonic() > deadline:
                return GroupStatus(
                    name, GroupState.STOPPED, "deleted on request; its pods are still terminating"
                )
            time.sleep(self.poll_interval)
        return GroupStatus(name, GroupState.STOPPED, "stopped on request: Job, Service and ConfigMap deleted")
