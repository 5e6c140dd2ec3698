"""The rendered pod group: valid Kubernetes objects that do what a platform engineer would write."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest

from airflow_dtrain.kubernetes.objects import render_group
from airflow_dtrain.kubernetes.names import LABEL_GROUP
from airflow_dtrain.job.spec import JobSpec
from airflow_dtrain.errors import SpecError

# Oldest and newest schemas this project supports: podFailurePolicy and podReplacementPolicy
# need Kubernetes >= 1.31 (both beta-on or GA there).
K8S_VERSIONS = ("1.31.0", "1.37.0")


def _spec(nodes: int, gpus: int, **kubernetes) -> JobSpec:
    return JobSpec.from_arguments(
        flavor="llama3_8b" if gpus else "debug",
        num_nodes=nodes,
        procs_per_node=max(1, gpus),
        global_batch_size=nodes * max(1, gpus) * 2,
        micro_batch_size=2,
        checkpoint_uri="s3://ml-checkpoints/llama",
        resources={"gpus_per_node": gpus, "cpu": "90", "memory": "900Gi"} if gpus else {"cpu": "1"},
        backend="kubernetes",
        kubernetes={"image": "ghcr.io/acme/dtrain:0.1.0", "namespace": "ml", **kubernetes},
    )


def _by_kind(objects: list[dict]) -> dict[str, dict]:
    return {o["kind"]: o for o in objects}


@pytest.mark.parametrize(("nodes", "gpus"), [(1, 0), (2, 8), (16, 8)])
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_rendered_objects_validate_against_the_kubernetes_schema(nodes, gpus, version):
    spec = _spec(
        nodes, gpus, capacity_type="spot", topology_spread="kubernetes.io/hostname", kueue_queue="gpu",
        priority_class="training", secret_env={"HF_TOKEN": {"secret": "hf", "key": "token"}},
        statsd_host="node", volumes=[{"claim": "datasets", "mount_path": "/data", "read_only": True}],
        pod_template={"spec": {"containers": [{"name": "trainer", "workingDir": "/work"}]}},
    )  # fmt: skip
    objects = render_group("train-llama-train-0123456789-r0", spec, namespace="ml")
    assert [o["kind"] for o in objects] == ["ConfigMap", "Service", "Job"]
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)  # raises with the offending path
    job = _by_kind(objects)["Job"]["spec"]
    assert job["completionMode"] == "Indexed"
    assert job["completions"] == job["parallelism"] == nodes


def test_the_schema_check_can_fail():
    job = _by_kind(render_group("g-r0", _spec(2, 8), namespace="ml"))["Job"]
    job["spec"]["template"]["spec"]["containers"][0]["comand"] = ["python"]  # a typo kubectl would reject
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSIONS[0], strict=True)


def test_pods_rendezvous_on_pod_zero_with_node_rank_from_the_completion_index():
    objects = _by_kind(render_group("grp-r2", _spec(4, 8), namespace="ml"))
    service, job = objects["Service"], objects["Job"]
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {LABEL_GROUP: "grp-r2"}
    assert pod["subdomain"] == service["metadata"]["name"] == job["metadata"]["name"] == "grp-r2"
    assert container["command"] == ["python", "-m", "trainer.launch"]
    args = container["args"]
    assert all(isinstance(a, str) for a in args), "command and args are lists of strings, no shell"
    assert args[args.index("--rdzv-endpoint") + 1] == "grp-r2-0.grp-r2:29400"
    assert args[args.index("--nnodes") + 1] == "4" and args[args.index("--nproc-per-node") + 1] == "8"
    assert args[args.index("--rdzv-backend") + 1] == "c10d"
    env = {e["name"]: e for e in container["env"]}
    assert env["DTRAIN_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    assert env["DTRAIN_CHECKPOINT_URI"]["value"] == "s3://ml-checkpoints/llama"
    config = json.loads(objects["ConfigMap"]["data"]["train_config.json"])
    assert (
        config["model"]["flavor"] == "llama3_8b"
        and config["checkpoint"]["uri"] == "s3://ml-checkpoints/llama"
    )
    assert args[-2:] == ["--config", "/etc/dtrain/train_config.json"]


def test_pods_ask_for_gpus_shm_and_grace_and_run_locked_down():
    spec = _spec(2, 8, service_account="llm-trainer")
    pod = _by_kind(render_group("g-r0", spec, namespace="ml"))["Job"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "8"
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert pod["terminationGracePeriodSeconds"] >= spec.train.checkpoint.grace_period_s
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["serviceAccountName"] == "llm-trainer"
    assert pod["restartPolicy"] == "Never"


def test_longer_preemption_grace_gives_a_longer_termination_grace_period():
    spec = JobSpec.from_dict({**_spec(1, 0).to_dict(), "train": {**_spec(1, 0).train.to_dict(),
                              "checkpoint": {"uri": "s3://bucket/x", "grace_period_s": 300.5}}})  # fmt: skip
    pod = _by_kind(render_group("g-r0", spec, namespace="ml"))["Job"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= 301


def test_failure_policy_ignores_disruptions_and_ends_the_group_on_preemption_or_failure():
    job = _by_kind(render_group("g-r0", _spec(2, 8), namespace="ml"))["Job"]["spec"]
    rules = job["podFailurePolicy"]["rules"]
    assert rules[0] == {
        "action": "FailJob",
        "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [75]},
    }
    assert rules[1] == {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    assert rules[2]["action"] == "FailJob" and rules[2]["onExitCodes"]["operator"] == "NotIn"
    assert set(rules[2]["onExitCodes"]["values"]) == {0, 75}
    assert job["backoffLimit"] == 0
    assert job["podReplacementPolicy"] == "Failed"


def test_secrets_only_by_reference_and_never_in_the_config():
    spec = _spec(
        1, 0, secret_env={"HF_TOKEN": {"secret": "hf", "key": "token"}}, env={"AWS_REGION": "eu-west-1"}
    )
    objects = _by_kind(render_group("g-r0", spec, namespace="ml"))
    env = {e["name"]: e for e in objects["Job"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}},
    }
    assert env["AWS_REGION"]["value"] == "eu-west-1"
    config = objects["ConfigMap"]["data"]["train_config.json"].lower()
    assert "hf_token" not in config and '"hf"' not in config and "secret" not in config


@pytest.mark.parametrize(
    ("capacity", "karpenter", "eks"),
    [
        ("spot", "spot", "SPOT"),
        ("on_demand", "on-demand", "ON_DEMAND"),
        ("on-demand", "on-demand", "ON_DEMAND"),
    ],
)
def test_capacity_type_selects_karpenter_or_eks_nodes_and_tolerates_their_taints(capacity, karpenter, eks):
    pod = _by_kind(render_group("g-r0", _spec(2, 8, capacity_type=capacity), namespace="ml"))["Job"]
    pod = pod["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    # ORed terms: a Karpenter node or an EKS managed node group node qualifies
    assert [t["matchExpressions"][0] for t in terms] == [
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": [karpenter]},
        {"key": "eks.amazonaws.com/capacityType", "operator": "In", "values": [eks]},
    ]
    tolerated = {(t["key"], t.get("value")) for t in pod["tolerations"]}
    assert {("karpenter.sh/capacity-type", karpenter), ("eks.amazonaws.com/capacityType", eks)} <= tolerated
    assert ("nvidia.com/gpu", None) in tolerated


def test_any_capacity_has_no_capacity_affinity():
    pod = _by_kind(render_group("g-r0", _spec(1, 0), namespace="ml"))["Job"]["spec"]["template"]["spec"]
    assert "affinity" not in pod and "tolerations" not in pod


def test_kueue_queue_priority_and_topology_spread():
    spec = _spec(2, 8, kueue_queue="team-a", priority_class="high", topology_spread="kubernetes.io/hostname")
    job = _by_kind(render_group("g-r0", spec, namespace="ml"))["Job"]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["spec"]["suspend"] is True, "Kueue admits the whole group by unsuspending it"
    pod = job["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "high"
    [spread] = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname" and spread["labelSelector"]["matchLabels"] == {
        LABEL_GROUP: "g-r0"
    }


def test_pod_template_overrides_merge_by_name():
    spec = _spec(1, 0, pod_template={
        "metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}},
        "spec": {
            "containers": [
                {"name": "trainer", "securityContext": {"readOnlyRootFilesystem": False},
                 "env": [{"name": "NCCL_DEBUG", "value": "INFO"}]},
                {"name": "sidecar", "image": "busybox"},
            ],
            "nodeSelector": {"topology.kubernetes.io/zone": "us-east-1a"},
        },
    })  # fmt: skip
    template = _by_kind(render_group("g-r0", spec, namespace="ml"))["Job"]["spec"]["template"]
    trainer, sidecar = template["spec"]["containers"]
    assert trainer["securityContext"]["readOnlyRootFilesystem"] is False
    assert trainer["securityContext"]["capabilities"] == {"drop": ["ALL"]}, "the rest of the context stays"
    env = {e["name"] for e in trainer["env"]}
    assert {"NCCL_DEBUG", "DTRAIN_NODE_RANK"} <= env
    assert (sidecar["name"], sidecar["image"]) == ("sidecar", "busybox")
    # an added container gets the pod's locked-down context and small requests and limits of its own
    assert sidecar["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert (
        sidecar["resources"]["requests"]
        == sidecar["resources"]["limits"]
        == {"cpu": "100m", "memory": "256Mi", "ephemeral-storage": "1Gi"}
    )
    assert template["metadata"]["annotations"] == {"karpenter.sh/do-not-disrupt": "true"}
    assert template["metadata"]["labels"][LABEL_GROUP] == "g-r0"
    assert template["spec"]["nodeSelector"] == {"topology.kubernetes.io/zone": "us-east-1a"}


def test_names_fit_dns_limits_for_the_longest_group_names():
    from airflow_dtrain.job.naming import group_base_name, group_name

    name = group_name(group_base_name("d" * 200, "r" * 200, "t" * 200), 99)
    objects = render_group(name, _spec(16, 8), namespace="ml")
    for obj in objects:
        assert len(obj["metadata"]["name"]) <= 63
        for value in obj["metadata"]["labels"].values():
            assert len(value) <= 63
    assert len(f"{name}-15") <= 63, "the pods' hostname <job>-<index> is a DNS label"


BAD = [
    ({"kubernetes": None}, ["kubernetes.image", "required"]),
    ({"checkpoint_uri": "/tmp/ckpt"}, ["checkpoint_uri", "/tmp/ckpt", "s3://"]),
    (
        {"kubernetes": {"image": "img", "capacity_type": "preemptible"}},
        ["kubernetes.capacity_type", "preemptible"],
    ),
    (
        {"kubernetes": {"image": "img", "env": {"HF_TOKEN": "hf_abc"}}},
        ["kubernetes.env.HF_TOKEN", "secret_env"],
    ),
    ({"kubernetes": {"image": "img", "secret_env": {"X": "plain"}}}, ["kubernetes.secret_env.X"]),
    ({"kubernetes": {"image": "img", "volumes": [{"claim": "c"}]}}, ["kubernetes.volumes[0]"]),
    ({"kubernetes": {"image": "img", "namespace": "ML_Team"}}, ["kubernetes.namespace", "ML_Team"]),
    ({"kubernetes": {"image": "img", "imagee": "x"}}, ["kubernetes", "'imagee'"]),
    ({"kubernetes": {"image": "img", "pending_timeout_s": -1}}, ["kubernetes.pending_timeout_s", "-1"]),
]


@pytest.mark.parametrize(("change", "expected"), BAD, ids=[str(c) for c, _ in BAD])
def test_bad_kubernetes_specs_are_rejected_naming_the_field(change, expected):
    arguments = {
        "checkpoint_uri": "s3://bucket/ckpt",
        "backend": "kubernetes",
        "kubernetes": {"image": "img"},
        **change,
    }
    with pytest.raises(SpecError) as err:
        JobSpec.from_arguments(**arguments)
    for fragment in expected:
        assert fragment in str(err.value), f"{fragment!r} not in {err.value}"


def test_a_path_on_a_declared_volume_is_a_valid_checkpoint_uri_and_the_spec_round_trips():
    spec = JobSpec.from_arguments(
        checkpoint_uri="/mnt/ckpt/run1", backend="kubernetes",
        kubernetes={"image": "img", "volumes": [{"claim": "ckpt", "mount_path": "/mnt/ckpt"}],
                    "tolerations": [{"key": "a", "operator": "Exists"}], "node_selector": {"a": "b"}},
    )  # fmt: skip
    assert JobSpec.from_dict(spec.to_dict()) == spec
    assert json.loads(json.dumps(spec.to_dict())) == spec.to_dict()


@pytest.mark.parametrize("grace", [30.0, 240.0])
def test_every_node_agent_waits_out_a_preemption_save_before_killing_its_workers(tmp_path, grace):
    """torchrun SIGKILLs its workers TORCH_ELASTIC_SHUTDOWN_TIMEOUT after a SIGTERM (30 s by default):
    both backends set it to the job's checkpoint.grace_period_s, whatever the entrypoint."""
    from airflow_dtrain.launchers.torchrun import agent_env

    spec = JobSpec.from_arguments(
        num_nodes=2, backend="kubernetes", checkpoint_uri="s3://bucket/run", kubernetes={"image": "img"},
        config={"checkpoint": {"grace_period_s": grace}},
    )  # fmt: skip
    container = _by_kind(render_group("g-r0", spec, namespace="ml"))["Job"]["spec"]["template"]["spec"][
        "containers"
    ][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == str(int(grace))
    assert agent_env(spec)["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == str(int(grace))  # what the local backend uses


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_a_program_of_your_own_runs_under_every_pods_agent_with_the_jobs_contract_in_its_env(version):
    spec = JobSpec.from_arguments(
        entrypoint=["/opt/own/train.py", "--lr", "3e-4"], job="own-llm", steps=500, checkpoint_every=50,
        simulate_preemption_at_step=100, num_nodes=2, procs_per_node=8, resources={"gpus_per_node": 8},
        global_batch_size=6, micro_batch_size=2,  # not the bundled trainer's batch arithmetic: your program's
        checkpoint_uri="s3://ml-checkpoints/own", backend="kubernetes",
        kubernetes={"image": "registry.example.com/own-trainer:1", "statsd_host": "node"},
        config={"checkpoint": {"grace_period_s": 240}},
    )  # fmt: skip
    objects = render_group("own-llm-train-0123456789-r1", spec, namespace="ml")
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)
    container = _by_kind(objects)["Job"]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == [
        "python",
        "-m",
        "trainer.launch",
    ]  # the same agent: exit codes, relaunches
    args = container["args"]
    assert args[args.index("--max-restarts") + 2 :] == ["/opt/own/train.py", "--lr", "3e-4"]
    assert "--config" not in args and "--set" not in args, (
        "the bundled trainer's flags are not your program's"
    )
    names = [e["name"] for e in container["env"]]
    assert len(names) == len(set(names)), "each variable once"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (
        env["DTRAIN_STATSD_PORT"] == "8125"
    )  # beside DTRAIN_STATSD_HOST (the node's IP): yours to report to
    assert {
        k: env[k]
        for k in env
        if k.startswith("DTRAIN_")
        and k not in ("DTRAIN_NODE_RANK", "DTRAIN_STATSD_HOST", "DTRAIN_STATSD_PORT", "DTRAIN_DATA_DIR")
    } == {
        "DTRAIN_GROUP_NAME": "own-llm-train-0123456789-r1",
        "DTRAIN_CHECKPOINT_URI": "s3://ml-checkpoints/own",
        "DTRAIN_JOB": "own-llm",
        "DTRAIN_STEPS": "500",
        "DTRAIN_CHECKPOINT_EVERY": "50",
        "DTRAIN_GRACE_PERIOD_S": "240",
        "DTRAIN_SIMULATE_PREEMPTION_AT_STEP": "100",
        "DTRAIN_REQUESTS_FILE": "/etc/dtrain/podinfo/annotations",  # checkpoint-now, for the node agent
    }
    assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "240"
