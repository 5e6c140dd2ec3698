"""Placement follows the decision: the zone and instance type the spot sensor and the budget branch chose
are required node affinity on every pod (with the capacity type), the fake scheduler holds the pods to
it, and the training summary records where each group's pods actually ran."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from airflow.exceptions import TaskDeferred

from airflow_dtrain import FSDPTrainOperator
from airflow_dtrain.errors import SpecError
from airflow_dtrain.job.spec import JobSpec
from tests.conftest import REPO, RecordingTI
from tests.kubernetes.conftest import Background
from tests.kubernetes.test_kubernetes_objects import K8S_VERSIONS

ZONE, TYPE, STEPS = "us-east-1b", "p5.48xlarge", 20
SPOT = {"karpenter.sh/capacity-type": "spot", "eks.amazonaws.com/capacityType": "SPOT"}

# The two lines dags/train_llama.py's train() passes to FSDPTrainOperator (zone only for train_spot:
# on-demand prices do not differ by zone).
ZONE_TEMPLATE = (
    "{{ (ti.xcom_pull(task_ids='budget', key='decision') or {}).get('offer', {}).get('availability_zone')"
    " if params.backend == 'kubernetes' else None }}"
)
TYPE_TEMPLATE = (
    "{{ (ti.xcom_pull(task_ids='budget', key='decision') or {}).get('offer', {}).get('instance_type')"
    " if params.backend == 'kubernetes' else None }}"
)


class DecisionTI(RecordingTI):
    """The budget task's decision: a spot offer, as SpotPriceSensor chose it."""

    def xcom_pull(self, task_ids: str | None = None, key: str | None = None) -> Any:
        assert (task_ids, key) == ("budget", "decision")
        return {
            "choice": "spot",
            "offer": {
                "instance_type": TYPE,
                "availability_zone": ZONE,
                "region": "us-east-1",
                "spot_price": 31.5,
                "on_demand_price": 98.3,
                "source": "ec2",
            },
        }


def _operator(tmp_path: Path, **overrides) -> FSDPTrainOperator:
    return FSDPTrainOperator(
        **{
            "task_id": "train_spot",
            "flavor": "debug",
            "steps": STEPS,
            "global_batch_size": 4,
            "micro_batch_size": 2,
            "num_nodes": 2,
            "backend": "kubernetes",
            "checkpoint_uri": str(tmp_path / "ckpt"),
            "capacity": "spot",
            "zone": ZONE_TEMPLATE,
            "instance_type": TYPE_TEMPLATE,
            "kubernetes": {
                "image": "ghcr.io/acme/dtrain:test",
                "volumes": [{"claim": "checkpoints", "mount_path": str(tmp_path)}],
            },
            "poll_interval": 0.05,
            "deferrable": False,
            **overrides,
        }
    )


def _rendered(op: FSDPTrainOperator, ti: RecordingTI, backend: str = "kubernetes") -> FSDPTrainOperator:
    op.render_template_fields({"ti": ti, "params": {"backend": backend}, "run_id": ti.run_id})
    return op


def _required_terms(pod: dict[str, Any]) -> list[dict[str, str]]:
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    out = []
    for term in terms["nodeSelectorTerms"]:
        assert all(e["operator"] == "In" and len(e["values"]) == 1 for e in term["matchExpressions"])
        out.append({e["key"]: e["values"][0] for e in term["matchExpressions"]})
    return out


def _wait(predicate, what: str, task: Background, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if task.done:
            task.result()
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_chosen_zone_and_instance_type_are_required_node_affinity_on_every_pod(fake, tmp_path):
    ti = DecisionTI(dag_id="train_llama", run_id="manual__placed", task_id="train_spot")
    op = _rendered(_operator(tmp_path, deferrable=True), ti)
    assert (op.zone, op.instance_type) == (ZONE, TYPE)
    with pytest.raises(TaskDeferred):
        op.execute({"ti": ti})
    name = ti.xcoms["group"]
    job = fake.get("jobs", name)
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(job, version, strict=True)
    for index in (0, 1):
        terms = _required_terms(fake.pod(name, index))
        # ORed terms (a Karpenter node or an EKS node group node), each one the capacity AND the zone AND the
        # type
        assert terms == [
            {key: value, "topology.kubernetes.io/zone": ZONE, "node.kubernetes.io/instance-type": TYPE}
            for key, value in SPOT.items()
        ]

    # The (fake) scheduler holds the pods to it: another zone or type is refused, the chosen one taken.
    fake.add_node("ip-10-0-1-1", "i-0000000000000a001", "us-east-1a", instance_type=TYPE, capacity="spot")
    fake.add_node("ip-10-0-2-1", "i-0000000000000b001", ZONE, instance_type="p4d.24xlarge", capacity="spot")
    fake.add_node("ip-10-0-2-2", "i-0000000000000b002", ZONE, instance_type=TYPE, capacity="on-demand")
    for node in ("ip-10-0-1-1", "ip-10-0-2-1", "ip-10-0-2-2"):
        with pytest.raises(ValueError, match="cannot run on node"):
            fake.run(name, [0], nodes={0: node})
    fake.add_node("ip-10-0-2-3", "i-0000000000000b003", ZONE, instance_type=TYPE, capacity="spot")
    fake.run(name, [0], nodes={0: "ip-10-0-2-3"})


def test_the_summary_records_where_each_group_ran(fake, tmp_path):
    for i in (1, 2, 3):
        fake.add_node(f"ip-10-0-2-{i}", f"i-0000000000000b00{i}", ZONE, instance_type=TYPE, capacity="spot")
    ti = DecisionTI(dag_id="train_llama", run_id="manual__where", task_id="train_spot")
    task = Background(_rendered(_operator(tmp_path), ti).execute, {"ti": ti})
    first = _wait(lambda: ti.xcoms.get("group"), "the first group", task)
    fake.run(first, nodes={0: "ip-10-0-2-1", 1: "ip-10-0-2-2"})
    _wait(
        lambda: "airflow-dtrain/placement" in fake.get("jobs", first)["metadata"].get("annotations", {}),
        "the placement on the Job",
        task,
    )
    fake.exit(first, 1, 75)  # reclaimed: the relaunch lands elsewhere
    second = _wait(lambda: ti.xcoms.get("group") != first and ti.xcoms.get("group"), "the relaunch", task)
    fake.run(second, nodes={0: "ip-10-0-2-1", 1: "ip-10-0-2-3"})
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "progress.json").write_text(
        json.dumps(
            {
                "status": "completed",
                "step": STEPS,
                "steps": STEPS,
                "loss": 2.5,
                "tokens_seen": 1,
                "latest_checkpoint": str(ckpt / f"step-{STEPS:08d}"),
                "steps_lost": 0,
                "wall_time_s": 1.0,
            }
        )
    )
    for index in (0, 1):
        fake.exit(second, index, 0)
    summary = task.result()

    def ran(*nodes: str) -> list[dict[str, Any]]:
        return [
            {"node_index": i, "node": node, "zone": ZONE, "instance_type": TYPE, "capacity_type": "spot"}
            for i, node in enumerate(nodes)
        ]

    assert summary["placement"] == {
        "chosen": {"zone": ZONE, "instance_type": TYPE, "capacity": "spot"},
        "groups": {first: ran("ip-10-0-2-1", "ip-10-0-2-2"), second: ran("ip-10-0-2-1", "ip-10-0-2-3")},
    }
    assert json.loads((ckpt / "summary.json").read_text())["placement"] == summary["placement"]

    # what it read is what docker/rbac.yaml grants: get on nodes, from the optional ClusterRole
    reads = {
        path.rsplit("/", 1)[-1] for method, path in fake.requests if method == "GET" and "/nodes/" in path
    }
    assert reads == {"ip-10-0-2-1", "ip-10-0-2-2", "ip-10-0-2-3"}
    docs = list(yaml.safe_load_all((REPO / "docker" / "rbac.yaml").read_text()))
    [cluster_role] = [d for d in docs if d["kind"] == "ClusterRole"]
    assert cluster_role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    [binding] = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == cluster_role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == "airflow-dtrain-launcher"


def test_without_leave_to_read_nodes_the_placement_still_names_the_nodes(fake, tmp_path):
    from airflow_dtrain.kubernetes.launcher import KubernetesLauncher
    from tests.kubernetes.conftest import launch_debug_group

    fake.add_node("ip-10-0-3-1", "i-0000000000000c001", ZONE, instance_type=TYPE)
    launch_debug_group("noread-r0", tmp_path, nodes=1)
    fake.run("noread-r0", nodes={0: "ip-10-0-3-1"})
    fake.fail_next("GET", "/api/v1/nodes/ip-10-0-3-1", 403)
    launcher = KubernetesLauncher()
    launcher.status("noread-r0")
    assert launcher.placement("noread-r0") == [
        {"node_index": 0, "node": "ip-10-0-3-1", "zone": None, "instance_type": None, "capacity_type": None}
    ]


def test_on_the_local_backend_the_decision_is_not_a_placement(tmp_path):
    op = _rendered(_operator(tmp_path, backend="local"), DecisionTI(), backend="local")
    spec = op.job_spec()
    assert (spec.zone, spec.instance_type) == (None, None)


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"zone": "us east 1a"}, ["zone", "'us east 1a'"]),
        ({"instance_type": "p5.48xlarge/"}, ["instance_type", "'p5.48xlarge/'"]),
        ({"zone": "us-east-1b",
          "kubernetes": {"image": "img", "node_selector": {"topology.kubernetes.io/zone": "us-west-2a"}}},
         ["zone", "'us-east-1b'", "kubernetes.node_selector", "us-west-2a"]),
    ],
)  # fmt: skip
def test_a_placement_no_node_could_satisfy_is_refused_naming_the_field(arguments, expected):
    arguments = {"backend": "kubernetes", "checkpoint_uri": "s3://bucket/run", "kubernetes": {"image": "img"},
                 **arguments}  # fmt: skip
    with pytest.raises(SpecError) as err:
        JobSpec.from_arguments(**arguments)
    for fragment in expected:
        assert fragment in str(err.value), f"{fragment!r} not in {err.value}"
