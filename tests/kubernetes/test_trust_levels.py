"""Who may ask for what on a shared cluster: a trigger chooses within what the DAG's author allowed, who
chooses within the platform admin's policy. Hostile trigger inputs are refused naming the field, before
any write to the (fake) API server."""

from __future__ import annotations

import copy
import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from airflow_dtrain import FSDPTrainOperator
from airflow_dtrain.errors import SpecError
from airflow_dtrain.kubernetes.objects import render_group
from airflow_dtrain.kubernetes.policy import KubernetesPolicy, privileged_settings
from airflow_dtrain.params import UnknownConfKeys, reject_unknown_conf
from airflow_dtrain.job.spec import JobSpec
from tests.conftest import REPO, RecordingTI
from tests.kubernetes.test_kubernetes_objects import K8S_VERSIONS

IMAGE = "ghcr.io/acme/dtrain:1.0"
WRITES = ("POST", "PUT", "PATCH", "DELETE", "EXEC")


def _privileged_container(ctx: dict[str, Any]) -> dict[str, Any]:
    return {"pod_template": {"spec": {"containers": [{"name": "trainer", "securityContext": ctx}]}}}


# (what a trigger sends in dag_run.conf, what the refusal names)
HOSTILE: dict[str, tuple[dict[str, Any], str]] = {
    "privileged pod template": (
        {"kubernetes": _privileged_container({"privileged": True})},
        "kubernetes.pod_template",
    ),
    "hostPath": (
        {
            "kubernetes": {
                "pod_template": {"spec": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}}
            }
        },
        "kubernetes.pod_template",
    ),
    "hostNetwork": (
        {"kubernetes": {"pod_template": {"spec": {"hostNetwork": True}}}},
        "kubernetes.pod_template",
    ),
    "added capabilities": (
        {"kubernetes": _privileged_container({"capabilities": {"add": ["SYS_ADMIN"]}})},
        "kubernetes.pod_template",
    ),
    "runAsUser 0": (
        {"kubernetes": {"pod_template": {"spec": {"securityContext": {"runAsUser": 0}}}}},
        "kubernetes.pod_template",
    ),
    "image outside the allowlist": (
        {"kubernetes": {"image": "docker.io/evil/miner:latest"}},
        "kubernetes.image",
    ),
    "another namespace": ({"kubernetes": {"namespace": "kube-system"}}, "kubernetes.namespace"),
    "another service account": (
        {"kubernetes": {"service_account": "cluster-admin"}},
        "kubernetes.service_account",
    ),
    "10,000 nodes": ({"num_nodes": 10_000}, "num_nodes"),
}


@pytest.fixture
def deployed(monkeypatch, tmp_path):
    """train_llama as a platform deploys it: its pods ([dtrain] kubernetes) allow any tag of one
    repository and two namespaces."""
    monkeypatch.setenv(
        "AIRFLOW__DTRAIN__KUBERNETES",
        json.dumps(
            {
                "image": IMAGE,
                "namespace": "ml",
                "allowed_images": ["ghcr.io/acme/dtrain:"],
                "allowed_namespaces": ["ml-batch"],
                "volumes": [{"claim": "checkpoints", "mount_path": str(tmp_path)}],
            }
        ),
    )
    loader = importlib.util.spec_from_file_location("train_llama_trust", REPO / "dags" / "train_llama.py")
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return module.dag


class DecisionTI(RecordingTI):
    def xcom_pull(self, task_ids: str | None = None, key: str | None = None) -> Any:
        return "builtin" if task_ids == "prepare_data" else {"offer": {"on_demand_price": 3.5}}


def _rendered_train_task(dag, conf: dict[str, Any], tmp_path: Path) -> FSDPTrainOperator:
    """The DAG's train_on_demand task rendered with `conf` merged into its params, as a run would (the
    form's own validation skipped: this is what reaches the operator if the form is bypassed)."""
    task = copy.deepcopy(dag.get_task("train_on_demand"))
    params = {**dag.params.dump(), "backend": "kubernetes", "checkpoint_uri": str(tmp_path / "ckpt"), **conf}
    ti = DecisionTI(dag_id="train_llama", run_id="manual__hostile", task_id="train_on_demand")
    task.render_template_fields({"params": params, "run_id": ti.run_id, "ti": ti})
    task.poll_interval = 0.05
    return task


@pytest.mark.parametrize("case", list(HOSTILE))
def test_the_trigger_form_refuses_hostile_input_naming_the_field(deployed, case):
    conf, field = HOSTILE[case]
    params = copy.deepcopy(deployed.params)
    top = next(iter(conf))
    if case in ("image outside the allowlist", "another namespace"):
        # Well-formed choices: the form lets them through, the train task checks them against the DAG's lists
        params[top] = conf[top]
        params.validate()
        return
    with pytest.raises(Exception) as err:  # noqa: PT011 - Airflow's ParamValidationError
        params[top] = conf[top]
        params.validate()
    message = str(err.value)
    assert top in message, message
    assert field.rsplit(".", 1)[-1] in message or "maximum" in message, message


@pytest.mark.parametrize("case", list(HOSTILE))
def test_the_train_task_refuses_hostile_input_before_any_api_write(deployed, fake, tmp_path, case):
    conf, field = HOSTILE[case]
    with pytest.raises(SpecError) as err:
        task = _rendered_train_task(deployed, conf, tmp_path)
        task.execute(
            {"ti": DecisionTI(dag_id="train_llama", run_id="manual__hostile", task_id="train_on_demand")}
        )
    message = str(err.value)
    assert f"{field}:" in message or f"{field} " in message, message
    assert [r for r in fake.requests if r[0] in WRITES] == []


def test_unknown_conf_keys_are_refused_naming_them(deployed):
    with pytest.raises(UnknownConfKeys, match=r"unknown key\(s\) 'gpus', 'stepz'"):
        reject_unknown_conf({"stepz": 10, "gpus": 8, "steps": 5}, deployed.params)


def test_a_trigger_may_choose_an_allowed_tag_and_namespace(deployed, fake, tmp_path):
    task = _rendered_train_task(deployed, {"kubernetes": {"image": "ghcr.io/acme/dtrain:1.1",
                                                          "namespace": "ml-batch"}}, tmp_path)  # fmt: skip
    spec = task.job_spec()
    assert (spec.kubernetes.image, spec.kubernetes.namespace) == ("ghcr.io/acme/dtrain:1.1", "ml-batch")
    # what the author set stays the author's
    assert spec.kubernetes.volumes == ({"claim": "checkpoints", "mount_path": str(tmp_path)},)
    # a prefix is a repository and a separator: a look-alike repository is not in it
    with pytest.raises(SpecError, match=r"kubernetes.image: 'ghcr.io/acme/dtrain-evil:1.0' is not allowed"):
        _rendered_train_task(
            deployed, {"kubernetes": {"image": "ghcr.io/acme/dtrain-evil:1.0"}}, tmp_path
        ).job_spec()


def test_a_run_without_a_budget_still_gets_a_deadline(deployed, fake, tmp_path):
    """budget_usd null on the form: the Job still has activeDeadlineSeconds, the platform's max_runtime_s."""
    from airflow.sdk.exceptions import TaskDeferred

    task = _rendered_train_task(
        deployed, {"budget_usd": None, "checkpoint_uri": str(tmp_path / "nobudget")}, tmp_path
    )
    task.deferrable = True
    with fake.lock:
        fake._create("namespaces", "", {"metadata": {"name": "ml"}})  # the deployed pods' namespace
    ti = DecisionTI(dag_id="train_llama", run_id="manual__nobudget", task_id="train_on_demand")
    with pytest.raises(TaskDeferred):
        task.execute({"ti": ti})
    job = fake.get("jobs", ti.xcoms["group"], namespace="ml")
    assert task.job_spec().budget_usd is None
    assert job["spec"]["activeDeadlineSeconds"] == 86_400
    assert json.loads(job["metadata"]["annotations"]["airflow-dtrain/deadline"])["by"] == "max_runtime_s"


def test_a_dag_template_cannot_hand_pod_settings_to_the_trigger():
    with pytest.raises(SpecError, match=r"kubernetes: a template here may not read params or dag_run"):
        FSDPTrainOperator(task_id="t", backend="kubernetes", kubernetes="{{ params.kubernetes }}")
    with pytest.raises(SpecError, match=r"kubernetes: a template here may not read params or dag_run"):
        FSDPTrainOperator(task_id="t", kubernetes={"image": "{{ dag_run.conf['image'] }}"})
    # the author's own templates (a Variable) stay allowed
    FSDPTrainOperator(task_id="t", kubernetes={"image": "{{ var.value.trainer_image }}"})


# -- the admin's level --------------------------------------------------------------------------------

PRIVILEGED_TEMPLATE = {
    "spec": {
        "hostNetwork": True,
        "volumes": [{"name": "dev", "hostPath": {"path": "/dev"}}],
        "containers": [
            {
                "name": "trainer",
                "securityContext": {"privileged": True, "capabilities": {"add": ["IPC_LOCK"]}},
                "volumeMounts": [{"name": "dev", "mountPath": "/dev/host"}],
            }
        ],
    }
}


def _operator(tmp_path: Path, **kubernetes: Any) -> FSDPTrainOperator:
    return FSDPTrainOperator(
        task_id="train",
        flavor="debug",
        steps=4,
        global_batch_size=2,
        micro_batch_size=1,
        num_nodes=2,
        backend="kubernetes",
        checkpoint_uri=str(tmp_path / "ckpt"),
        poll_interval=0.05,
        kubernetes={
            "image": IMAGE,
            "volumes": [{"claim": "checkpoints", "mount_path": str(tmp_path)}],
            **kubernetes,
        },
    )


def _set_policy(monkeypatch, fake, tmp_path, policy: dict[str, Any]) -> None:
    kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig-admin")
    monkeypatch.setenv(
        "AIRFLOW_CONN_KUBERNETES_DEFAULT",
        json.dumps(
            {
                "conn_type": "kubernetes",
                "extra": {"kube_config_path": str(kubeconfig), "dtrain_policy": policy},
            }
        ),
    )


def test_a_dag_authors_privileged_pod_needs_the_admin(fake, tmp_path, monkeypatch, caplog):
    ti = RecordingTI(dag_id="d", run_id="r", task_id="train")
    with pytest.raises(
        SpecError,
        match=r"kubernetes.pod_template.spec.hostNetwork: True: a privileged setting, "
        r"which only the platform admin can allow",
    ):
        _operator(tmp_path, pod_template=PRIVILEGED_TEMPLATE).execute({"ti": ti})
    assert [r for r in fake.requests if r[0] in WRITES] == []

    _set_policy(monkeypatch, fake, tmp_path, {"allow_privileged": True})
    caplog.set_level(logging.WARNING)
    from airflow_dtrain.launchers.factory import get_launcher

    launcher = get_launcher("kubernetes", kubernetes_conn_id="kubernetes_default", namespace=None)
    spec = _operator(tmp_path, pod_template=PRIVILEGED_TEMPLATE).job_spec()
    launcher.launch("priv-r0", spec)
    posted = [r for r in fake.requests if r[0] == "POST"]
    assert any(path.endswith("/jobs") for _, path in posted)
    logged = [r.getMessage() for r in caplog.records if "Privileged pod setting allowed" in r.getMessage()]
    assert any("hostNetwork" in m for m in logged) and any("privileged: True" in m for m in logged)
    assert any("hostPath" in m for m in logged) and any("capabilities.add" in m for m in logged)


@pytest.mark.parametrize(("policy", "kubernetes", "expected"), [
    ({"allowed_images": ["registry.internal/ml/"]}, {},
     "kubernetes.image: 'ghcr.io/acme/dtrain:1.0' is not allowed on this cluster"),
    ({"allowed_images": ["ghcr.io/acme/"]}, {"allowed_images": ["docker.io/"]},
     "kubernetes.allowed_images: 'docker.io/' is not allowed on this cluster"),
    ({"allowed_namespaces": ["ml"]}, {"namespace": "default"},
     "kubernetes.namespace: 'default' is not allowed"),
    ({"allowed_service_accounts": ["dtrain-trainer"]}, {"service_account": "admin"},
     "kubernetes.service_account: 'admin' is not allowed on this cluster"),
])  # fmt: skip
def test_the_admins_policy_bounds_the_dag_author(fake, tmp_path, monkeypatch, policy, kubernetes, expected):
    _set_policy(monkeypatch, fake, tmp_path, policy)
    with pytest.raises(SpecError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        _operator(tmp_path, **kubernetes).execute(
            {"ti": RecordingTI(dag_id="d", run_id="r", task_id="train")}
        )
    assert [r for r in fake.requests if r[0] in WRITES] == []


def test_a_bad_policy_names_the_key():
    with pytest.raises(SpecError, match=r"connection extra dtrain_policy.allow_privilege: unknown key"):
        KubernetesPolicy.from_extra({"dtrain_policy": {"allow_privilege": True}})
    with pytest.raises(SpecError, match=r"dtrain_policy.allow_privileged: expected true or false, got 'yes'"):
        KubernetesPolicy.from_extra({"dtrain_policy": {"allow_privileged": "yes"}})


def test_the_privileged_settings_checker_finds_each_and_passes_a_plain_template():
    found = privileged_settings(PRIVILEGED_TEMPLATE)
    assert found == [
        "kubernetes.pod_template.spec.hostNetwork: True",
        "kubernetes.pod_template.spec.volumes[0].hostPath: {'path': '/dev'}",
        "kubernetes.pod_template.spec.containers[0].securityContext.privileged: True",
        "kubernetes.pod_template.spec.containers[0].securityContext.capabilities.add: ['IPC_LOCK']",
    ]
    assert (
        privileged_settings(
            {
                "spec": {
                    "containers": [
                        {
                            "name": "trainer",
                            "workingDir": "/work",
                            "securityContext": {
                                "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
                                "runAsUser": 1000,
                            },
                        }
                    ]
                }
            }
        )
        == []
    )


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_an_admin_widened_group_still_renders_valid_objects(version):
    spec = JobSpec.from_arguments(
        flavor="debug", num_nodes=2, global_batch_size=2, micro_batch_size=1, backend="kubernetes",
        checkpoint_uri="s3://ml-checkpoints/llama",
        kubernetes={"image": IMAGE, "namespace": "ml", "pod_template": PRIVILEGED_TEMPLATE,
                    "allowed_images": ["ghcr.io/acme/dtrain:"], "allowed_namespaces": ["ml-batch"]},
    )  # fmt: skip
    KubernetesPolicy(allow_privileged=True).check(spec, namespace="ml")
    for obj in render_group("widened-r0", spec, namespace="ml"):
        kubernetes_validate.validate(obj, version, strict=True)
