"""The fake's controllers: the Job controller (pods per completion index, podFailurePolicy, completion,
suspension, replacement pods), activeDeadlineSeconds, and the TTL-after-finished controller.

They act on the fake's clock, which ``advance(seconds)`` moves forward.
"""

from __future__ import annotations

import copy
import secrets
import time
from datetime import datetime, timezone
from typing import Any

from tests.kubernetes.fakeapi.wire import _now, _time


class JobController:
    """The fake Job controller and its clock; mixed into ``FakeKubernetesApiServer``."""

    def _clock(self) -> str:
        """Now on the fake's clock: the Job controller's own times (start, completion, failure) follow
        ``advance``."""
        return datetime.fromtimestamp(time.time() + self.clock_offset, timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )

    def advance(self, seconds: float) -> None:
        """Move the fake's clock ``seconds`` forward (deadlines and TTLs fall due), and act on it now."""
        with self.lock:
            self.clock_offset += seconds
            self.tick()

    def tick(self) -> None:
        """The Job controller's activeDeadlineSeconds and the TTL-after-finished controller, at the fake's
        time."""
        with self.lock:
            now = time.time() + self.clock_offset
            for (kind, ns, name), job in list(self.objects.items()):
                if (
                    kind != "jobs"
                    or (kind, ns, name) not in self.objects
                    or job["metadata"].get("deletionTimestamp")
                ):
                    continue
                status = job.get("status") or {}
                ended = {c["type"]: c for c in status.get("conditions") or [] if c.get("status") == "True"}
                deadline, started = job["spec"].get("activeDeadlineSeconds"), _time(status.get("startTime"))
                running = not job["spec"].get("suspend") and not ({"Complete", "Failed"} & set(ended))
                if deadline and started and running and now >= started + deadline:
                    self._fail_job(
                        ns, job, "DeadlineExceeded", "Job was active longer than specified deadline"
                    )
                    continue
                ttl = job["spec"].get("ttlSecondsAfterFinished")
                end = ended.get("Complete") or ended.get("Failed")
                finished = _time(status.get("completionTime")) or _time((end or {}).get("lastTransitionTime"))
                if ttl is not None and end and finished is not None and now >= finished + ttl:
                    self._delete("jobs", ns, name, "Foreground")

    # -- the fake Job controller ---------------------------------------------------------------
    def _job_pods(self, ns: str, job: dict[str, Any]) -> list[dict[str, Any]]:
        uid = job["metadata"]["uid"]
        pods = [o for (k, n, _), o in self.objects.items() if k == "pods" and n == ns
                and any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])]  # fmt: skip
        return sorted(pods, key=lambda p: p["metadata"]["resourceVersion"])

    def _sync_owner(self, pod: dict[str, Any]) -> None:
        for ref in pod["metadata"].get("ownerReferences") or []:
            if (
                ref.get("kind") == "Job"
                and ("jobs", pod["metadata"]["namespace"], ref["name"]) in self.objects
            ):
                self._sync_job(pod["metadata"]["namespace"], ref["name"])

    def _create_pod(self, ns: str, job: dict[str, Any], index: int) -> None:
        template = copy.deepcopy(job["spec"]["template"])
        name = job["metadata"]["name"]
        meta = template.get("metadata") or {}
        labels = {**(meta.get("labels") or {}), "batch.kubernetes.io/job-name": name, "job-name": name,
                  "batch.kubernetes.io/controller-uid": job["metadata"]["uid"],
                  "batch.kubernetes.io/job-completion-index": str(index)}  # fmt: skip
        annotations = {
            **(meta.get("annotations") or {}),
            "batch.kubernetes.io/job-completion-index": str(index),
        }
        pod = {
            "metadata": {
                "name": f"{name}-{index}-{secrets.token_hex(3)[:5]}",
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": name,
                        "uid": job["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {**template["spec"], "hostname": f"{name}-{index}"},
        }
        created = self._create("pods", ns, pod)
        self.objects[("pods", ns, created["metadata"]["name"])]["status"] = {"phase": "Pending"}

    def _sync_job(self, ns: str, name: str) -> None:
        job = self.objects[("jobs", ns, name)]
        status = job.setdefault("status", {})
        terminal = {c["type"] for c in status.get("conditions", []) if c.get("status") == "True"}
        if (
            terminal & {"Complete", "Failed"}
            or job["spec"].get("suspend")
            or job["metadata"].get("deletionTimestamp")
        ):
            return
        pods = self._job_pods(ns, job)
        accounted = self._accounted.setdefault(job["metadata"]["uid"], set())
        for pod in pods:
            uid = pod["metadata"]["uid"]
            if pod["status"].get("phase") != "Failed" or uid in accounted:
                continue
            accounted.add(uid)
            action, rule, code = self._match_failure_policy(job, pod)
            if action == "Ignore":
                continue
            status["failed"] = status.get("failed", 0) + 1
            if action == "FailJob":
                message = (f"Container trainer for pod {ns}/{pod['metadata']['name']} failed with exit code "
                           f"{code} matching FailJob rule at index {rule}")  # fmt: skip
                return self._fail_job(ns, job, "PodFailurePolicy", message)
            if status["failed"] > job["spec"].get("backoffLimit", 6):
                return self._fail_job(
                    ns, job, "BackoffLimitExceeded", "Job has reached the specified backoff limit"
                )
        succeeded = {self._index(p) for p in pods if p["status"].get("phase") == "Succeeded"}
        status["succeeded"] = len(succeeded)
        completions = job["spec"].get("completions", 1)
        if len(succeeded) >= completions:
            status["conditions"] = [
                {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": self._clock()},
                {"type": "Complete", "status": "True", "lastTransitionTime": self._clock()},
            ]
            status["completionTime"] = self._clock()
            status["active"] = 0
            return
        active = {self._index(p) for p in pods if p["status"].get("phase") in ("Pending", "Running")}
        for index in range(completions):
            if index not in active and index not in succeeded:
                self._create_pod(ns, job, index)  # first pod, or the replacement of an ignored failure
        status["active"] = len({self._index(p) for p in self._job_pods(ns, job)
                                if p["status"].get("phase") in ("Pending", "Running")})  # fmt: skip

    def _match_failure_policy(
        self, job: dict[str, Any], pod: dict[str, Any]
    ) -> tuple[str, int | None, int | None]:
        code = None
        for status in pod["status"].get("containerStatuses", []):
            code = (status.get("state", {}).get("terminated") or {}).get("exitCode", code)
        conditions = {(c["type"], c["status"]) for c in pod["status"].get("conditions", [])}
        for i, rule in enumerate((job["spec"].get("podFailurePolicy") or {}).get("rules", [])):
            on_codes = rule.get("onExitCodes")
            if on_codes and code not in (None, 0):
                inside = code in on_codes["values"]
                if inside == (on_codes["operator"] == "In"):
                    return rule["action"], i, code
            for cond in rule.get("onPodConditions", []):
                if (cond["type"], cond.get("status", "True")) in conditions:
                    return rule["action"], i, code
        return "Count", None, code

    def _fail_job(self, ns: str, job: dict[str, Any], reason: str, message: str) -> None:
        job["status"]["conditions"] = [
            {
                "type": "FailureTarget",
                "status": "True",
                "reason": reason,
                "message": message,
                "lastTransitionTime": self._clock(),
            },
            {
                "type": "Failed",
                "status": "True",
                "reason": reason,
                "message": message,
                "lastTransitionTime": self._clock(),
            },
        ]
        job["status"]["active"] = 0
        for pod in self._job_pods(ns, job):  # the controller deletes the pods still running
            if pod["status"].get("phase") in ("Pending", "Running"):
                self._delete("pods", ns, pod["metadata"]["name"], "Background")

    def _on_suspend(self, ns: str, name: str, suspended: bool) -> None:
        job = self.objects[("jobs", ns, name)]
        if {c["type"] for c in job["status"].get("conditions", []) if c.get("status") == "True"} & {
            "Complete",
            "Failed",
        }:
            return  # the controller leaves a finished Job alone: suspending it changes nothing
        if suspended:
            for pod in self._job_pods(ns, job):
                if pod["status"].get("phase") in ("Pending", "Running"):
                    self._delete("pods", ns, pod["metadata"]["name"], "Background")
            job["status"]["conditions"] = [
                {"type": "Suspended", "status": "True", "lastTransitionTime": _now()}
            ]
            job["status"]["active"] = 0
        else:
            job["status"]["conditions"] = []
            job["status"]["startTime"] = self._clock()
            self._sync_job(ns, name)

    @staticmethod
    def _index(pod: dict[str, Any]) -> int:
        return int(pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])
