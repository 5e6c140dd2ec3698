"""The Indexed Job of an elastic group (``spec.elastic``): the controller re-creates only the index it lost.

An all-or-nothing group's Job fails at its first lost pod (``objects.pod_failure_policy``). An elastic one
keeps its surviving pods and lets the Job controller replace the lost index (Kubernetes >= 1.31, where
``backoffLimitPerIndex``, ``maxFailedIndexes``, the ``FailIndex`` action and ``successPolicy`` are on by
default):

* a disrupted pod (``DisruptionTarget``: evicted, drained, spot node reclaimed) is replaced without being
  counted (``Ignore``);
* a non-resumable exit (1 a bug or bad input, 74 storage, 77 the dollar cap, 78 fenced) fails the whole Job
  (``FailJob``), as in an all-or-nothing group;
* exit 75 (the node saved and stopped) and any other exit of a lost node (76 a lost peer, a signal) count
  against ``backoffLimitPerIndex = max_preemptions``: past it, that index fails and is not re-created;
* more than ``num_nodes - min_nodes`` failed indexes (``maxFailedIndexes``) fail the Job: too few nodes are
  left to train (``elastic_status`` calls that "preempted": the operator decides again);
* ``successPolicy``: the Job succeeds once ``min_nodes`` indexes exited 0. torchrun's agents exit 0 only when
  training finished, so a replacement still waiting to join is not waited for.

``podReplacementPolicy: Failed`` (the only value a podFailurePolicy allows) keeps a replacement from starting
before the lost pod is gone: two pods never share a hostname. No pod of the Job hosts the c10d store: it is a
pod of its own (``store``), so losing index 0 is like losing any other index.

Pure functions, no kubernetes client.
"""

from __future__ import annotations

import json
from typing import Any

from airflow_dtrain.kubernetes.names import ANNOTATION_ELASTIC, CONTAINER
from airflow_dtrain.job.spec import JobSpec
from trainer.config.job_config import (
    BUDGET_EXIT_CODE,
    FENCED_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    STORAGE_EXIT_CODE,
)

NOT_RESUMABLE = sorted({1, STORAGE_EXIT_CODE, BUDGET_EXIT_CODE, FENCED_EXIT_CODE})
"""Exit codes after which no replacement helps: the Job fails at once (sorted, as the API wants)."""


def elastic_failure_policy() -> dict[str, Any]:
    """The rules of an elastic group's Job, in order (the first match wins)."""
    return {
        "rules": [
            # The node went away under the pod: not the trainer's doing, replaced at no cost.
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": NOT_RESUMABLE},
            },
            # Saved and stopped: the index is re-created, up to backoffLimitPerIndex times. (Any other
            # non-zero exit matches no rule and is counted the same way: Kubernetes' default.)
            {
                "action": "Count",
                "onExitCodes": {
                    "containerName": CONTAINER,
                    "operator": "In",
                    "values": [PREEMPTED_EXIT_CODE],
                },
            },
        ]
    }


def elastic_job_fields(spec: JobSpec) -> dict[str, Any]:
    """The Job spec fields that make a group elastic (no ``backoffLimit``: with ``backoffLimitPerIndex`` the
    API defaults it to "unlimited", and each index has its own bound)."""
    return {
        "backoffLimitPerIndex": spec.max_preemptions,
        "maxFailedIndexes": spec.num_nodes - spec.fewest_nodes,
        "podFailurePolicy": elastic_failure_policy(),
        "successPolicy": {"rules": [{"succeededCount": spec.fewest_nodes}]},
    }


def elastic_annotation(spec: JobSpec) -> dict[str, str]:
    """What ``elastic_status`` needs to judge the group, on its Job (the Job is the record, not the spec)."""
    settings = {
        "min_nodes": spec.fewest_nodes,
        "min_nodes_timeout_s": spec.min_nodes_timeout_s,
        "max_preemptions": spec.max_preemptions,
        "standalone_store": True,  # the store is a pod of its own (a Job without this: pod 0 hosts it)
    }
    return {ANNOTATION_ELASTIC: json.dumps(settings, sort_keys=True)}
