"""The fake's controllers: the Job controller (pods per completion index, podFailurePolicy, completion,
suspension, replacement pods; per index: backoffLimitPerIndex, maxFailedIndexes, FailIndex, the pod failure
backoff before a counted failure's replacement, and successPolicy's succeededCount),
activeDeadlineSeconds, and the TTL-after-finished controller.

They act on the fake's clock, which ``advance(seconds)`` moves forward.
"""

from __future__ import annotations

import copy
import secrets
import time
from datetime import datetime, timezone
from typing import Any

from tests.kubernetes.fakeapi.wire import ApiError, _now, _time


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
                waiting = self._indexes.get(job["metadata"]["uid"], {}).get("not_before")
                if running and waiting and min(waiting.values()) <= now:
                    self._sync_job(ns, name)  # a counted failure's backoff is over: re-create its index
                ttl = job["spec"].get("ttlSecondsAfterFinished")
                end = ended.get("Complete") or ended.get("Failed")
                finished = _time(status.get("completionTime")) or _time((end or {}).get("lastTransitionTime"))
                if ttl is not None and end and finished is not None and now >= finished + ttl:
                    self._delete("jobs", ns, name, "Foreground")

    # -- the fake Job controller ---------------------------------------------------------------
    @staticmethod
    def _check_job(job: dict[str, Any]) -> None:
        """The API server's validation of the Job fields the launcher sets (422 Invalid, as a cluster
        answers), so a Job the fake accepts is one a real API server would accept."""
        spec, problems = job.get("spec") or {}, []
        indexed, completions = spec.get("completionMode") == "Indexed", spec.get("completions", 1)
        per_index = spec.get("backoffLimitPerIndex")
        rules = (spec.get("podFailurePolicy") or {}).get("rules") or []
        if rules and spec["template"]["spec"].get("restartPolicy") != "Never":
            problems.append("spec.podFailurePolicy: only allowed when restartPolicy is Never")
        if rules and spec.get("podReplacementPolicy", "Failed") != "Failed":
            problems.append("spec.podReplacementPolicy: must be Failed when podFailurePolicy is used")
        if per_index is not None and not indexed:
            problems.append("spec.backoffLimitPerIndex: requires completionMode Indexed")
        most = spec.get("maxFailedIndexes")
        if most is not None and (per_index is None or most > completions):
            problems.append("spec.maxFailedIndexes: requires backoffLimitPerIndex, at most completions")
        for i, rule in enumerate(rules):
            if rule["action"] == "FailIndex" and per_index is None:
                problems.append(
                    f"spec.podFailurePolicy.rules[{i}].action: FailIndex needs backoffLimitPerIndex"
                )
            values = (rule.get("onExitCodes") or {}).get("values") or []
            if values != sorted(set(values)) or (0 in values and rule["onExitCodes"]["operator"] == "In"):
                problems.append(
                    f"spec.podFailurePolicy.rules[{i}].onExitCodes.values: sorted, unique, no 0 for In"
                )
        for i, rule in enumerate((spec.get("successPolicy") or {}).get("rules") or []):
            if not indexed or not 0 < rule.get("succeededCount", 1) <= completions:
                problems.append(
                    f"spec.successPolicy.rules[{i}]: Indexed Jobs only, succeededCount <= completions"
                )
        if problems:
            name = job["metadata"].get("name")
            raise ApiError(422, "Invalid", f'Job.batch "{name}" is invalid: ' + "; ".join(problems))

    def _job_pods(self, ns: str, job: dict[str, Any]) -> list[dict[str, Any]]:
        uid = job["metadata"]["uid"]
        # its controller's pods only, as the real Job controller (controller: true), not a pod merely owned
        pods = [o for (k, n, _), o in self.objects.items() if k == "pods" and n == ns
                and any(r.get("uid") == uid and r.get("controller")
                        for r in o["metadata"].get("ownerReferences") or [])]  # fmt: skip
        return sorted(pods, key=lambda p: p["metadata"]["resourceVersion"])

    def _sync_owner(self, pod: dict[str, Any]) -> None:
        for ref in pod["metadata"].get("ownerReferences") or []:
            if (
                ref.get("kind") == "Job"
                and ref.get("controller")
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
        if job["spec"].get("backoffLimitPerIndex") is not None:  # as the real controller records them
            book = self._per_index(job)
            annotations["batch.kubernetes.io/job-index-failure-count"] = str(book["counted"].get(index, 0))
            annotations["batch.kubernetes.io/job-index-ignored-failure-count"] = str(
                book["ignored"].get(index, 0)
            )
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
        if self._account_failures(ns, job, pods):
            return  # the Job failed
        succeeded = {self._index(p) for p in pods if p["status"].get("phase") == "Succeeded"}
        status["succeeded"] = len(succeeded)
        completions = job["spec"].get("completions", 1)
        if self._success_criteria_met(ns, job, succeeded):
            return
        lost = self._per_index(job)["failed"]
        if lost and len(succeeded | lost) >= completions:  # every index ended, some failed: the Job fails
            return self._fail_job(ns, job, "FailedIndexes", "Job has failed indexes")
        active = {self._index(p) for p in pods if p["status"].get("phase") in ("Pending", "Running")}
        not_before = self._per_index(job)["not_before"]
        now = time.time() + self.clock_offset
        for index in range(completions):
            if index in active or index in succeeded or index in lost or not_before.get(index, 0) > now:
                continue
            not_before.pop(index, None)
            self._create_pod(ns, job, index)  # first pod, or the replacement of a failure the policy allows
        status["active"] = len({self._index(p) for p in self._job_pods(ns, job)
                                if p["status"].get("phase") in ("Pending", "Running")})  # fmt: skip

    def _per_index(self, job: dict[str, Any]) -> dict[str, Any]:
        """The fake controller's per-index bookkeeping of a Job: counted and ignored failures, failed indexes,
        and when a counted failure's replacement may be created (the pod failure backoff)."""
        return self._indexes.setdefault(
            job["metadata"]["uid"], {"counted": {}, "ignored": {}, "failed": set(), "not_before": {}}
        )

    def _account_failures(self, ns: str, job: dict[str, Any], pods: list[dict[str, Any]]) -> bool:
        """Apply the podFailurePolicy and the backoff limits to pods that failed since the last look; True
        when that failed the Job."""
        status, spec = job["status"], job["spec"]
        accounted = self._accounted.setdefault(job["metadata"]["uid"], set())
        per_index_limit = spec.get("backoffLimitPerIndex")
        # The API server's default: no global limit once each index has its own.
        backoff_limit = spec.get("backoffLimit", 2**31 - 1 if per_index_limit is not None else 6)
        for pod in pods:
            uid = pod["metadata"]["uid"]
            if pod["status"].get("phase") != "Failed" or uid in accounted:
                continue
            accounted.add(uid)
            action, rule, code = self._match_failure_policy(job, pod)
            index, book = self._index(pod), self._per_index(job)
            if action == "Ignore":
                book["ignored"][index] = book["ignored"].get(index, 0) + 1
                continue
            status["failed"] = status.get("failed", 0) + 1
            if action == "FailJob":
                message = (f"Container trainer for pod {ns}/{pod['metadata']['name']} failed with exit code "
                           f"{code} matching FailJob rule at index {rule}")  # fmt: skip
                self._fail_job(ns, job, "PodFailurePolicy", message)
                return True
            if per_index_limit is not None and self._count_index_failure(job, index, action, per_index_limit):
                return True
            if status["failed"] > backoff_limit:
                self._fail_job(ns, job, "BackoffLimitExceeded", "Job has reached the specified backoff limit")
                return True
        return False

    def _count_index_failure(self, job: dict[str, Any], index: int, action: str, limit: int) -> bool:
        """backoffLimitPerIndex: count a failure of ``index``; past the limit (or on FailIndex) the index
        fails for good, and more failed indexes than maxFailedIndexes fail the Job (True). Otherwise its
        replacement waits the pod failure backoff (10 s, doubling per failure of the index, at most 10
        min)."""
        book = self._per_index(job)
        failures = book["counted"][index] = book["counted"].get(index, 0) + 1
        if action == "FailIndex" or failures > limit:
            book["failed"].add(index)
            job["status"]["failedIndexes"] = ",".join(map(str, sorted(book["failed"])))
            most = job["spec"].get("maxFailedIndexes")
            if most is not None and len(book["failed"]) > most:
                ns = job["metadata"]["namespace"]
                message = "Job has exceeded the specified maximal number of failed indexes"
                self._fail_job(ns, job, "MaxFailedIndexesExceeded", message)
                return True
            return False
        delay = min(10.0 * 2 ** (failures - 1), 600.0)
        book["not_before"][index] = time.time() + self.clock_offset + delay
        return False

    def _success_criteria_met(self, ns: str, job: dict[str, Any], succeeded: set[int]) -> bool:
        """successPolicy (``succeededCount`` rules): enough indexes succeeded, so the Job succeeds and the
        controller ends the pods still running; without one, every index must succeed."""
        rules = (job["spec"].get("successPolicy") or {}).get("rules") or []
        needed = [rule["succeededCount"] for rule in rules if "succeededCount" in rule]
        completions = job["spec"].get("completions", 1)
        if not (succeeded and (any(len(succeeded) >= n for n in needed) or len(succeeded) >= completions)):
            return False
        status = job["status"]
        reason = {"reason": "SuccessPolicy", "message": "Matched rules at index 0"} if needed else {}
        status["conditions"] = [
            {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": self._clock(), **reason},
            {"type": "Complete", "status": "True", "lastTransitionTime": self._clock(), **reason},
        ]
        status["completionTime"] = self._clock()
        status["active"] = 0
        for pod in self._job_pods(ns, job):  # the rest are not needed any more
            if pod["status"].get("phase") in ("Pending", "Running"):
                self._delete("pods", ns, pod["metadata"]["name"], "Background")
        return True

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
