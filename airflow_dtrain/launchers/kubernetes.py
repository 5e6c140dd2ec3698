"""The ``kubernetes`` backend: a pod group as an Indexed Job and a headless Service.

Every API call goes through the cncf.kubernetes provider's ``KubernetesHook`` (its
connection, its client configuration), built on first use: constructing this
class, or importing this module, calls nothing.

The Job controller does most of the work: its podFailurePolicy fails the Job when
a node exits 75 (preempted) or anything else non-zero, and ignores disruptions.
What Kubernetes cannot express, this class does when it looks at the group:

* a disrupted pod (``DisruptionTarget``) ends the whole group as *preempted*: the
  launcher suspends the Job, so every other pod gets SIGTERM and saves too;
* a group not running after ``pending_timeout_s`` fails with "no capacity".

Both verdicts are written on the Job (annotation ``airflow-dtrain/outcome``), so
any later look -- a restarted worker, the triggerer -- sees the same outcome.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from datetime import datetime, timezone
from functools import cached_property
from typing import Any

from airflow_dtrain.kubernetes_objects import (
    ANNOTATION_OUTCOME,
    ANNOTATION_PENDING_TIMEOUT,
    CONTAINER,
    LABEL_GROUP,
    LABEL_MANAGED_BY,
    LABEL_TASK,
    MANAGED_BY,
    config_map_name,
    render_group,
    task_name,
)
from airflow_dtrain.launchers.base import (
    PREEMPTED_EXIT_CODE,
    GroupState,
    GroupStatus,
    LogChunk,
    PodGroupLauncher,
)
from airflow_dtrain.spec import JobSpec

_MERGE_PATCH = "application/merge-patch+json"
_RETRY_STATUS = {429, 500, 502, 503, 504}
# Log lines are fetched from slightly before the last one seen: the kubelet's clock is not ours.
_LOG_OVERLAP_S = 30
_TAIL_LINES = 20
_FAILJOB_MESSAGE = re.compile(r"for pod [^/\s]+/(?P<pod>\S+) failed with exit code (?P<code>-?\d+)")
# Pending reasons that are not a lack of capacity: say so instead of "no capacity".
_CONFIG_PROBLEMS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError"}
# SIGUSR1 to the training processes (not their torchrun agent, for which it is fatal), stdlib only.
_SIGNAL_WORKERS = """
import os, signal
asked = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
        if b"-m" in argv and b"trainer" in argv and b"trainer.launch" not in argv:
            os.kill(int(pid), signal.SIGUSR1)
            asked += 1
    except OSError:
        pass
print(asked)
"""


def _time(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _log_time_ns(stamp: str) -> int:
    """RFC3339Nano (``2026-01-02T03:04:05.123456789Z``) to integer nanoseconds: exact, comparable."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    seconds = datetime.fromisoformat(whole).replace(tzinfo=timezone.utc).timestamp()
    return int(seconds) * 1_000_000_000 + int((fraction + "000000000")[:9] or 0)


def _index(pod: dict[str, Any]) -> int:
    meta = pod["metadata"]
    value = (meta.get("annotations") or {}).get("batch.kubernetes.io/job-completion-index")
    value = value or (meta.get("labels") or {}).get("batch.kubernetes.io/job-completion-index", "-1")
    return int(value)


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


def _terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            state = status.get("state") or {}
            return state.get("terminated") or (status.get("lastState") or {}).get("terminated")
    return None


def _started(pod: dict[str, Any]) -> bool:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            state = status.get("state") or {}
            return "running" in state or "terminated" in state
    return False


class KubernetesLauncher(PodGroupLauncher):
    """Runs pod groups as Indexed Jobs through the cncf.kubernetes provider's ``KubernetesHook``.

    :param kubernetes_conn_id: the Kubernetes connection (``kubernetes_default``: in-cluster or ~/.kube/config).
    :param namespace: the groups' namespace; default: the connection's, else ``default``.
    :param poll_interval: seconds between looks while waiting on the cluster (stop, relaunch).
    """

    backend = "kubernetes"
    log = logging.getLogger(__name__)

    def __init__(
        self,
        *,
        kubernetes_conn_id: str = "kubernetes_default",
        namespace: str | None = None,
        poll_interval: float = 1.0,
    ) -> None:
        self.kubernetes_conn_id = kubernetes_conn_id
        self._namespace = namespace
        self.poll_interval = poll_interval

    # -- the API, through the provider's hook ---------------------------------------------------
    @cached_property
    def hook(self):
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        return KubernetesHook(conn_id=self.kubernetes_conn_id)

    @cached_property
    def namespace(self) -> str:
        return self._namespace or self.hook.get_namespace() or "default"

    def _api(self, method, *args: Any, missing_ok: bool = False, text: bool = False, **kwargs: Any) -> Any:
        """Call ``method`` of one of the hook's clients; the JSON body as plain dicts (``text``: as a string).

        Retries what a busy API server answers (429, 5xx) and dropped connections.
        """
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        for attempt in range(4):
            try:
                response = method(*args, _preload_content=False, **kwargs)
                data = response.data or b""
                return data.decode("utf-8", "replace") if text else json.loads(data or b"null")
            except ApiException as err:
                if err.status == 404 and missing_ok:
                    return None
                if err.status not in _RETRY_STATUS or attempt == 3:
                    raise
            except HTTPError:
                if attempt == 3:
                    raise
            time.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")

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
        return sorted(pods, key=lambda p: (_index(p), p["metadata"].get("creationTimestamp", "")))

    # -- launch -----------------------------------------------------------------------------------
    def launch(self, name: str, spec: dict[str, Any]) -> GroupStatus:
        job_spec = JobSpec.from_dict(spec)
        if job_spec.kubernetes.namespace:
            self.namespace = job_spec.kubernetes.namespace  # overrides the cached default
        if self._job(name) is not None:
            raise ValueError(f"group {name!r} already exists in namespace {self.namespace}")
        self._wait_for_predecessors(name)
        config_map, service, job = render_group(name, job_spec, namespace=self.namespace)
        self.log.info(
            "Creating group %s in namespace %s: Indexed Job of %d pod(s), image %s",
            name, self.namespace, job_spec.num_nodes, job_spec.kubernetes.image,
        )  # fmt: skip
        from kubernetes.client.exceptions import ApiException

        created: list[tuple[Any, str]] = []
        try:
            self._api(self._core.create_namespaced_config_map, self.namespace, config_map)
            created.append((self._core.delete_namespaced_config_map, config_map["metadata"]["name"]))
            self._api(self._core.create_namespaced_service, self.namespace, service)
            created.append((self._core.delete_namespaced_service, name))
            job = self._api(self._batch.create_namespaced_job, self.namespace, job)
        except ApiException as err:
            for delete, object_name in created:  # leave nothing half-made behind
                self._api(delete, object_name, self.namespace, missing_ok=True)
            if err.status == 409:
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
        """Earlier groups of this task must be gone: two groups never write one checkpoint at once."""
        selector = f"{LABEL_TASK}={task_name(name)},{LABEL_GROUP}!={name}"
        deadline = None
        while True:
            alive = [
                p for p in self._pods(selector)
                if p["status"].get("phase") in ("Pending", "Running") or p["metadata"].get("deletionTimestamp")
            ]  # fmt: skip
            if not alive:
                return
            grace = max(p["spec"].get("terminationGracePeriodSeconds", 30) for p in alive)
            deadline = deadline or time.monotonic() + grace + 30
            if time.monotonic() > deadline:
                self.log.warning(
                    "Pods of an earlier group are still there after %ds: %s",
                    grace + 30, ", ".join(p["metadata"]["name"] for p in alive),
                )  # fmt: skip
                return
            self.log.info(
                "Waiting for %d pod(s) of an earlier group to end (saving their checkpoint)", len(alive)
            )
            time.sleep(self.poll_interval)

    # -- find / status ---------------------------------------------------------------------------
    def find(self, prefix: str) -> list[str]:
        jobs = self._api(
            self._batch.list_namespaced_job, self.namespace, label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY}"
        )["items"]
        found = [j for j in jobs if j["metadata"]["name"].startswith(prefix)]
        found.sort(key=lambda j: (j["metadata"].get("creationTimestamp", ""), j["metadata"]["name"]))
        return [j["metadata"]["name"] for j in found]

    def status(self, name: str) -> GroupStatus:
        job = self._job(name)
        if job is None:
            return GroupStatus(name, GroupState.NOT_FOUND, f"no Job {name!r} in namespace {self.namespace}")
        meta, spec = job["metadata"], job["spec"]
        annotations = meta.get("annotations") or {}
        if ANNOTATION_OUTCOME in annotations:
            outcome = json.loads(annotations[ANNOTATION_OUTCOME])
            codes = {int(k): v for k, v in outcome.get("node_exit_codes", {}).items()}
            return GroupStatus(name, GroupState(outcome["state"]), outcome["message"], codes)
        if meta.get("deletionTimestamp"):
            return GroupStatus(name, GroupState.STOPPED, "the Job is being deleted")
        pods = self._pods(f"{LABEL_GROUP}={name}")
        codes: dict[int, int | None] = {}
        for pod in pods:  # the newest pod of each index
            terminated = _terminated(pod)
            codes[_index(pod)] = terminated.get("exitCode") if terminated else None
        nodes = spec.get("completions") or 1
        if _condition(job, "Complete") or _condition(job, "SuccessCriteriaMet"):
            return GroupStatus(name, GroupState.SUCCEEDED, f"all {nodes} node(s) exited 0", codes)
        finished = bool(_condition(job, "Failed") or _condition(job, "FailureTarget"))
        verdict = self._verdict(job, pods)
        if verdict is not None:
            state, message = verdict
            return self._settle(name, GroupStatus(name, state, message, codes), end_pods=not finished)
        if finished:  # failed without a pod to blame (deadline, API errors): nothing to resume from
            cond = _condition(job, "Failed") or _condition(job, "FailureTarget")
            return self._settle(
                name, GroupStatus(name, GroupState.FAILED, f"{cond.get('reason')}: {cond.get('message')}", codes),
                end_pods=False,
            )  # fmt: skip
        return self._pending_or_running(name, job, pods, codes)

    def _verdict(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> tuple[GroupState, str] | None:
        """Preempted or failed, decided by whichever happened first; None while nothing has."""
        events: list[tuple[float, int, str, str]] = []  # (when, 0 failed / 1 preempted, message, pod)
        now = time.time()
        first_pod_of: dict[int, str] = {}
        for pod in pods:
            index, pod_name = _index(pod), pod["metadata"]["name"]
            terminated = _terminated(pod) or {}
            code = terminated.get("exitCode")
            finished_at = _time(terminated.get("finishedAt")) or now
            disruption = _condition(pod, "DisruptionTarget")
            if disruption:
                when = _time(disruption.get("lastTransitionTime")) or finished_at
                why = f"{disruption.get('reason', 'disrupted')}: {disruption.get('message', '')}".rstrip(": ")
                events.append((when, 1, f"node {index} (pod {pod_name}) was disrupted ({why})", pod_name))
            elif code == PREEMPTED_EXIT_CODE:
                events.append(
                    (
                        finished_at,
                        1,
                        f"node {index} (pod {pod_name}) exited {code} (preempted, resumable)",
                        pod_name,
                    )
                )
            elif code not in (None, 0) or pod["status"].get("phase") == "Failed":
                events.append((finished_at, 0, f"node {index} (pod {pod_name}) exited {code}", pod_name))
            if index in first_pod_of:  # the Job controller replaced a pod it ignored: a disruption
                created = _time(pod["metadata"].get("creationTimestamp")) or now
                events.append((created, 1, f"node {index} was lost and replaced by pod {pod_name}", pod_name))
            first_pod_of.setdefault(index, pod_name)

        cond = _condition(job, "Failed") or _condition(job, "FailureTarget")
        match = _FAILJOB_MESSAGE.search(cond.get("message", "")) if cond else None
        if match:  # the Job controller names the pod that ended the group
            root_pod, code = match.group("pod"), int(match.group("code"))
            if code == PREEMPTED_EXIT_CODE:
                return GroupState.PREEMPTED, f"pod {root_pod} exited {code} (preempted, resumable)"
            root_time = next((e[0] for e in events if e[3] == root_pod), now)
            earlier = [e for e in events if e[1] == 1 and e[0] < root_time]
            if earlier:  # a peer vanished first; this pod's failure followed from it
                return GroupState.PREEMPTED, min(earlier)[2]
            index = next((_index(p) for p in pods if p["metadata"]["name"] == root_pod), "?")
            return GroupState.FAILED, self._failure_message(
                f"node {index} (pod {root_pod}) exited {code}", root_pod, pods
            )
        if not events:
            return None
        # On a tie, the failure wins: relaunching after a real failure would only fail again.
        when, preempted, message, pod_name = min(events)
        if preempted:
            return GroupState.PREEMPTED, message
        return GroupState.FAILED, self._failure_message(message, pod_name, pods)

    def _failure_message(self, headline: str, pod_name: str, pods: list[dict[str, Any]]) -> str:
        """``headline`` and the failed pod's last log lines (its termination message once it is gone)."""
        tail = self._api(
            self._core.read_namespaced_pod_log, pod_name, self.namespace,
            container=CONTAINER, tail_lines=_TAIL_LINES, missing_ok=True, text=True,
        ) if any(p["metadata"]["name"] == pod_name for p in pods) else None  # fmt: skip
        if not tail:
            pod = next((p for p in pods if p["metadata"]["name"] == pod_name), None)
            tail = ((pod and _terminated(pod)) or {}).get("message") or ""
        lines = [line[:500] for line in str(tail).splitlines()[-_TAIL_LINES:]]
        if not lines:
            return headline
        return f"{headline}; its last log lines:\n" + "\n".join(f"  {line}" for line in lines)

    def _pending_or_running(
        self, name: str, job: dict[str, Any], pods: list[dict[str, Any]], codes: dict[int, int | None]
    ) -> GroupStatus:
        nodes = job["spec"].get("completions") or 1
        up = {
            _index(p) for p in pods
            if p["status"].get("phase") in ("Running", "Succeeded") and not p["metadata"].get("deletionTimestamp")
        }  # fmt: skip
        if len(up) >= nodes:
            return GroupStatus(name, GroupState.RUNNING, f"{nodes}/{nodes} node(s) running", codes)
        reasons = self._pending_reasons(job, pods, nodes, up)
        created = _time(job["metadata"].get("creationTimestamp")) or time.time()
        waited = time.time() - created
        timeout = float((job["metadata"].get("annotations") or {}).get(ANNOTATION_PENDING_TIMEOUT, 0) or 0)
        summary = f"{len(up)}/{nodes} node(s) running after {waited:.0f}s"
        if timeout and waited > timeout:
            capacity = not any(reason in text for text in reasons for reason in _CONFIG_PROBLEMS)
            headline = (
                f"no capacity: {summary}, more than pending_timeout_s={timeout:g} (the cluster has no room "
                f"for the group; try capacity_type='any', fewer nodes or a longer pending_timeout_s)"
                if capacity else f"pods not running: {summary}, more than pending_timeout_s={timeout:g}"
            )  # fmt: skip
            message = headline + "".join(f"\n  {text}" for text in reasons)
            return self._settle(name, GroupStatus(name, GroupState.FAILED, message, codes), end_pods=True)
        return GroupStatus(name, GroupState.PENDING, "; ".join([summary, *reasons]), codes)

    def _pending_reasons(self, job: dict[str, Any], pods, nodes: int, up: set[int]) -> list[str]:
        if job["spec"].get("suspend"):
            queue = (job["metadata"].get("labels") or {}).get("kueue.x-k8s.io/queue-name")
            return [f"the Job is suspended, waiting for admission by Kueue queue {queue!r}" if queue
                    else "the Job is suspended"]  # fmt: skip
        reasons = []
        by_index = {_index(p): p for p in pods}
        for index in range(nodes):
            if index in up:
                continue
            pod = by_index.get(index)
            if pod is None:
                reasons.append(
                    f"node {index}: no pod yet (quota? see kubectl describe job {job['metadata']['name']})"
                )
                continue
            scheduled = next(
                (c for c in pod["status"].get("conditions") or [] if c.get("type") == "PodScheduled"), None
            )
            waiting = [
                s["state"]["waiting"] for s in pod["status"].get("containerStatuses") or []
                if (s.get("state") or {}).get("waiting")
            ]  # fmt: skip
            if scheduled and scheduled.get("status") == "False":
                reasons.append(f"node {index}: {scheduled.get('reason')}: {scheduled.get('message', '')}")
            elif waiting:
                reasons.append(f"node {index}: {waiting[0].get('reason')}: {waiting[0].get('message', '')}")
            else:
                reasons.append(f"node {index}: {pod['status'].get('phase', 'Pending')}")
        return reasons

    def _settle(self, name: str, status: GroupStatus, *, end_pods: bool) -> GroupStatus:
        """Write the verdict on the Job; with ``end_pods`` suspend it, so the Job controller ends its pods.

        Suspended pods get SIGTERM and terminationGracePeriodSeconds: every rank still alive saves
        its step, as on a preemption notice.
        """
        patch: dict[str, Any] = {
            "metadata": {"annotations": {ANNOTATION_OUTCOME: json.dumps(status.to_dict())}}
        }
        if end_pods:
            patch["spec"] = {"suspend": True}
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
            if not _started(pod):
                continue
            pod_name = pod["metadata"]["name"]
            last, seen_at_last = positions.get(pod_name, (-1, 0))
            kwargs: dict[str, Any] = {"container": CONTAINER, "timestamps": True}
            if last >= 0:
                kwargs["since_seconds"] = max(1, math.ceil(time.time() - last / 1e9) + _LOG_OVERLAP_S)
            from kubernetes.client.exceptions import ApiException

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
                lines.append(f"[node{_index(pod)}]{line}")
                new_last, new_seen = (at, new_seen + 1) if at == new_last else (at, 1)
            positions[pod_name] = [new_last, new_seen]
        return LogChunk(lines, positions)

    # -- checkpoint_now / stop -------------------------------------------------------------------
    def checkpoint_now(self, name: str) -> int:
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
                container=CONTAINER, command=["python", "-c", _SIGNAL_WORKERS],
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
