"""A Kubernetes group's state, read from its Job and pods (plain dicts as the API returns them).

The Job controller decides most outcomes: its podFailurePolicy fails the Job when a node
exits 75 (preempted) or anything else non-zero, and ignores disruptions. What Kubernetes
cannot express is decided here, and the launcher writes it on the Job:

* a disrupted pod (``DisruptionTarget``), or one the controller replaced, ends the whole
  group as *preempted* (an all-or-nothing group; an elastic one is judged by ``elastic_status``);
* a group not running after its pending timeout fails with "no capacity";
* a Job that ran into the activeDeadlineSeconds derived from its budget stopped *at the budget*
  (the operator ends there, as when the trainer stops itself at the cap), not failed;
* when several things went wrong, the first one is the cause (a peer's crash after a node
  vanished is collateral).

Pure functions, no client: the launcher hands in what it read and a way to read a pod's
last log lines.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from airflow_dtrain.kubernetes.names import (
    ANNOTATION_DEADLINE,
    ANNOTATION_EARLIER,
    ANNOTATION_OUTCOME,
    ANNOTATION_PENDING_TIMEOUT,
    CONTAINER,
)
from airflow_dtrain.launchers.base import GroupState, GroupStatus
from trainer.config.job_config import PREEMPTED_EXIT_CODE
from trainer.money.deadline import deadline_words

TAIL_LINES = 20
_FAILJOB_MESSAGE = re.compile(r"for pod [^/\s]+/(?P<pod>\S+) failed with exit code (?P<code>-?\d+)")
# Pending reasons that are not a lack of capacity: say so instead of "no capacity".
_CONFIG_PROBLEMS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError"}


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def pod_index(pod: dict[str, Any]) -> int:
    """The pod's node index: the Job's completion index (annotation, else label)."""
    meta = pod["metadata"]
    value = (meta.get("annotations") or {}).get("batch.kubernetes.io/job-completion-index")
    value = value or (meta.get("labels") or {}).get("batch.kubernetes.io/job-completion-index", "-1")
    return int(value)


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """``obj``'s condition of type ``kind`` if it is True."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


def terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The trainer container's ``terminated`` state (now or last), if it has ended."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            state = status.get("state") or {}
            return state.get("terminated") or (status.get("lastState") or {}).get("terminated")
    return None


def started(pod: dict[str, Any]) -> bool:
    """Whether the trainer container has started (it has logs)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            state = status.get("state") or {}
            return "running" in state or "terminated" in state
    return False


@dataclass(frozen=True)
class Observation:
    """What a look at a group found: its status, and whether the launcher must record it."""

    status: GroupStatus
    settle: bool = False
    """Write the status on the Job as its outcome (a verdict of this module, not the controller's)."""
    end_pods: bool = False
    """Also end the pods still running (the Job run into its deadline: every rank gets SIGTERM and saves)."""


def recorded(name: str, job: dict[str, Any]) -> GroupStatus | None:
    """The outcome written on the Job earlier, or "stopped" while it is deleted; None otherwise."""
    meta = job["metadata"]
    annotations = meta.get("annotations") or {}
    if ANNOTATION_OUTCOME in annotations:
        outcome = json.loads(annotations[ANNOTATION_OUTCOME])
        codes = {int(k): v for k, v in outcome.get("node_exit_codes", {}).items()}
        return GroupStatus(name, GroupState(outcome["state"]), outcome["message"], codes)
    if meta.get("deletionTimestamp"):
        return GroupStatus(name, GroupState.STOPPED, "the Job is being deleted")
    return None


def earlier(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The outcomes of its task's earlier groups that ``job`` carries (``ANNOTATION_EARLIER``), by group
    name."""
    text = (job["metadata"].get("annotations") or {}).get(ANNOTATION_EARLIER)
    return json.loads(text) if text else {}


def entry_of(status: GroupStatus, created: str, placement: list[dict[str, Any]] | None) -> dict[str, Any]:
    """What a later Job remembers of an ended group: its outcome (the first line of its message), when its
    Job was created, and where it ran. Small: a Job's annotations hold at most 256 KiB in all."""
    return {
        "state": status.state.value,
        "message": status.message.splitlines()[0][:300] if status.message else "",
        "node_exit_codes": {str(k): v for k, v in status.node_exit_codes.items()}, "created": created,
        "placement": placement,
    }  # fmt: skip


def status_of_entry(name: str, entry: dict[str, Any]) -> GroupStatus:
    """The status of a group whose Job is gone, from what a later Job of its task remembers."""
    codes = {int(k): v for k, v in (entry.get("node_exit_codes") or {}).items()}
    return GroupStatus(name, GroupState(entry["state"]), f"{entry.get('message', '')} (its Job was deleted; "
                       "remembered by a later group of the task)", codes)  # fmt: skip


def observe(
    name: str, job: dict[str, Any], pods: list[dict[str, Any]], log_tail: Callable[[str], str | None]
) -> Observation:
    """The group's state from its Job and pods (oldest pod of each index first).

    :param log_tail: a pod's last log lines by pod name (None if it has none), for failure messages.
    """
    codes: dict[int, int | None] = {}
    for pod in pods:  # the newest pod of each index
        ended = terminated(pod)
        codes[pod_index(pod)] = ended.get("exitCode") if ended else None
    nodes = job["spec"].get("completions") or 1
    if condition(job, "Complete") or condition(job, "SuccessCriteriaMet"):
        return Observation(GroupStatus(name, GroupState.SUCCEEDED, f"all {nodes} node(s) exited 0", codes))
    failed = condition(job, "Failed") or condition(job, "FailureTarget")
    at_budget = budget_deadline_passed(job, failed)
    if at_budget is not None:  # before the pods' exit codes: their SIGTERM came from the deadline
        return Observation(GroupStatus(name, GroupState.AT_BUDGET, at_budget, codes), settle=True)
    found = verdict(job, pods)
    if found is not None:
        state, message, blamed = found
        if state == GroupState.FAILED and blamed:
            message = failure_message(message, blamed, pods, log_tail)
        return Observation(GroupStatus(name, state, message, codes), settle=True, end_pods=not failed)
    if failed:  # failed without a pod to blame (deadline, API errors): nothing to resume from
        message = f"{failed.get('reason')}: {failed.get('message')}"
        return Observation(GroupStatus(name, GroupState.FAILED, message, codes), settle=True)
    return pending_or_running(name, job, pods, codes)


def budget_deadline_passed(job: dict[str, Any], failed: dict[str, Any] | None) -> str | None:
    """Why the group stopped at the budget, if the Job controller ended it at the activeDeadlineSeconds that
    the launcher derived from the budget (``launchers.base.budget_deadline``); None otherwise."""
    deadline = (job["metadata"].get("annotations") or {}).get(ANNOTATION_DEADLINE)
    if not failed or failed.get("reason") != "DeadlineExceeded" or not deadline:
        return None
    return (
        "stopped at the job's dollar cap by the cluster: the Job reached its "
        + deadline_words(json.loads(deadline), "activeDeadlineSeconds")
        + ", so the Job controller stopped its pods (SIGTERM: each saves its step within the grace period)"
    )


def verdict(job: dict[str, Any], pods: list[dict[str, Any]]) -> tuple[GroupState, str, str | None] | None:
    """(preempted or failed, why, the pod to blame) by whichever happened first; None while nothing has."""
    events: list[tuple[float, int, str, str]] = []  # (when, 0 failed / 1 preempted, message, pod)
    now = time.time()
    first_pod_of: dict[int, str] = {}
    for pod in pods:
        index, pod_name = pod_index(pod), pod["metadata"]["name"]
        ended = terminated(pod) or {}
        code = ended.get("exitCode")
        finished_at = parse_time(ended.get("finishedAt")) or now
        disruption = condition(pod, "DisruptionTarget")
        if disruption:
            when = parse_time(disruption.get("lastTransitionTime")) or finished_at
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
            created = parse_time(pod["metadata"].get("creationTimestamp")) or now
            events.append((created, 1, f"node {index} was lost and replaced by pod {pod_name}", pod_name))
        first_pod_of.setdefault(index, pod_name)

    cond = condition(job, "Failed") or condition(job, "FailureTarget")
    match = _FAILJOB_MESSAGE.search(cond.get("message", "")) if cond else None
    if match:  # the Job controller names the pod that ended the group
        root_pod, code = match.group("pod"), int(match.group("code"))
        if code == PREEMPTED_EXIT_CODE:
            return GroupState.PREEMPTED, f"pod {root_pod} exited {code} (preempted, resumable)", None
        root_time = next((e[0] for e in events if e[3] == root_pod), now)
        earlier = [e for e in events if e[1] == 1 and e[0] < root_time]
        if earlier:  # a peer vanished first; this pod's failure followed from it
            return GroupState.PREEMPTED, min(earlier)[2], None
        index = next((pod_index(p) for p in pods if p["metadata"]["name"] == root_pod), "?")
        return GroupState.FAILED, f"node {index} (pod {root_pod}) exited {code}", root_pod
    if not events:
        return None
    # On a tie, the failure wins: relaunching after a real failure would only fail again.
    _, preempted, message, pod_name = min(events)
    if preempted:
        return GroupState.PREEMPTED, message, None
    return GroupState.FAILED, message, pod_name


def failure_message(
    headline: str, pod_name: str, pods: list[dict[str, Any]], log_tail: Callable[[str], str | None]
) -> str:
    """``headline`` and the failed pod's last log lines (its termination message once it is gone)."""
    pod = next((p for p in pods if p["metadata"]["name"] == pod_name), None)
    tail = log_tail(pod_name) if pod is not None else None
    if not tail:
        tail = ((pod and terminated(pod)) or {}).get("message") or ""
    lines = [line[:500] for line in str(tail).splitlines()[-TAIL_LINES:]]
    if not lines:
        return headline
    return f"{headline}; its last log lines:\n" + "\n".join(f"  {line}" for line in lines)


def nodes_up(pods: list[dict[str, Any]]) -> set[int]:
    """The node indexes whose pod runs (or has finished its work), not being deleted."""
    return {
        pod_index(p) for p in pods
        if p["status"].get("phase") in ("Running", "Succeeded") and not p["metadata"].get("deletionTimestamp")
    }  # fmt: skip


def pending_or_running(
    name: str,
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    codes: dict[int, int | None],
    needed: int | None = None,
) -> Observation:
    """Running once ``needed`` nodes are up (default: all of them; an elastic group: its min_nodes), else
    pending, and failed with "no capacity" after the Job's pending timeout."""
    nodes = job["spec"].get("completions") or 1
    up = nodes_up(pods)
    if len(up) >= (needed or nodes):
        return Observation(GroupStatus(name, GroupState.RUNNING, f"{len(up)}/{nodes} node(s) running", codes))
    reasons = pending_reasons(job, pods, nodes, up)
    created = parse_time(job["metadata"].get("creationTimestamp")) or time.time()
    waited = time.time() - created
    timeout = float((job["metadata"].get("annotations") or {}).get(ANNOTATION_PENDING_TIMEOUT, 0) or 0)
    summary = f"{len(up)}/{nodes} node(s) running after {waited:.0f}s"
    if timeout and waited > timeout:
        capacity = not any(reason in text for text in reasons for reason in _CONFIG_PROBLEMS)
        headline = (
            f"no capacity: {summary}, more than pending_timeout_s={timeout:g} (the cluster has no room "
            f"for the group; try capacity='any', fewer nodes or a longer pending_timeout_s)"
            if capacity else f"pods not running: {summary}, more than pending_timeout_s={timeout:g}"
        )  # fmt: skip
        message = headline + "".join(f"\n  {text}" for text in reasons)
        return Observation(GroupStatus(name, GroupState.FAILED, message, codes), settle=True, end_pods=True)
    return Observation(GroupStatus(name, GroupState.PENDING, "; ".join([summary, *reasons]), codes))


def pending_reasons(job: dict[str, Any], pods: list[dict[str, Any]], nodes: int, up: set[int]) -> list[str]:
    """Why each node that is not up is not, in the words of its pod's conditions and container states."""
    if job["spec"].get("suspend"):
        queue = (job["metadata"].get("labels") or {}).get("kueue.x-k8s.io/queue-name")
        return [f"the Job is suspended, waiting for admission by Kueue queue {queue!r}" if queue
                else "the Job is suspended"]  # fmt: skip
    reasons = []
    by_index = {pod_index(p): p for p in pods}
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
