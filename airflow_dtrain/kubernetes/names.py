"""The names a pod group's objects share: labels, annotations, paths, and how a group's names derive.

One home for the vocabulary the renderer (``objects``), the launcher and ``status`` all speak, so each of
them imports it from here and none of them from another. Pure constants and string functions.
"""

from __future__ import annotations

LABEL_GROUP = "airflow-dtrain/group"
"""The group's name: selects its Job, Service, ConfigMap and pods."""
LABEL_TASK = "airflow-dtrain/task"
"""The group's name without the relaunch suffix: every group of one task instance."""
LABEL_STORE = "airflow-dtrain/rendezvous-of"
"""On an elastic group's store pod and Service (``store``): the group's name (not ``LABEL_GROUP``: no
node)."""
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "airflow-dtrain"
ANNOTATION_PENDING_TIMEOUT = "airflow-dtrain/pending-timeout-s"
ANNOTATION_OUTCOME = "airflow-dtrain/outcome"
"""Set by the launcher when it ends a group itself (preempted node, no capacity)."""
ANNOTATION_CHECKPOINT_DELIVERY = "airflow-dtrain/checkpoint-now"
"""On the Job: how checkpoint-now reaches its pods, "annotation" (default) or "exec"."""
# Kept equal to trainer/launch.py's names (which imports torch: not importable here); a test checks it.
CHECKPOINT_NOW_ANNOTATION = "dtrain.io/checkpoint-now"
REQUESTS_FILE_ENV = "DTRAIN_REQUESTS_FILE"
PODINFO_DIR = "/etc/dtrain/podinfo"

ANNOTATION_DEADLINE = "airflow-dtrain/deadline"
"""How the Job's activeDeadlineSeconds was derived from the budget (JSON; see
``launchers.base.budget_deadline``)."""
ANNOTATION_PLACEMENT = "airflow-dtrain/placement"
"""Where the group's pods ran: node, zone, instance type and capacity per node index (JSON, written by
the launcher)."""
ANNOTATION_EARLIER = "airflow-dtrain/earlier-groups"
"""The outcomes of the task's earlier groups (JSON), so they are known after their Jobs' TTL deleted them."""

CONTAINER = "trainer"
CONFIG_DIR = "/etc/dtrain"
CONFIG_FILE = "train_config.json"


def task_name(group: str) -> str:
    """``<base>-r3`` -> ``<base>``: what every relaunch of one task instance shares."""
    stem, sep, suffix = group.rpartition("-r")
    return stem if sep and suffix.isdigit() else group


def group_labels(name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "airflow-dtrain",
        "app.kubernetes.io/component": "trainer",
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_GROUP: name,
        LABEL_TASK: task_name(name),
    }


def config_map_name(name: str) -> str:
    return f"{name}-config"


def rendezvous_endpoint(name: str, port: int) -> str:
    """Pod 0's stable DNS name: the Job names it ``<job>-0``, the headless Service adds ``.<service>``."""
    return f"{name}-0.{name}:{port}"


def store_name(name: str) -> str:
    """An elastic group's store pod and Service (a group name has at most 52 characters: a DNS label)."""
    return f"{name}-rdzv"


def store_endpoint(name: str, port: int) -> str:
    """Where every node of an elastic group finds its store: the Service, in the group's namespace."""
    return f"{store_name(name)}:{port}"


ANNOTATION_ELASTIC = "airflow-dtrain/elastic"
"""On an elastic group's Job: its ``min_nodes``, ``min_nodes_timeout_s`` and ``max_preemptions`` (JSON), which
``elastic_status`` reads; absent on an all-or-nothing group."""
ANNOTATION_NODE_TIMES = "airflow-dtrain/node-times"
"""When each pod of an elastic group ran, ``{pod: [start, end or null]}`` in epoch seconds (JSON, written by
the launcher): its node count over time survives the pods."""
