"""No string a run supplies is ever expanded by the kubelet.

The kubelet expands ``$(VAR)`` in a container's ``command``, ``args`` and ``env[].value`` from the container's
env, a ``secretKeyRef`` one such as ``HF_TOKEN`` included: a trigger's ``checkpoint_uri`` of
``/ckpt/$(HF_TOKEN)`` would hand the secret to the evaluation job's arguments, and from there to its logs,
XComs and object keys. Every string field of ``train_llama``'s trigger form is set to such a value; where the
form (or the train task, before any API call) refuses it, fine; otherwise both pod groups of a run are
launched on the fake API server, and every container string of every object it received is expanded as the
kubelet would: nothing may be substituted, and the value must reach the pods as written.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_dtrain.errors import SpecError
from airflow_dtrain.kubernetes.objects import render_group
from airflow_dtrain.operators.evaluate_checkpoint import EvaluationFailed
from airflow_dtrain.job.spec import JobSpec
from tests.conftest import REPO, RecordingTI
from tests.kubernetes.conftest import Background
from trainer.checkpoint.directory import CheckpointDir

REPOSITORY = "ghcr.io/acme/dtrain"
SECRET = "hf_secret_0123456789"
"""What the kubelet would put in for ``$(HF_TOKEN)`` (the Secret's value)."""
SERVICE_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
"""What the kubelet adds to every container's env (service links), after the container's own."""
PROVIDER_REFERENCES = {
    "metrics.statsd_host=$(DTRAIN_STATSD_HOST)",
    "metrics.statsd_port=$(DTRAIN_STATSD_PORT)",
}
"""The provider's own references to the container's env (the bundled trainer's statsd flags): expanded on
purpose."""
VARIANTS = ("$(HF_TOKEN)", "a$(HF_TOKEN)b", "$$(HF_TOKEN)", "$$$(HF_TOKEN)", "$(HF_TOKEN")
ALL_VARIANTS = "_".join(VARIANTS)  # the unclosed one last: a later ")" would close it
WRITES = ("POST", "PUT", "PATCH")
REACHING_THE_PODS = {"checkpoint_uri", "registry_uri", "init_from", "dataset"}
"""Fields that reach the pods (args, env, ConfigMap) with a value the form accepts: the test launches them."""
REFUSED_WHOLE = {"kubernetes.image"}
"""Fields that reach the pods but whose grammar has no '$' (an image reference): every variant is refused,
naming the field, before anything is written."""


# -- the kubelet's expansion ---------------------------------------------------------------------------------


def kubelet_expand(value: str, lookup: Callable[[str], str | None]) -> str:
    """k8s.io/kubernetes third_party/forked/golang/expansion ``Expand``: ``$(NAME)`` becomes the variable's
    value where ``lookup`` knows it and stays as written where not, ``$$`` becomes ``$``, an unclosed ``$(``
    and any other ``$`` stay as they are. One pass: a substituted value is not expanded again."""
    out, i = [], 0
    while i < len(value):
        if value[i] != "$" or i + 1 == len(value):
            out.append(value[i])
            i += 1
            continue
        following = value[i + 1]
        close = value.find(")", i + 2) if following == "(" else -1
        if following == "$":
            out.append("$")
            i += 2
        elif close != -1:
            name = value[i + 2 : close]
            found = lookup(name)
            out.append(f"$({name})" if found is None else found)
            i = close + 1
        else:
            out.append(value[i : i + 2])
            i += 2
    return "".join(out)


def _value_from(source: dict[str, Any]) -> str:
    """What the kubelet resolves a ``valueFrom`` to (never expanded): the Secret's value for HF_TOKEN."""
    if "secretKeyRef" in source:
        return SECRET if source["secretKeyRef"]["name"] == "hf" else "other-secret"
    return "<" + json.dumps(source, sort_keys=True) + ">"


def expanded_strings(container: dict[str, Any]) -> Iterator[tuple[str, str, str, set[str]]]:
    """``(where, raw, as the program receives it, variables substituted)`` for each env value (expanded with
    the variables before it, as the kubelet does), then each command and args entry (with the whole env)."""
    env = dict(SERVICE_ENV)

    def expand(raw: str, known: dict[str, str]) -> tuple[str, set[str]]:
        used: set[str] = set()

        def lookup(name: str) -> str | None:
            if name in known:
                used.add(name)
                return known[name]
            return None

        return kubelet_expand(raw, lookup), used

    for var in container.get("env") or ():
        if "value" in var:
            value, used = expand(var["value"], dict(env))
            yield f"env {var['name']}", var["value"], value, used
        else:
            value = _value_from(var["valueFrom"])
        env[var["name"]] = value
    for key in ("command", "args"):
        for i, raw in enumerate(container.get(key) or ()):
            yield (f"{key}[{i}]", raw, *expand(raw, env))


def _containers(obj: Any) -> Iterator[dict[str, Any]]:
    """Every container of every pod spec anywhere in ``obj`` (a Job's template, a Pod, a patch)."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in ("containers", "initContainers", "ephemeralContainers") and isinstance(value, list):
                yield from (c for c in value if isinstance(c, dict))
            else:
                yield from _containers(value)
    elif isinstance(obj, list):
        for item in obj:
            yield from _containers(item)


def expansion_problems(objects: list[Any], value: str) -> list[str]:
    """What the kubelet would substitute in the containers of ``objects`` beyond the provider's own
    references, and where ``value`` would not reach a program, an image or a ConfigMap as written."""
    problems, received = [], []
    for obj in objects:
        for container in _containers(obj):
            received.append(str(container.get("image")))
            for where, raw, expanded, used in expanded_strings(container):
                received.append(expanded)
                name = f"container {container.get('name')} {where}: {raw!r} reaches it as {expanded!r}"
                if raw not in PROVIDER_REFERENCES and (used or SECRET in expanded):
                    problems.append(f"{name}, {', '.join(sorted(used))} substituted")
                elif (value in raw or value.replace("$", "$$") in raw) and value not in expanded:
                    problems.append(f"{name}, not holding {value!r}")
        if isinstance(obj, dict) and obj.get("kind") == "ConfigMap":
            received += [str(v) for v in (obj.get("data") or {}).values()]
    if not any(value in r for r in received):
        problems.append(f"{value!r} reaches no container, image or ConfigMap as written")
    return list(dict.fromkeys(problems))  # a Job's pods hold its containers again


def test_the_expansion_is_the_kubelets():
    env = {"HF_TOKEN": SECRET, "VAR_A": "A"}
    cases = {  # from expansion's own tests (expand_test.go), and the escape the provider relies on
        "$(VAR_A)": "A", "___$(VAR_A)___": "___A___", "$(VAR_A)$(VAR_A)": "AA", "$$(VAR_A)": "$(VAR_A)",
        "$$$(VAR_A)": "$A", "$$$$(VAR_A)": "$$(VAR_A)", "$(UNKNOWN)": "$(UNKNOWN)", "$(VAR_A": "$(VAR_A",
        "$VAR_A": "$VAR_A", "$": "$", "$$": "$", "$()": "$()", "[rank${rank}]:": "[rank${rank}]:",
        "a$(HF_TOKEN)b": f"a{SECRET}b",
    }  # fmt: skip
    assert {raw: kubelet_expand(raw, env.get) for raw in cases} == cases
    for raw in (*VARIANTS, "$", "$$", "x$", "$(", "a$$$(b)$"):
        assert kubelet_expand(raw.replace("$", "$$"), env.get) == raw, "doubling every $ yields the literal"


# -- train_llama, launched as a run would launch it ----------------------------------------------------------


@pytest.fixture
def deployed(monkeypatch, tmp_path):
    """train_llama with its pods as a platform deploys them: HF_TOKEN from a Secret, statsd (the provider's
    own $(VAR) references), checkpoints on a PVC mounted at tmp_path, which the storage roots hold."""
    monkeypatch.setenv("AIRFLOW__DTRAIN__STORAGE_ROOTS", str(tmp_path))
    monkeypatch.setenv("AIRFLOW__DTRAIN__KUBERNETES", json.dumps({
        "image": f"{REPOSITORY}:1.0", "allowed_images": [f"{REPOSITORY}:"],
        "volumes": [{"claim": "checkpoints", "mount_path": str(tmp_path)}],
        "secret_env": {"HF_TOKEN": {"secret": "hf", "key": "token"}},
        "statsd_host": "statsd.monitoring", "env": {"AWS_REGION": "eu-west-1"},
    }))  # fmt: skip
    loader = importlib.util.spec_from_file_location(
        "train_llama_no_expansion", REPO / "dags" / "train_llama.py"
    )
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return module.dag


class RunTI(RecordingTI):
    """The task instance of a run: prepare_data passes the trigger's dataset on, the budget chose on-demand,
    validation chose step 20."""

    def __init__(self, params: dict[str, Any], task_id: str, run_id: str) -> None:
        super().__init__(dag_id="train_llama", run_id=run_id, task_id=task_id)
        self.params = params

    def xcom_pull(self, task_ids: str | None = None, key: str | None = None) -> Any:
        return {"prepare_data": self.params["dataset"], "validate": {"step": 20}}.get(
            task_ids, {"offer": {"on_demand_price": 3.5}})  # fmt: skip


def _string_fields(dag) -> list[str]:
    """Every string field of the trigger form: the params whose type includes "string", and those of
    ``kubernetes`` (``kubernetes.image``...)."""
    fields = []
    for name in dag.params:
        schema = dag.params.get_param(name).schema
        types = schema.get("type")
        if "string" in (types if isinstance(types, list) else [types]):
            fields.append(name)
        for member, sub in (schema.get("properties") or {}).items():
            if sub.get("type") == "string":
                fields.append(f"{name}.{member}")
    return fields


def _conf(field: str, value: str) -> dict[str, Any]:
    top, _, member = field.partition(".")
    return {top: {member: value}} if member else {top: value}


def _form_accepts(dag, conf: dict[str, Any]) -> bool:
    params = copy.deepcopy(dag.params)
    try:
        for key, value in conf.items():
            params[key] = value
        params.validate()
    except Exception:  # noqa: BLE001 - Airflow's ParamValidationError: the form refuses it, fine
        return False
    return True


def _launch_train_and_evaluate(dag, fake, params: dict[str, Any], run_id: str) -> None:
    """The run's train_on_demand task up to its deferral (its group launched), then its evaluate task up to
    its evaluation job (launched, then failed by the fake: nothing runs a trainer here)."""
    train = copy.deepcopy(dag.get_task("train_on_demand"))
    ti = RunTI(params, "train_on_demand", run_id)
    train.render_template_fields({"params": params, "run_id": run_id, "ti": ti})
    train.deferrable = True
    with pytest.raises(TaskDeferred):
        train.execute({"ti": ti})

    # what the train group would leave behind: a committed checkpoint of step 20 (its manifest)
    manifest = Path(CheckpointDir(str(train.checkpoint_uri).rstrip("/")).manifest_path(20))
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"step": 20, "job": params["job"]}))

    evaluate = copy.deepcopy(dag.get_task("evaluate"))
    ti = RunTI(params, "evaluate", run_id)
    evaluate.render_template_fields({"params": params, "run_id": run_id, "ti": ti})
    evaluate.poll_interval = 0.05
    running = Background(evaluate.execute, {"ti": ti, "run_id": run_id})
    deadline = time.monotonic() + 30
    while not (jobs := [j for j in fake.jobs() if "evaluate" in j]) and not running.done:
        assert time.monotonic() < deadline, "no evaluation job after 30s"
        time.sleep(0.02)
    if jobs:
        fake.exit(jobs[0], 0, 1)
    error = running.error()
    if not jobs or not isinstance(error, EvaluationFailed):
        raise error


def test_no_trigger_string_is_expanded_by_the_kubelet(deployed, fake, tmp_path, monkeypatch):
    received: list[tuple[str, str, Any]] = []
    handle = fake.handle

    def recording(method, path, query, body, content_type):
        if method in WRITES and body:
            received.append((method, path, json.loads(body)))
        return handle(method, path, query, body, content_type)

    monkeypatch.setattr(fake, "handle", recording)
    fields = _string_fields(deployed)
    assert REACHING_THE_PODS | REFUSED_WHOLE <= set(fields), fields
    base = {**deployed.params.dump(), "backend": "kubernetes", "checkpoint_uri": str(tmp_path / "ckpt"),
            "registry_uri": str(tmp_path / "registry")}  # fmt: skip
    problems, launched, refused = [], [], []
    for field in fields:
        # each variant bare, and all of them within a path and an image reference (what a pattern may ask for)
        for value in (*VARIANTS, f"{tmp_path}/in/{ALL_VARIANTS}", f"{REPOSITORY}:{ALL_VARIANTS}"):
            conf = _conf(field, value)
            if not _form_accepts(deployed, conf):
                continue
            fake.reset()
            received.clear()
            try:
                _launch_train_and_evaluate(
                    deployed, fake, {**base, **conf}, f"manual__{len(refused) + len(launched)}"
                )
            except SpecError as err:  # the train task refused it, naming it: fine before any write
                assert received == [], f"{field}={value!r} refused ({err}) after writing {received}"
                refused.append(f"{field}={value!r}")
                continue
            assert [p for _, p, _ in received if p.endswith("/jobs")] == [
                "/apis/batch/v1/namespaces/default/jobs"
            ] * 2, "the train and the evaluation group"
            launched.append(field)
            found = expansion_problems([b for *_, b in received] + list(fake.objects.values()), value)
            problems += [f"{field}: {p}" for p in found]
    assert problems == [], "\n".join(problems)
    assert REACHING_THE_PODS <= set(launched), f"launched only {launched}; refused {refused}"
    assert not REFUSED_WHOLE & set(launched), f"launched {launched}"
    assert REFUSED_WHOLE <= {r.split("=", 1)[0] for r in refused}, refused


# -- what the provider and the DAG's author may still expand -------------------------------------------------


def test_the_providers_own_references_and_the_authors_env_still_expand():
    spec = JobSpec.from_arguments(
        flavor="debug", num_nodes=2, global_batch_size=2, micro_batch_size=1, backend="kubernetes",
        checkpoint_uri="s3://ml-checkpoints/a$(HF_TOKEN)b", job="j",
        kubernetes={"image": f"{REPOSITORY}:1.0", "statsd_host": "statsd.monitoring", "statsd_port": 9125,
                    "secret_env": {"HF_TOKEN": {"secret": "hf", "key": "token"}},
                    "env": {"NODE_LOG": "/tmp/node-$(DTRAIN_NODE_RANK).log", "PRICE": "$$5"}},
    )  # fmt: skip
    job = render_group("g-r0", spec, namespace="ml")[2]
    container = job["spec"]["template"]["spec"]["containers"][0]
    seen = {where: value for where, _, value, _ in expanded_strings(container)}
    args = [value for where, value in seen.items() if where.startswith("args")]
    # the bundled trainer's statsd flags read the container's env
    assert "metrics.statsd_host=statsd.monitoring" in args and "metrics.statsd_port=9125" in args
    # the author's env is Kubernetes' env: references and $$ as Kubernetes reads them
    field = _value_from(
        {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    )
    assert seen["env NODE_LOG"] == f"/tmp/node-{field}.log" and seen["env PRICE"] == "$5"
    # what came from the spec arrives as written
    assert seen["env DTRAIN_CHECKPOINT_URI"] == "s3://ml-checkpoints/a$(HF_TOKEN)b"
    assert seen["env TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == "[rank${rank}]:"
    assert SECRET not in json.dumps(seen)
