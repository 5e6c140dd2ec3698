"""Bad job specs are rejected when the operator is built, naming the field and the value."""

from __future__ import annotations

import pytest

from airflow_dtrain import FSDPTrainOperator
from airflow_dtrain.job.spec import JobSpec
from airflow_dtrain.errors import SpecError
from airflow_dtrain.job.naming import group_base_name, group_name, relaunch_index
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
    ({"entrypoint": ["foo.sh"]}, ["entrypoint: 'foo.sh' is not a Python script"]),
    ({"entrypoint": "train.py --lr 3e-4"}, ["entrypoint: 'train.py --lr 3e-4' holds spaces", "as a list"]),
    ({"entrypoint": ["-m"]}, ["entrypoint: '-m' must be followed by a module name", "['-m']"]),
    ({"entrypoint": ["-m", "my-pkg.train"]}, ["entrypoint: '-m'", "'my-pkg.train'"]),
    ({"entrypoint": ["/opt/train.py", "--steps", 5]}, ["entrypoint[2]: expected a string, got 5"]),
    ({"entrypoint": ["{{ params.program }}"]}, ["entrypoint[0]: '{{ params.program }}' is a template"]),
    (
        {"entrypoint": {"script": "train.py"}},
        ["entrypoint: expected a list of strings", "{'script': 'train.py'}"],
    ),
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
    with pytest.raises(SpecError, match=r"num_nodes: 16 is above the limit of 8 \(limits.max_nodes\)"):
        FSDPTrainOperator(
            task_id="train",
            num_nodes=16,
            global_batch_size=16,
            micro_batch_size=1,
            limits={"max_nodes": 8},
            local_state_dir=str(tmp_path),
        )
    op = FSDPTrainOperator(
        task_id="train",
        num_nodes="{{ params.num_nodes }}",
        limits={"max_nodes": 2, "backends": ["local"]},
        local_state_dir=str(tmp_path),
    )
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
    assert (
        JobSpec.from_arguments(checkpoint_uri="s3://bucket/a/../b").train.checkpoint.uri
        == "s3://bucket/a/../b"
    )


@pytest.mark.parametrize(
    ("entrypoint", "argv", "own"),
    [
        (None, ["-m", "trainer", "--config", "/etc/c.json"], False),
        (["trainer"], ["-m", "trainer", "--config", "/etc/c.json"], False),
        (["-m", "trainer.evaluate", "--x"], ["-m", "trainer.evaluate", "--x"], False),
        (["trainer.evaluate", "--x"], ["-m", "trainer.evaluate", "--x"], False),
        (["-m", "my_pkg.train", "--lr", "3e-4"], ["-m", "my_pkg.train", "--lr", "3e-4"], True),
        (["-m", "trainer_utils.train"], ["-m", "trainer_utils.train"], True),
        (["/opt/own/train.py", "--lr", "3e-4"], ["/opt/own/train.py", "--lr", "3e-4"], True),
        ("/opt/own/train.py", ["/opt/own/train.py"], True),
    ],
)  # fmt: skip
def test_what_torchrun_runs_after_its_own_flags(entrypoint, argv, own):
    spec = JobSpec.from_arguments(entrypoint=entrypoint, backend="kubernetes", checkpoint_uri="s3://bkt/run",
                                  kubernetes={"image": "img:1"})  # fmt: skip
    assert spec.entrypoint_argv("/etc/c.json") == argv
    assert spec.own_program is own
    assert JobSpec.from_dict(spec.to_dict()) == spec
    # only the bundled trainer gets its own flags
    assert ("--set" in spec.entrypoint_argv("/etc/c.json", ["--set", "a=b"])) is (
        argv[:2] == ["-m", "trainer"]
    )


def test_your_own_program_owns_its_config_the_trainers_checks_are_skipped(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    # 8 sequences do not split over 3 ranks x 2: the bundled trainer's rule, not a program of your own's
    op = FSDPTrainOperator(task_id="train", entrypoint=[str(script)], num_nodes=3, global_batch_size=8,
                           micro_batch_size=2, local_state_dir=str(tmp_path / "state"))  # fmt: skip
    assert op.job_spec(skip_templates=True).own_program
    assert "entrypoint" not in FSDPTrainOperator.template_fields, "a run must never render the program"


def test_a_local_script_that_is_not_there_is_refused_before_anything_is_launched(tmp_path):
    op = FSDPTrainOperator(task_id="train", entrypoint=["own/missing.py", "--lr", "1"],
                           local_state_dir=str(tmp_path / "state"))  # fmt: skip
    with pytest.raises(SpecError, match=r"entrypoint: '/.*/own/missing.py' is not a file on this machine"):
        op.execute({"ti": RecordingTI()})
    assert not (tmp_path / "state").exists(), "nothing may be launched or written"
    # relative: the worker's working directory, spelled absolute once for the local backend
    assert op.job_spec(skip_templates=True).entrypoint[0].startswith("/")
    kubernetes = JobSpec.from_arguments(
        entrypoint=["own/train.py"],
        backend="kubernetes",
        checkpoint_uri="s3://bkt/run",
        kubernetes={"image": "img:1"},
    )
    assert kubernetes.entrypoint == ("own/train.py",), "in the image: relative to its WORKDIR"
