"""An elastic group's state (``spec.elastic``), read from its Job and pods, and its node count over time.

The Job re-creates a lost index itself (``elastic_job``), so a lost pod does not end the group here: it
trains while at least ``min_nodes`` pods run. Below that it waits ``min_nodes_timeout_s`` for replacements
(c10d's join timeout: the agents wait as long), then ends as *preempted* and the operator decides again
(relaunch, fall back or stop); the Job is ended by its deadline (``launcher._settle``), never deleted here.

* the Job failed by a ``FailJob`` rule (exit 1, 74, 77, 78): *failed*, naming the pod and its last lines;
* more indexes lost for good than ``maxFailedIndexes`` allows (each replaced ``max_preemptions`` times):
  *preempted*, too few nodes are left;
* ``successPolicy`` met (``min_nodes`` indexes exited 0, training finished): *succeeded*.

When each pod ran is kept on the Job (``ANNOTATION_NODE_TIMES``, written by the launcher) so that the node
count over time (``node_timeline``, for billing) outlives the pods. Pure functions, no client.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from airflow_dtrain.kubernetes import status as group_status
from airflow_dtrain.kubernetes.elastic_job import NOT_RESUMABLE
from airflow_dtrain.kubernetes.names import ANNOTATION_ELASTIC, ANNOTATION_NODE_TIMES, store_name
from airflow_dtrain.kubernetes.status import Observation, condition, parse_time, pod_index, terminated
from airflow_dtrain.launchers.base import GroupState, GroupStatus

Times = dict[str, list[float | None]]
"""When each pod ran: ``{pod name: [start, end or None while it runs]}`` in epoch seconds."""


def settings(job: dict[str, Any]) -> dict[str, Any] | None:
    """The elastic group's ``min_nodes``, ``min_nodes_timeout_s`` and ``max_preemptions``; None: all or
    nothing."""
    text = (job["metadata"].get("annotations") or {}).get(ANNOTATION_ELASTIC)
    return json.loads(text) if text else None


def recorded_times(job: dict[str, Any]) -> Times:
    text = (job["metadata"].get("annotations") or {}).get(ANNOTATION_NODE_TIMES)
    return json.loads(text) if text else {}


def pod_times(recorded: Times, pods: list[dict[str, Any]], now: float) -> Times:
    """``recorded`` brought up to date with ``pods``: a pod that started is added, one that ended gets its
    finish time, and one that is gone without a recorded end ended by ``now`` (deleted while running)."""
    times = {pod: list(span) for pod, span in recorded.items()}
    seen = set()
    for pod in pods:
        name = pod["metadata"]["name"]
        seen.add(name)
        start = parse_time((pod.get("status") or {}).get("startTime"))
        if start is None:
            continue  # never ran: never billed
        ended = terminated(pod) or {}
        end = parse_time(ended.get("finishedAt"))
        if end is None and (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            end = now
        previous = times.get(name)
        times[name] = [start, end if end is not None else (previous[1] if previous else None)]
    for name, span in times.items():
        if name not in seen and span[1] is None:
            span[1] = now
    return times


def node_timeline(times: Times) -> list[tuple[float, int]]:
    """(time, pods running from then on), one entry per change, oldest first; ends with 0 once every pod
    ended."""
    steps: dict[float, int] = {}
    for start, end in times.values():
        steps[start] = steps.get(start, 0) + 1
        if end is not None:
            steps[end] = steps.get(end, 0) - 1
    timeline: list[tuple[float, int]] = []
    running = 0
    for at in sorted(steps):
        running += steps[at]
        if not timeline or timeline[-1][1] != running:
            timeline.append((at, running))
    return timeline


def below_since(times: Times, needed: int) -> float | None:
    """When the running count last fell below ``needed`` after having reached it; None while it is at or
    above ``needed`` or never reached it (still starting: the pending timeout applies). Pod times have whole
    seconds: at one time, starts count before ends, so a pod that ran for under a second still ran."""
    events = sorted(
        [(start, 0) for start, _ in times.values()]
        + [(end, 1) for _, end in times.values() if end is not None]
    )
    reached, since, running = False, None, 0
    for at, ended in events:
        running += -1 if ended else 1
        if running >= needed:
            reached, since = True, None
        elif reached and since is None:
            since = at
    return since


def observe(
    name: str,
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    log_tail: Callable[[str], str | None],
    now: float | None = None,
    store_pod: dict[str, Any] | None = None,
) -> Observation:
    """The elastic group's state from its Job and pods (as ``status.observe`` for an all-or-nothing one), and
    its store pod (``store_pod``, when the Job has one: ``standalone_store``)."""
    now = time.time() if now is None else now
    elastic = settings(job) or {}
    needed = int(elastic.get("min_nodes", 1))
    codes = {pod_index(pod): (terminated(pod) or {}).get("exitCode") for pod in pods}
    nodes = job["spec"].get("completions") or 1
    if condition(job, "Complete") or condition(job, "SuccessCriteriaMet"):
        done = sum(1 for code in codes.values() if code == 0)
        message = f"training finished: {done} of {nodes} node(s) exited 0 (min_nodes={needed})"
        return Observation(GroupStatus(name, GroupState.SUCCEEDED, message, codes))
    failed = condition(job, "Failed") or condition(job, "FailureTarget")
    at_budget = group_status.budget_deadline_passed(job, failed)
    if at_budget is not None:
        return Observation(GroupStatus(name, GroupState.AT_BUDGET, at_budget, codes), settle=True)
    store = store_pod_gone(name, store_pod, now) if elastic.get("standalone_store") else store_lost(pods)
    if store is not None and (not failed or store[0] <= failure_time(failed, pods, now)):
        return Observation(
            GroupStatus(name, GroupState.PREEMPTED, store[1], codes), settle=True, end_pods=not failed
        )
    if failed:
        return Observation(job_failed(name, job, pods, failed, codes, log_tail), settle=True)
    up = group_status.nodes_up(pods)
    since = below_since(pod_times(recorded_times(job), pods, now), needed)
    if len(up) >= needed or since is None:
        seen = group_status.pending_or_running(name, job, pods, codes, needed=needed)
        if seen.status.state != GroupState.RUNNING:
            return seen
        return Observation(GroupStatus(name, GroupState.RUNNING, running_message(job, pods, needed), codes))
    waited, timeout = now - since, float(elastic.get("min_nodes_timeout_s", 0))
    reasons = group_status.pending_reasons(job, pods, nodes, up)
    summary = f"{len(up)}/{nodes} node(s) running, fewer than min_nodes={needed} for {waited:.0f}s"
    if waited > timeout:
        message = (f"preempted: {summary}, more than min_nodes_timeout_s={timeout:g}: no replacement "
                   "could be had in time; the job decides again (relaunch, fall back or stop)")  # fmt: skip
        message += "".join(f"\n  {text}" for text in reasons)
        return Observation(
            GroupStatus(name, GroupState.PREEMPTED, message, codes), settle=True, end_pods=True
        )
    message = "; ".join(
        [f"{summary} (waits up to min_nodes_timeout_s={timeout:g} for replacements)", *reasons]
    )
    return Observation(GroupStatus(name, GroupState.PENDING, message, codes))


def store_pod_gone(name: str, pod: dict[str, Any] | None, now: float) -> tuple[float, str] | None:
    """(when, why) the group's store pod (``store``) was lost: gone, disrupted, ended or being deleted. The
    nodes cannot re-form the group without it, and a node's later failure is collateral. None while it
    serves."""
    if pod is None:
        return now, _store_words(name, "is gone")
    status, meta = pod.get("status") or {}, pod.get("metadata") or {}
    disrupted, phase = condition(pod, "DisruptionTarget"), status.get("phase")
    if disrupted:
        why = "was disrupted"
    elif phase in ("Failed", "Succeeded"):
        why = f"ended ({phase})"
    elif meta.get("deletionTimestamp"):
        why = "is being deleted"
    else:
        return None
    ended = [((c.get("state") or {}).get("terminated") or {}).get("finishedAt")
             for c in status.get("containerStatuses") or []]  # fmt: skip
    times = [parse_time(t) for t in [*ended, (disrupted or {}).get("lastTransitionTime"),
                                     meta.get("deletionTimestamp")]]  # fmt: skip
    return min((t for t in times if t is not None), default=now), _store_words(name, why)


def _store_words(name: str, why: str) -> str:
    return (
        f"preempted: the group's rendezvous store (pod {store_name(name)}) {why}; the nodes cannot re-form "
        "the group without it: the group is relaunched as a whole"
    )


def store_lost(pods: list[dict[str, Any]]) -> tuple[float, str] | None:
    """(when, why) node 0 was lost (disrupted, or a resumable exit) of a Job without a store pod of its own
    (created before ``standalone_store``): node 0 hosts the c10d store, so the others
    cannot re-form the group without it and a peer's later failure is collateral. A known limit: the group
    ends as preempted and is relaunched as a whole. None while node 0 runs, or when it failed by itself."""
    for pod in pods:
        ended, disrupted = terminated(pod) or {}, condition(pod, "DisruptionTarget")
        code = ended.get("exitCode")
        if pod_index(pod) != 0 or (
            not disrupted and (pod["status"].get("phase") != "Failed" or code in NOT_RESUMABLE)
        ):
            continue
        when = (
            parse_time((disrupted or {}).get("lastTransitionTime") or ended.get("finishedAt")) or time.time()
        )
        how = "was disrupted" if disrupted else f"exited {code}"
        return when, (
            f"preempted: node 0 (pod {pod['metadata']['name']}) {how}; it hosts the group's rendezvous "
            "store, so the other nodes cannot go on without it: the group is relaunched as a whole"
        )
    return None


def failure_time(failed: dict[str, Any], pods: list[dict[str, Any]], now: float) -> float:
    """When the pod that failed the Job ended (the FailJob rule names it), else when the Job failed."""
    match = group_status._FAILJOB_MESSAGE.search(failed.get("message", ""))
    pod = next((p for p in pods if match and p["metadata"]["name"] == match.group("pod")), None)
    return (
        parse_time((terminated(pod) or {}).get("finishedAt") if pod else None)
        or parse_time(failed.get("lastTransitionTime"))
        or now
    )


def running_message(job: dict[str, Any], pods: list[dict[str, Any]], needed: int) -> str:
    """How many nodes run, and which lost ones are being replaced or are lost for good."""
    nodes = job["spec"].get("completions") or 1
    up = group_status.nodes_up(pods)
    lost = (job.get("status") or {}).get("failedIndexes") or ""
    for_good = {int(i) for i in lost.split(",") if i.strip().isdigit()}  # "1,2" (ranges "1-3" read as lost)
    failed = {pod_index(pod) for pod in pods if pod["status"].get("phase") == "Failed"}
    replaced = sorted(failed - up - for_good)
    return (
        f"{len(up)}/{nodes} node(s) running (elastic: min_nodes={needed})"
        + (f"; node(s) {', '.join(map(str, replaced))} lost, being replaced" if replaced else "")
        + (f"; node(s) {lost} lost for good (replaced max_preemptions times)" if lost else "")
    )


def job_failed(
    name: str,
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    failed: dict[str, Any],
    codes: dict[int, int | None],
    log_tail: Callable[[str], str | None],
) -> GroupStatus:
    """The outcome of a Job the controller failed: too many indexes lost is a preemption (resumable), a
    FailJob rule a failure (a non-resumable exit code), anything else a failure as the controller says."""
    reason, text = failed.get("reason"), failed.get("message", "")
    if reason in ("MaxFailedIndexesExceeded", "FailedIndexes"):
        elastic = settings(job) or {}
        lost = (job.get("status") or {}).get("failedIndexes") or "?"
        message = (
            f"preempted: node(s) {lost} lost more than max_preemptions={elastic.get('max_preemptions')} "
            f"time(s) each, fewer than min_nodes={elastic.get('min_nodes')} can train ({reason}); the job "
            "decides again (relaunch, fall back or stop)"
        )
        return GroupStatus(name, GroupState.PREEMPTED, message, codes)
    match = group_status._FAILJOB_MESSAGE.search(text) if reason == "PodFailurePolicy" else None
    if match:
        pod_name, code = match.group("pod"), int(match.group("code"))
        index = next((pod_index(p) for p in pods if p["metadata"]["name"] == pod_name), "?")
        headline = f"node {index} (pod {pod_name}) exited {code}"
        return GroupStatus(
            name, GroupState.FAILED, group_status.failure_message(headline, pod_name, pods, log_tail), codes
        )
    return GroupStatus(name, GroupState.FAILED, f"{reason}: {text}", codes)
