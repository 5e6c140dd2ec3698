"""KubernetesGroupNodes against the fake API server: which EC2 instances and nodes a group's pods
run on, and the interruption taints aws-node-termination-handler / Karpenter put on them."""

from __future__ import annotations

from pathlib import Path

from airflow_dtrain.launchers.kubernetes import KubernetesLauncher
from airflow_dtrain.spec import JobSpec
from airflow_dtrain.spot.members import GroupMembers, KubernetesGroupNodes, deserialize_source


def _launch(name: str, tmp_path: Path, nodes: int) -> None:
    spec = JobSpec.from_arguments(
        flavor="debug", steps=10, global_batch_size=nodes, micro_batch_size=1, num_nodes=nodes, procs_per_node=1,
        backend="kubernetes", checkpoint_uri=str(tmp_path / name),
        kubernetes={"image": "ghcr.io/acme/dtrain:test", "volumes": [{"claim": "ckpt", "mount_path": str(tmp_path)}]},
    )  # fmt: skip
    KubernetesLauncher().launch(name, spec.to_dict())


def test_the_group_is_the_instances_its_pods_run_on_and_a_taint_is_a_notice(fake, tmp_path):
    for i, zone in ((1, "us-east-1a"), (2, "us-east-1b"), (3, "us-east-1a")):
        fake.add_node(f"ip-10-0-0-{i}", f"i-00000000000000{i:03d}", zone)
    _launch("ours-r0", tmp_path, 2)
    _launch("theirs-r0", tmp_path, 1)
    fake.run("ours-r0", nodes={0: "ip-10-0-0-1", 1: "ip-10-0-0-2"})
    fake.run("theirs-r0", nodes={0: "ip-10-0-0-3"})

    source = KubernetesGroupNodes(namespace="default")
    source = deserialize_source(*source.serialize())  # as a trigger carries it
    assert source.members("ours-r0") == GroupMembers(
        frozenset({"i-00000000000000001", "i-00000000000000002"}), frozenset({"ip-10-0-0-1", "ip-10-0-0-2"}))
    assert source.node_notices("ours-r0") == []

    fake.taint("ip-10-0-0-3", "aws-node-termination-handler/spot-itn")  # another group's node
    assert source.node_notices("ours-r0") == []
    fake.taint("ip-10-0-0-2", "karpenter.sh/disrupted")
    fake.taint("ip-10-0-0-2", "aws-node-termination-handler/spot-itn")
    [notice] = source.node_notices("ours-r0")
    assert (notice.kind, notice.instance_id, notice.node_name, notice.source) == (
        "spot-interruption", "i-00000000000000002", "ip-10-0-0-2", "node-taint")  # the most urgent of the two
    assert notice in source.members("ours-r0")

