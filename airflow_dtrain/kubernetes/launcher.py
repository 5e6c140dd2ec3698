"""The ``kubernetes`` backend: a pod group as an Indexed Job and a headless Service.

Every API call goes through the cncf.kubernetes provider's ``KubernetesHook`` (its
connection, its client configuration) and its retry policy (``generic_api_retry``:
429 and 5xx answers and dropped connections are retried with backoff, honouring
Retry-After). The hook is built on first use: constructing this class calls nothing
(importing it imports the kubernetes client: ``factory.get_launcher`` does so only when
a Kubernetes launcher is asked for).

The Job controller does most of the work (see ``objects.pod_failure_policy``); what it
cannot express -- a disrupted pod ends the whole group as preempted, a group pending too
long fails with "no capacity" -- is decided by ``status`` and written on the Job
(annotation ``airflow-dtrain/outcome``), so any later look -- a restarted worker, the
triggerer -- sees the same outcome. Ending a group's pods runs its Job into its deadline (``_settle``).
"""

from __future__ import annotations

import json
import logging
import math
import time
from datetime import datetime, timezone
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.providers.cncf.kubernetes.kubernetes_helper_functions import generic_api_retry
from kubernetes.client.exceptions import ApiException

from airflow_dtrain.kubernetes import placement as group_placement
from airflow_dtrain.kubernetes import status as group_status
from airflow_dtrain.kubernetes.objects import (
    ANNOTATION_CHECKPOINT_DELIVERY,
    ANNOTATION_DEADLINE,
    ANNOTATION_EARLIER,
    ANNOTATION_OUTCOME,
    ANNOTATION_PLACEMENT,
    CHECKPOINT_NOW_ANNOTATION,
    CONTAINER,
    LABEL_GROUP,
    LABEL_MANAGED_BY,
    LABEL_TASK,
    MANAGED_BY,
    config_map_name,
    render_group,
    task_name,
)
from airflow_dtrain.kubernetes.policy import KubernetesPolicy
from airflow_dtrain.kubernetes.status import pod_index
from airflow_dtrain.launchers.base import (
    GroupState,
    GroupStatus,
    LogChunk,
    PodGroupLauncher,
    PredecessorStillRunning,
)
from airflow_dtrain.launchers.torchrun import LAUNCH_MODULE

if TYPE_CHECKING:
    from airflow_dtrain.spec import JobSpec

_MERGE_PATCH = "application/merge-patch+json"
# Log lines are fetched from slightly before the last one seen: the kubelet's clock is not ours.
_LOG_OVERLAP_S = 30
# SIGUSR1 to the training processes: every child of the group's torchrun agent, whatever program it runs
# (the bundled trainer or your own), never the agent itself (for which it is fatal) nor the workers' own
# children (data loader workers would die of it). Stdlib only: it runs in the pod, under the image's python.
_SIGNAL_WORKERS = (
    """
import os, signal, sys
tag = b"DTRAIN_GROUP_NAME=" + sys.argv[1].encode()
procs = {}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
        if tag in open(f"/proc/{pid}/environ", "rb").read().split(b"\\0"):
            status = open(f"/proc/{pid}/status", "rb").read().split(b"\\n")
            ppid = next(int(line.split()[1]) for line in status if line.startswith(b"PPid:"))
            procs[int(pid)] = (argv, ppid)
    except (OSError, StopIteration, ValueError, IndexError):
        pass
agents = {pid for pid, (argv, _) in procs.items() if b"%s" in argv}
asked = 0
for pid, (_, ppid) in procs.items():
    if ppid in agents:
        try:
            os.kill(pid, signal.SIGUSR1)
            asked += 1
        except OSError:
            pass
print(asked)
"""
    % LAUNCH_MODULE
)


class Conflict(Exception):
    """The API server answered 409: the object exists. Not an ApiException, so never retried."""


def _log_time_ns(stamp: str) -> int:
    """RFC3339Nano (``2026-01-02T03:04:05.123456789Z``) to integer nanoseconds: exact, comparable."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    seconds = datetime.fromisoformat(whole).replace(tzinfo=timezone.utc).timestamp()
    return int(seconds) * 1_000_000_000 + int((fraction + "000000000")[:9] or 0)


class KubernetesLauncher(PodGroupLauncher):
    """Runs pod groups as Indexed Jobs through the cncf.kubernetes provider's ``KubernetesHook``.

    :param kubernetes_conn_id: the Kubernetes connection (``kubernetes_default``: in-cluster or ~/.kube/config).
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

    # -- the API, through the provider's hook ---------------------------------------------------
    @cached_property
    def hook(self):
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        return KubernetesHook(conn_id=self.kubernetes_conn_id)

    @cached_property
    def namespace(self) -> str:
        return self._namespace or self.hook.get_namespace() or "default"

    @generic_api_retry
    def _api(self, method, *args: Any, missing_ok: bool = False, text: bool = False, **kwargs: Any) -> Any:
        """Call ``method`` of one of the hook's clients; the JSON body as plain dicts (``text``: as a string).

        Retried by the provider's ``generic_api_retry``: 429 (after its Retry-After), 5xx and
        dropped connections. A 409 is raised as ``Conflict``: the object exists, asking again
        cannot change that. ``missing_ok``: None for a 404.
        """
        try:
            response = method(*args, _preload_content=False, **kwargs)
        except ApiException as err:
            if err.status == 404 and missing_ok:
                return None
            if err.status == 409:
                raise Conflict(f"{err.status} {err.reason}") from err
            raise
        data = response.data or b""
        return data.decode("utf-8", "replace") if text else json.loads(data or b"null")

    @property
    def _core(self):
        return self.hook.core_v1_client

    @property
    def _batch(self):
        return self.hook.batch_v1_client

    def _job(self, name: str) -> dict[str, Any] | None:
        return self._api(self._batch.read_namespaced_job, name, self.namespace, missing_ok=True)

    def _pods(self, selector: str) -> list[dict[str, Any]]:
        pods = self._api(self._core.list_namespaced_pod, self.namespace, label_selector=selector)["items"]
        return sorted(pods, key=lambda p: (pod_index(p), p["metadata"].get("creationTimestamp", "")))

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
        config_map, service, job = render_group(name, spec, namespace=self.namespace, spent_usd=spent_usd)
        earlier = self._earlier_outcomes(name)
        if earlier:
            job["metadata"]["annotations"][ANNOTATION_EARLIER] = json.dumps(earlier, sort_keys=True)
        deadline = job["spec"].get("activeDeadlineSeconds")
        self.log.info(
            "Creating group %s in namespace %s: Indexed Job of %d pod(s), image %s, %s capacity%s%s; %s",
            name, self.namespace, spec.num_nodes, spec.kubernetes.image, spec.capacity,
            f" in {spec.zone}" if spec.zone else "", f" on {spec.instance_type}" if spec.instance_type else "",
            f"the cluster stops it after {deadline}s (the budget left at its price)" if deadline
            else "no deadline (no budget, or no price)",
        )  # fmt: skip
        created: list[tuple[Any, str]] = []
        try:
            self._api(self._core.create_namespaced_config_map, self.namespace, config_map)
            created.append((self._core.delete_namespaced_config_map, config_map["metadata"]["name"]))
            self._api(self._core.create_namespaced_service, self.namespace, service)
            created.append((self._core.delete_namespaced_service, name))
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
        return self.status(name)

    def _wait_for_predecessors(self, name: str) -> None:
        """Earlier groups of this task must be gone: two groups never write one checkpoint at once.

        Their pods get their grace period to save and exit (the pods of a Job ended by the launcher or
        deleted are saving their step); a pod still there after it (a node that stopped answering, a pod stuck
        terminating) fails the launch, naming the group, rather than starting a second writer.
        """
        selector = f"{LABEL_TASK}={task_name(name)},{LABEL_GROUP}!={name}"
        deadline = None
        while True:
            alive = [
                p for p in self._pods(selector)
                if p["status"].get("phase") in ("Pending", "Running") or p["metadata"].get("deletionTimestamp")
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
                    f"group {name} not launched: group {', '.join(groups)} of the same task is still running in "
                    f"namespace {self.namespace} ({len(alive)} pod(s): "
                    f"{', '.join(p['metadata']['name'] for p in alive)}) after {wait:.0f}s; two groups would "
                    f"write one checkpoint directory. Delete it (kubectl delete job {groups[0]}) or wait, then retry"
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
        seen = group_status.observe(name, job, pods, self._log_tail)
        self._record_placement(name, job, pods, ended=seen.settle or seen.status.state.terminal)
        if seen.settle:
            return self._settle(name, job, seen.status, end_pods=seen.end_pods)
        return seen.status

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

    def _log_tail(self, pod_name: str) -> str | None:
        return self._api(
            self._core.read_namespaced_pod_log, pod_name, self.namespace,
            container=CONTAINER, tail_lines=group_status.TAIL_LINES, missing_ok=True, text=True,
        )  # fmt: skip

    def _settle(self, name: str, job: dict[str, Any], status: GroupStatus, *, end_pods: bool) -> GroupStatus:
        """Write the verdict on the Job; with ``end_pods`` also end its pods.

        The pods are ended by the Job's own deadline: activeDeadlineSeconds becomes 1, long passed, so the Job
        controller deletes them (SIGTERM and terminationGracePeriodSeconds: every rank still alive saves its
        step, as on a preemption notice) and fails the Job (DeadlineExceeded, read no further: the verdict
        written here is the outcome). A failed Job is finished, so ``ttlSecondsAfterFinished`` deletes it with
        its Service and ConfigMap; a suspended one is not finished and would stay for ever, and Kueue requeues
        a Job that is suspended, not one that failed at its deadline (kubernetes-sigs/kueue#1091): re-admitted,
        the ended group's pods would start again beside its successor. A Job that never started (suspended,
        waiting for Kueue's admission: no pods, and no startTime for a deadline to count from) is suspended.
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
        return status

    # -- logs --------------------------------------------------------------------------------------
    def logs(self, name: str, cursor: Any = None) -> LogChunk:
        """New lines of every pod, ``[nodeN]``-prefixed; the cursor holds, per pod, the last line's time."""
        positions: dict[str, list[int]] = dict(cursor or {})
        lines: list[str] = []
        for pod in self._pods(f"{LABEL_GROUP}={name}"):
            if not group_status.started(pod):
                continue
            pod_name = pod["metadata"]["name"]
            last, seen_at_last = positions.get(pod_name, (-1, 0))
            kwargs: dict[str, Any] = {"container": CONTAINER, "timestamps": True}
            if last >= 0:
                kwargs["since_seconds"] = max(1, math.ceil(time.time() - last / 1e9) + _LOG_OVERLAP_S)
            try:
                text = self._api(
                    self._core.read_namespaced_pod_log,
                    pod_name,
                    self.namespace,
                    missing_ok=True,
                    text=True,
                    **kwargs,
                )
            except ApiException as err:
                if err.status == 400:  # the container is not running yet, or no longer exists
                    continue
                raise
            skip = seen_at_last
            new_last, new_seen = last, seen_at_last
            for raw in (text or "").splitlines():
                stamp, _, line = raw.partition(" ")
                try:
                    at = _log_time_ns(stamp)
                except ValueError:
                    continue
                if at < last:
                    continue
                if at == last and skip:
                    skip -= 1
                    continue
                lines.append(f"[node{pod_index(pod)}]{line}")
                new_last, new_seen = (at, new_seen + 1) if at == new_last else (at, 1)
            positions[pod_name] = [new_last, new_seen]
        return LogChunk(lines, positions)

    # -- checkpoint_now / stop -------------------------------------------------------------------
    def checkpoint_now(self, name: str) -> int:
        """Ask every running pod of ``name`` to checkpoint at its next step and carry on.

        By default (the Job's ``checkpoint-now`` annotation says ``annotation``) a new value of the pod
        annotation ``dtrain.io/checkpoint-now``: the kubelet writes the pod's annotations into its
        downward-API volume and the node agent (trainer/launch.py) sends its workers SIGUSR1; returns how
        many pods were asked. Needs only ``pods: patch``. With ``exec``: SIGUSR1 through ``pods/exec`` at
        once; returns how many processes were signalled."""
        job = self._job(name)
        delivery = ((job or {}).get("metadata", {}).get("annotations") or {}).get(
            ANNOTATION_CHECKPOINT_DELIVERY
        )
        if delivery == "exec":
            return self._checkpoint_now_exec(name)
        request = str(time.time_ns())
        asked = 0
        for pod in self._pods(f"{LABEL_GROUP}={name}"):
            if pod["status"].get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
                continue
            patch = {"metadata": {"annotations": {CHECKPOINT_NOW_ANNOTATION: request}}}
            self._api(self._core.patch_namespaced_pod, pod["metadata"]["name"], self.namespace, patch,
                      _content_type=_MERGE_PATCH)  # fmt: skip
            asked += 1
        self.log.info("checkpoint-now %s: annotated %d running pod(s) of %s", request, asked, name)
        return asked

    def _checkpoint_now_exec(self, name: str) -> int:
        """SIGUSR1 to the training processes of every running pod (``pods/exec``); returns how many
        were signalled. A pod where the exec fails is logged (with the command's stderr) and skipped."""
        from kubernetes.stream import stream
        from kubernetes.stream.ws_client import STDERR_CHANNEL, STDOUT_CHANNEL

        asked = 0
        for pod in self._pods(f"{LABEL_GROUP}={name}"):
            if pod["status"].get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
                continue
            pod_name = pod["metadata"]["name"]
            client = stream(
                self._core.connect_get_namespaced_pod_exec, pod_name, self.namespace,
                container=CONTAINER, command=["python", "-c", _SIGNAL_WORKERS, name],
                stdout=True, stderr=True, stdin=False, tty=False, _preload_content=False,
            )  # fmt: skip
            try:
                client.run_forever(timeout=30)
                stdout, stderr = client.read_channel(STDOUT_CHANNEL), client.read_channel(STDERR_CHANNEL)
                code = client.returncode
            finally:
                client.close()
            lines = stdout.strip().splitlines()
            if code != 0 or not lines or not lines[-1].isdigit():
                self.log.warning("checkpoint-now in pod %s/%s failed (exit code %s): %s", self.namespace, pod_name,
                                 code, (stderr or stdout).strip()[-500:] or "no output")  # fmt: skip
                continue
            asked += int(lines[-1])
        return asked

    def shorten_deadline(self, name: str, deadline: dict[str, Any]) -> int | None:
        """Patch the running Job's activeDeadlineSeconds (a field a Job may change while it runs) and its
        deadline annotation, which the at-budget verdict quotes; only ever earlier, never on a Job that ended."""
        job = self._job(name)
        current = (job or {}).get("spec", {}).get("activeDeadlineSeconds")
        if (
            job is None
            or current is None
            or deadline["seconds"] >= current
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
        if self._job(name) is None:
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
        deadline = time.monotonic() + grace_period_s + 15
        while self._job(name) is not None:
            if time.monotonic() > deadline:
                return GroupStatus(
                    name, GroupState.STOPPED, "deleted on request; its pods are still terminating"
                )
            time.sleep(self.poll_interval)
        return GroupStatus(name, GroupState.STOPPED, "stopped on request: Job, Service and ConfigMap deleted")
