"""KubernetesGroupNodes against the fake API server: which EC2 instances and nodes a group's pods
run on, and the interruption taints aws-node-termination-handler / Karpenter put on them."""

from __future__ import annotations

from airflow_dtrain.kubernetes.nodes import KubernetesGroupNodes
from airflow_dtrain.spot.members import GroupMembers, deserialize_source
from tests.kubernetes.conftest import launch_debug_group


def test_the_group_is_the_instances_its_pods_run_on_and_a_taint_is_a_notice(fake, tmp_path):
    for i, zone in ((1, "us-east-1a"), (2, "us-east-1b"), (3, "us-east-1a")):
        fake.add_node(f"ip-10-0-0-{i}", f"i-00000000000000{i:03d}", zone)
    launch_debug_group("ours-r0", tmp_path, nodes=2)
    launch_debug_group("theirs-r0", tmp_path, nodes=1)
    fake.run("ours-r0", nodes={0: "ip-10-0-0-1", 1: "ip-10-0-0-2"})
    fake.run("theirs-r0", nodes={0: "ip-10-0-0-3"})

    source = KubernetesGroupNodes(namespace="default")
    source = deserialize_source(*source.serialize())  # as a trigger carries it
    assert source.members("ours-r0") == GroupMembers(
        frozenset({"i-00000000000000001", "i-00000000000000002"}), frozenset({"ip-10-0-0-1", "ip-10-0-0-2"})
    )
    assert source.node_notices("ours-r0") == []

    fake.taint("ip-10-0-0-3", "aws-node-termination-handler/spot-itn")  # another group's node
    assert source.node_notices("ours-r0") == []
    fake.taint("ip-10-0-0-2", "karpenter.sh/disrupted")
    fake.taint("ip-10-0-0-2", "aws-node-termination-handler/spot-itn")
    [notice] = source.node_notices("ours-r0")
    assert (notice.kind, notice.instance_id, notice.node_name, notice.source) == (
        "spot-interruption",
        "i-00000000000000002",
        "ip-10-0-0-2",
        "node-taint",
    )  # the most urgent of the two
    assert notice in source.members("ours-r0")
