"""The Kubernetes objects of one pod group, rendered from a ``JobSpec`` as plain dicts.

A group is a ConfigMap (the trainer's config, no secrets), a headless Service and
an Indexed Job with ``parallelism = completions = num_nodes``. Pod ``i`` is node
``i``: its hostname is ``<job>-<i>``, the Service gives it the stable DNS name
``<job>-<i>.<service>``, and every node rendezvous with pod 0 there. torch's c10d
rendezvous makes the pod whose address the endpoint resolves to the store host, so
no pod needs to know whether it is node 0. An elastic group's store is a pod of its
own instead, with a Service of its own (``store``): it outlives any node's loss.

Pure functions, no kubernetes client: ``python -m airflow_dtrain render`` prints
exactly what the launcher creates. The vocabulary (labels, annotations) lives in ``names``, the trainer
container in ``container``, the pod template in ``pod_template``; this module assembles the group.
"""

from __future__ import annotations

import json
from typing import Any

from airflow_dtrain.kubernetes.container import mount_compile_cache
from airflow_dtrain.kubernetes.elastic_job import elastic_annotation, elastic_job_fields
from airflow_dtrain.kubernetes.names import (
    ANNOTATION_CHECKPOINT_DELIVERY,
    ANNOTATION_DEADLINE,
    ANNOTATION_PENDING_TIMEOUT,
    CONFIG_FILE,
    CONTAINER,
    LABEL_GROUP,
    config_map_name,
    group_labels,
)
from airflow_dtrain.kubernetes.store import render_store_pod, render_store_service
from airflow_dtrain.kubernetes.pod_template import render_pod_template
from trainer.money.deadline import budget_deadline
from airflow_dtrain.job.spec import JobSpec
from trainer.config.job_config import PREEMPTED_EXIT_CODE

# The names this module has always offered, wherever they live now.


def render_group(
    name: str,
    spec: JobSpec,
    *,
    namespace: str,
    spent_usd: float = 0.0,
    compile_cache_claim: str | None = None,
) -> list[dict[str, Any]]:
    """The ConfigMap, headless Service and Indexed Job of group ``name`` (an elastic group's store Service and
    pod before the Job), in creation order.

    :param spent_usd: what the job has spent before this group, for the Job's deadline
        (``launchers.base.budget_deadline``).
    :param compile_cache_claim: the admin's compile cache claim (``KubernetesPolicy``), mounted by the
        trainer container at its job's directory (``container.mount_compile_cache``); None: none.
    """
    if len(name) > 52:  # "<name>-<index>" is the pods' hostname, a 63-character DNS label
        raise ValueError(f"name: group names must be at most 52 characters, got {name!r}")
    # an elastic group's rendezvous store: a pod of its own, up before the nodes (kubernetes.store)
    store = (
        [
            render_store_service(name, spec, namespace=namespace),
            render_store_pod(name, spec, namespace=namespace),
        ]
        if spec.elastic
        else []
    )
    return [
        render_config_map(name, spec, namespace=namespace),
        render_service(name, spec, namespace=namespace),
        *store,
        render_job(
            name, spec, namespace=namespace, spent_usd=spent_usd, compile_cache_claim=compile_cache_claim
        ),
    ]


def render_config_map(name: str, spec: JobSpec, *, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": config_map_name(name), "namespace": namespace, "labels": group_labels(name)},
        # The trainer's own config: hyperparameters and the checkpoint URI, never credentials
        # (those reach the pod through secretKeyRef or the service account).
        "data": {CONFIG_FILE: json.dumps(spec.train.to_dict(), indent=1, sort_keys=True)},
    }


def render_service(name: str, spec: JobSpec, *, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": group_labels(name)},
        "spec": {
            "clusterIP": "None",
            # DNS records as soon as a pod has an IP: pod 0 must be resolvable while it starts
            # its rendezvous store, long before anything could call it ready.
            "publishNotReadyAddresses": True,
            "selector": {LABEL_GROUP: name},
            "ports": [
                {"name": "rdzv", "port": spec.kubernetes.rdzv_port, "targetPort": spec.kubernetes.rdzv_port}
            ],
        },
    }


def pod_failure_policy() -> dict[str, Any]:
    """How a failed pod ends (or does not end) the group; rules apply in order, the first match wins."""
    return {
        "rules": [
            # A node saved a checkpoint and exited "preempted, resumable". The other nodes cannot
            # go on without it (the world size is fixed): fail the whole Job now. The Job's Failed
            # condition names this exit code, so the launcher reports "preempted" even after the
            # pods are gone, and the operator relaunches the group from the checkpoint.
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": CONTAINER,
                    "operator": "In",
                    "values": [PREEMPTED_EXIT_CODE],
                },
            },
            # Evicted, drained, spot node reclaimed: not the trainer's fault, never counted against
            # backoffLimit. The launcher sees the DisruptionTarget condition and ends the group as
            # preempted itself.
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            # Anything else is a bug or bad input: retrying would fail again.
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": CONTAINER,
                    "operator": "NotIn",
                    "values": [0, PREEMPTED_EXIT_CODE],
                },
            },
        ]
    }


def _job_spec(name: str, spec: JobSpec) -> dict[str, Any]:
    """The Indexed Job's spec without its deadline: one pod per node, no overlapping pods; no retries for an
    all-or-nothing group, a replacement of the lost index only for an elastic one (``elastic_job``)."""
    failures = (
        elastic_job_fields(spec)
        if spec.elastic
        else {"backoffLimit": 0, "podFailurePolicy": pod_failure_policy()}
    )
    return {
        "completionMode": "Indexed",
        "completions": spec.num_nodes,
        "parallelism": spec.num_nodes,
        **failures,
        # A replacement pod starts only once the old one is gone: two pods never share a hostname.
        "podReplacementPolicy": "Failed",
        "template": render_pod_template(name, spec),
    }


def render_job(
    name: str,
    spec: JobSpec,
    *,
    namespace: str,
    spent_usd: float = 0.0,
    compile_cache_claim: str | None = None,
) -> dict[str, Any]:
    k8s = spec.kubernetes
    job_labels = dict(group_labels(name))
    job_spec = _job_spec(name, spec)
    if compile_cache_claim:
        mount_compile_cache(job_spec["template"]["spec"], compile_cache_claim, spec)
    if k8s.kueue_queue:
        job_labels["kueue.x-k8s.io/queue-name"] = k8s.kueue_queue
        # Kueue admits the whole group at once (gang admission) by unsuspending the Job.
        job_spec["suspend"] = True
    annotations = {ANNOTATION_PENDING_TIMEOUT: str(k8s.pending_timeout_s)}
    if spec.elastic:
        annotations.update(elastic_annotation(spec))
    deadline = budget_deadline(spec, spent_usd)
    if deadline is not None:
        # The cluster stops the group at the budget even with nobody watching (status: "at_budget").
        job_spec["activeDeadlineSeconds"] = deadline["seconds"]
        annotations[ANNOTATION_DEADLINE] = json.dumps(deadline, sort_keys=True)
    if k8s.ttl_seconds_after_finished is not None:
        job_spec["ttlSecondsAfterFinished"] = k8s.ttl_seconds_after_finished
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": job_labels,
            "annotations": {**annotations, ANNOTATION_CHECKPOINT_DELIVERY: k8s.checkpoint_now},
        },
        "spec": job_spec,
    }
