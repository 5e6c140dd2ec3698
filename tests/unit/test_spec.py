"""Bad job specs are rejected when the operator is built, naming the field and the value."""

from __future__ import annotations

import pytest

from airflow_dtrain import FSDPTrainOperator
from airflow_dtrain.spec import JobSpec, SpecError, group_base_name, group_name, relaunch_index
from tests.conftest import RecordingTI

BAD = [
    ({"flavor": "tiny"}, ["flavor", "'tiny'"]),
    ({"num_nodes": 0}, ["num_nodes", "0"]),
    ({"procs_per_node": -1}, ["procs_per_node", "-1"]),
    ({"steps": 0}, ["steps", "0"]),
    ({"checkpoint_uri": "ftp://host/ckpt"}, ["checkpoint", "ftp://host/ckpt"]),
    ({"backend": "slurm"}, ["backend", "'slurm'"]),
    ({"lr": -0.1}, ["lr", "-0.1"]),
    ({"max_preemptions": -2}, ["max_preemptions", "-2"]),
    ({"node_resources": {"gpus_per_node": 2}, "procs_per_node": 1}, ["gpus_per_node", "2"]),
    ({"node_resources": {"memory": "lots"}}, ["resources.memory", "'lots'"]),
    ({"node_resources": {"disk": "1Gi"}}, ["resources", "'disk'"]),
    ({"global_batch_size": 8, "micro_batch_size": 2, "num_nodes": 3}, ["global_batch_size", "8", "3", "2"]),
    ({"steps": "fifty"}, ["steps", "'fifty'"]),
]


@pytest.mark.parametrize(("arguments", "expected"), BAD, ids=[str(a) for a, _ in BAD])
def test_bad_spec_is_rejected_at_construction_naming_field_and_value(tmp_path, arguments, expected):
    with pytest.raises(SpecError) as err:
        FSDPTrainOperator(task_id="train", local_state_dir=str(tmp_path), **arguments)
    message = str(err.value)
    for fragment in expected:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert "task_id='train'" in message
    assert not any(tmp_path.iterdir()), "nothing may be launched or written for a bad spec"


def test_templated_fields_are_validated_after_rendering_before_launch(tmp_path, airflow_home):
    op = FSDPTrainOperator(task_id="train", steps="{{ params.steps }}", local_state_dir=str(tmp_path))
    op.steps = "-5"  # what rendering a bad trigger-form value gives
    with pytest.raises(SpecError, match=r"steps.*-5"):
        op.execute({"ti": RecordingTI()})
    assert not any(tmp_path.iterdir()), "a bad rendered spec must not launch anything"


def test_rendered_strings_are_coerced_to_the_field_types():
    spec = JobSpec.from_arguments(steps="12", lr="0.01", num_nodes="2", checkpoint_uri="/tmp/x")
    assert (spec.train.steps, spec.train.optim.lr, spec.num_nodes) == (12, 0.01, 2)


def test_job_spec_round_trips_through_json_types():
    spec = JobSpec.from_arguments(
        flavor="debug", steps=7, num_nodes=2, procs_per_node=2, global_batch_size=8,
        micro_batch_size=2, checkpoint_uri="file:///tmp/ckpt", resources={"cpu": "2", "memory": "4Gi"},
    )  # fmt: skip
    assert JobSpec.from_dict(spec.to_dict()) == spec
    assert spec.world_size == 4


def test_group_names_are_deterministic_dns_safe_and_distinct():
    base = group_base_name("Train_LLaMA", "manual__2026-11-22T01:02:03+00:00", "train", -1)
    assert base == group_base_name("Train_LLaMA", "manual__2026-11-22T01:02:03+00:00", "train", -1)
    assert base != group_base_name("Train_LLaMA", "manual__2026-11-23T01:02:03+00:00", "train", -1)
    assert base != group_base_name("Train_LLaMA", "manual__2026-11-22T01:02:03+00:00", "train", 3)
    long = group_base_name("d" * 200, "r" * 200, "t" * 200)
    for name in (group_name(base, 0), group_name(long, 12)):
        assert len(name) <= 50 and name[0].isalpha()
        assert all(c.islower() or c.isdigit() or c == "-" for c in name), name
    assert relaunch_index(base, group_name(base, 7)) == 7
    assert relaunch_index(base, group_name(base + "x", 7)) is None


def test_the_dag_authors_limits_bound_what_a_rendered_trigger_value_may_ask(tmp_path, airflow_home):
    with pytest.raises(SpecError, match=r"num_nodes: 16 is above this DAG's limit of 8 \(limits.max_nodes\)"):
        FSDPTrainOperator(task_id="train", num_nodes=16, global_batch_size=16, micro_batch_size=1,
                          limits={"max_nodes": 8}, local_state_dir=str(tmp_path))
    op = FSDPTrainOperator(task_id="train", num_nodes="{{ params.num_nodes }}", limits={"max_nodes": 2, "backends": ["local"]},
                           local_state_dir=str(tmp_path))
    op.num_nodes = "4"  # what rendering a trigger value gives: refused before launch
    with pytest.raises(SpecError, match="limits.max_nodes"):
        op.execute({"ti": RecordingTI()})
    op.num_nodes, op.backend = "1", "kubernetes"
    op.kubernetes, op.checkpoint_uri = {"image": "img:1"}, "s3://bucket/run"
    with pytest.raises(SpecError, match=r"backend: 'kubernetes' is not allowed here"):
        op.execute({"ti": RecordingTI()})
    assert not any(tmp_path.iterdir())


def test_a_local_checkpoint_path_is_normalised_once_for_every_reader():
    spec = JobSpec.from_arguments(checkpoint_uri="/tmp/runs/a/../b/./ckpt")
    assert spec.train.checkpoint.uri == "/tmp/runs/b/ckpt"
    assert JobSpec.from_arguments(checkpoint_uri="s3://bucket/a/../b").train.checkpoint.uri == "s3://bucket/a/../b"
