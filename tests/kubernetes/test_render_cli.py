"""``python -m airflow_dtrain render``: YAML a user can read and ``kubectl apply -f -``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import kubernetes_validate
import yaml

from tests.conftest import REPO


def _render(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "airflow_dtrain", "render", *args],
        capture_output=True, text=True, cwd=REPO, env=os.environ.copy(), timeout=60,
    )  # fmt: skip


def test_render_prints_every_object_as_valid_multi_document_yaml():
    out = _render("--backend", "kubernetes", "--num-nodes", "16", "--gpus-per-node", "8",
                  "--image", "ghcr.io/acme/dtrain:0.1.0",
                  "--checkpoint-uri", "s3://ml-ckpt/llama")  # fmt: skip
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert [d["kind"] for d in docs] == ["ConfigMap", "Service", "Job"]
    for doc in docs:
        kubernetes_validate.validate(doc, "1.31.0", strict=True)
    job = docs[2]["spec"]
    assert job["completions"] == job["parallelism"] == 16
    container = job["template"]["spec"]["containers"][0]
    assert container["image"] == "ghcr.io/acme/dtrain:0.1.0"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert container["args"][container["args"].index("--nproc-per-node") + 1] == "8"
    config = json.loads(docs[0]["data"]["train_config.json"])
    assert config["checkpoint"]["uri"] == "s3://ml-ckpt/llama"
    assert config["global_batch_size"] % (16 * 8 * config["micro_batch_size"]) == 0


def test_render_applies_a_spec_file_under_the_flags(tmp_path):
    spec = {
        "train": {"model": {"flavor": "llama3_1b"}, "steps": 1000, "global_batch_size": 64,
                  "micro_batch_size": 4,
                  "checkpoint": {"uri": "s3://ml-ckpt/run7", "grace_period_s": 200}},
        "kubernetes": {"namespace": "ml", "capacity_type": "spot", "kueue_queue": "gpu-queue",
                       "secret_env": {"HF_TOKEN": {"secret": "hf", "key": "token"}}},
    }  # fmt: skip
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = _render(
        "--backend",
        "kubernetes",
        "--nodes",  # the deprecated spelling of --num-nodes still works
        "2",
        "--gpus-per-node",
        "8",
        "--image",
        "img:1",
        "--spec",
        str(path),
    )
    assert out.returncode == 0, out.stderr
    config_map, service, job = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert {d["metadata"]["namespace"] for d in (config_map, service, job)} == {"ml"}
    assert json.loads(config_map["data"]["train_config.json"])["model"]["flavor"] == "llama3_1b"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    pod = job["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= 200
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in pod[
        "containers"
    ][0]["env"]


def test_render_places_the_pods_where_the_price_was_chosen():
    out = _render("--backend", "kubernetes", "--num-nodes", "2", "--gpus-per-node", "8", "--image", "img:1",
                  "--capacity", "spot", "--zone", "us-east-1a", "--instance-type", "p5.48xlarge")  # fmt: skip
    assert out.returncode == 0, out.stderr
    job = [d for d in yaml.safe_load_all(out.stdout) if d][2]
    kubernetes_validate.validate(job, "1.31.0", strict=True)
    terms = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    for term in terms["nodeSelectorTerms"]:  # every term (Karpenter, EKS node groups) requires zone and type
        required = {e["key"]: e["values"] for e in term["matchExpressions"]}
        assert required["topology.kubernetes.io/zone"] == ["us-east-1a"]
        assert required["node.kubernetes.io/instance-type"] == ["p5.48xlarge"]
    assert {"karpenter.sh/capacity-type", "eks.amazonaws.com/capacityType"} <= {
        e["key"] for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"]}  # fmt: skip
    bad = _render("--backend", "kubernetes", "--num-nodes", "1", "--gpus-per-node", "0", "--image", "img:1",
                  "--zone", "us east 1a")  # fmt: skip
    assert bad.returncode == 2 and "zone" in bad.stderr and "'us east 1a'" in bad.stderr and bad.stdout == ""


def test_num_nodes_is_the_flag_and_nodes_its_deprecated_alias():
    out = _render("--backend", "kubernetes", "--help")
    assert out.returncode == 0, out.stderr
    assert "--num-nodes N, --nodes N" in out.stdout and "deprecated" in out.stdout
    assert "Nodes in the group" in out.stdout, "the help is num_nodes' declaration"


def test_render_without_a_checkpoint_uri_says_the_placeholder_must_be_replaced():
    out = _render("--backend", "kubernetes", "--num-nodes", "1", "--gpus-per-node", "0", "--image", "img:1")
    assert out.returncode == 0, out.stderr
    assert "checkpoint.uri is a placeholder" in out.stdout


def test_render_rejects_a_bad_spec_naming_the_field(tmp_path):
    out = _render("--backend", "kubernetes", "--num-nodes", "2", "--gpus-per-node", "8")  # no --image
    assert out.returncode == 2
    assert "kubernetes.image" in out.stderr and "required" in out.stderr
    assert out.stdout == "", "nothing half-rendered for kubectl to apply"


def test_nothing_imports_the_kubernetes_client_at_dag_parse_time():
    probe = (
        "import sys\n"
        "from airflow_dtrain import FSDPTrainOperator\n"
        "FSDPTrainOperator(task_id='t', backend='kubernetes', num_nodes=4, checkpoint_uri='s3://ml-ckpt/x',\n"
        "                  global_batch_size=8, kubernetes={'image': 'img:1', 'capacity_type': 'spot'})\n"
        "FSDPTrainOperator(task_id='u', backend='kubernetes', checkpoint_uri='{{ var.value.ckpt }}',\n"
        "                  kubernetes={'image': '{{ var.value.image }}'})\n"
        "import airflow_dtrain.triggers.fsdp_train, airflow_dtrain.kubernetes.objects\n"
        "print(sorted(m for m in sys.modules\n"
        "             if m == 'kubernetes' or m.startswith(('kubernetes.', 'kubernetes_asyncio'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, env=os.environ.copy()
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_airflow_dtrain_render_is_an_airflow_cli_command_printing_the_same(airflow_home):
    """The provider info's ``cli`` entry puts ``render`` in Airflow's own CLI: same arguments, same YAML."""
    args = ("--backend", "kubernetes", "--num-nodes", "2", "--gpus-per-node", "1", "--image", "img:1",
            "--checkpoint-uri", "s3://ml-ckpt/run9")  # fmt: skip
    airflow = subprocess.run([sys.executable, "-m", "airflow", "dtrain", "render", *args],
                             capture_output=True, text=True, cwd=REPO, env=os.environ.copy(),
                             timeout=120)  # fmt: skip
    assert airflow.returncode == 0, airflow.stderr[-3000:]
    assert airflow.stdout == _render(*args).stdout
    assert [d["kind"] for d in yaml.safe_load_all(airflow.stdout) if d] == ["ConfigMap", "Service", "Job"]
    refused = subprocess.run(
        [sys.executable, "-m", "airflow", "dtrain", "render", *args[:-2], "--spec", "/nonexistent.yaml"],
        capture_output=True, text=True, cwd=REPO, env=os.environ.copy(), timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2 and "/nonexistent.yaml" in refused.stderr


def test_render_with_the_admins_policy_prints_what_the_operator_creates_on_that_connection(tmp_path):
    """``--policy`` (the connection extra's dtrain_policy): the job's compile cache is mounted as the launcher
    mounts it, and a spec the policy refuses is refused here too, before anything is printed."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        yaml.safe_dump({"compile_cache_claim": "dtrain-compile", "allowed_images": ["ghcr.io/acme/"]})
    )
    args = ("--backend", "kubernetes", "--num-nodes", "2", "--gpus-per-node", "0",
            "--checkpoint-uri", "s3://ml-ckpt/llama", "--name", "llama-r0")  # fmt: skip

    out = _render(*args, "--image", "ghcr.io/acme/dtrain:1", "--policy", str(policy))
    assert out.returncode == 0, out.stderr
    job = [d for d in yaml.safe_load_all(out.stdout) if d][-1]
    kubernetes_validate.validate(job, "1.31.0", strict=True)
    pod = job["spec"]["template"]["spec"]
    assert {"name": "compile-cache", "persistentVolumeClaim": {"claimName": "dtrain-compile"}} in pod[
        "volumes"
    ]
    trainer = pod["containers"][0]
    mount = next(m for m in trainer["volumeMounts"] if m["name"] == "compile-cache")
    assert mount["mountPath"] == "/var/cache/dtrain-compile" and mount["subPath"]
    assert any(e["name"] == "TORCHINDUCTOR_CACHE_DIR" for e in trainer["env"])

    without = _render(*args, "--image", "ghcr.io/acme/dtrain:1")  # no policy: a connection without one
    assert without.returncode == 0, without.stderr
    assert "compile-cache" not in without.stdout

    refused = _render(*args, "--image", "docker.io/someone/miner:1", "--policy", str(policy))
    assert refused.returncode == 2 and refused.stdout == ""
    assert "kubernetes.image" in refused.stderr and "docker.io/someone/miner:1" in refused.stderr


def test_render_refuses_a_policy_file_that_is_not_a_mapping_naming_the_flag(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("- compile_cache_claim\n")
    out = _render("--backend", "kubernetes", "--num-nodes", "1", "--gpus-per-node", "0", "--image", "img:1",
                  "--policy", str(policy))  # fmt: skip
    assert out.returncode == 2 and out.stdout == ""
    assert "--policy" in out.stderr and "dtrain_policy" in out.stderr
