"""
### train_llama

Continued pre-training of a Llama-family model with PyTorch FSDP2, as a pod group of
`num_nodes` × `procs_per_node` processes under torchrun, paid for on spot capacity when
the price and the budget allow.

**Flow**: `prepare_data` (PrepareDataOperator: `dataset` tokenised with `init_from`'s tokenizer,
once per input and tokenizer) → `spot_price` (SpotPriceSensor) → `budget` (BudgetBranchOperator) →
`train_spot` | `train_on_demand` | `wait` | `stop` → `validate` (CheckpointValidationOperator)
→ `evaluate` (EvaluateCheckpointOperator: held-out loss, loss-curve report, promotion).
Beside `train_spot`, `spot_watch` (SpotInterruptionSensor) asks the group to checkpoint now on a
spot interruption warning for one of its nodes (on Kubernetes: their termination-handler taints,
and the SQS queue `interruption_queue_url` if given); on the local backend it is skipped.
A promotion updates the asset `train_llama_best_model`, on which `publish_llama` is scheduled.

With its defaults it runs on this machine: the `local` backend (one torchrun agent per node,
gloo on CPU), the tiny `debug` flavour, and a fixed price per node-hour instead of the EC2
spot market. `simulate_preemption_at_step` sends the group a SIGTERM once at that step, as a
spot reclaim would: every rank saves a checkpoint of that step, and the group is relaunched
from it, losing no steps.

On Kubernetes/AWS: `backend=kubernetes`, the `kubernetes` param (image, namespace, volumes...), the
`instance_types` and `availability_zones` to watch, connections `aws_default` and `kubernetes_default`, and an
`s3://` (or shared volume) `checkpoint_uri`. `min_nodes` < `num_nodes`: an elastic group (the nodes it gets).

The train task returns a summary (XCom `return_value`: final step, tokens, loss, latest checkpoint, wall time,
preemptions, steps lost, dollars), also written as `summary.json` beside `report.png` and the checkpoints.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, Asset, TriggerRule, task
from trainer.money.capacity import Capacity
from trainer.config.sections import URI_PATTERN

from airflow_dtrain import (
    BudgetBranchOperator,
    CheckpointValidationOperator,
    EvaluateCheckpointOperator,
    FSDPTrainOperator,
    PrepareDataOperator,
    SpotInterruptionSensor,
    SpotPriceSensor,
)
from airflow_dtrain.job.naming import default_checkpoint_uri
from airflow_dtrain.trust.ownership import job_dir
from airflow_dtrain.params import check_conf, trigger_params
from airflow_dtrain.deployed import (
    BUNDLED_LIMITS,
    deployed_interruption_rate,
    deployed_kubernetes,
    form_limits,
)

_HOME = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
CHECKPOINT_ROOT = default_checkpoint_uri(os.path.join(_HOME, "dtrain"), "train_llama")
REGISTRY = os.path.join(_HOME, "dtrain", "models", "train_llama")
# Where the prepare_data task writes token stores (a directory, or an s3:// prefix the pods can read).
DATA_ROOT = os.environ.get("DTRAIN_PREPARED_DATA_ROOT") or os.path.join(_HOME, "dtrain", "data")
# Name only: a URI with a scheme makes Airflow load every provider's URI handlers (boto3 among
# them) while parsing this file.
BEST_MODEL = Asset(name="train_llama_best_model")
# What this DAG's author allows a run to ask for, within the platform admin's [dtrain] limits: the trigger
# form's
# maxima, enforced again by every task (a trigger can choose within them, never widen them). Where a run's
# checkpoint_uri, registry_uri, dataset and init_from may point: the admin's [dtrain] storage_roots, which
# always
# hold $AIRFLOW_HOME/dtrain (this DAG's own directories; DTRAIN_PREPARED_DATA_ROOT must lie under them too).
LIMITS = BUNDLED_LIMITS

# The pods of the kubernetes backend: whoever deploys this DAG sets them ([dtrain] kubernetes, JSON:
# image, volumes, service account, pod template, allowed_images, allowed_namespaces...). A trigger
# chooses only an image and a namespace within them; the platform admin's policy (the Kubernetes
# connection's dtrain_policy extra) bounds them all.
KUBERNETES = deployed_kubernetes()
# How often a spot group is interrupted on this deployment's market ([dtrain] interruption_rate_per_hour), for
# the budget's spot estimates; unset: BudgetBranchOperator's default. Not on the trigger form: it describes
# the
# market, not the run.
INTERRUPTION_RATE = deployed_interruption_rate()
KUBERNETES_CHOICE = "{{ params.kubernetes if params.backend == 'kubernetes' else None }}"

# One checkpoint directory per job, unless the trigger form names one: every run of a job (the next
# scheduled one after a `wait`, a re-trigger after a budget stop) continues it, with its ledger.
# The default directory carries the run's owner unless it is the DAG's own (a scheduled run): its triggering
# user, or the team [dtrain] owners maps it to (airflow_dtrain.trust.ownership.job_dir), so no trigger takes
# another owner's job, nor the DAG's own, first.
CHECKPOINT_URI = (
    "{{ params.checkpoint_uri or dtrain_job_dir('" + CHECKPOINT_ROOT + "', params.job, dag_run, dag) }}"
)
LOCAL = "params.backend == 'local'"
DATASET_PATTERN = r"^builtin$|" + URI_PATTERN.removeprefix("^$|")

with DAG(
    dag_id="train_llama",
    description="FSDP2 training of a Llama model on spot capacity within a dollar budget",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    render_template_as_native_obj=True,
    user_defined_macros={"dtrain_job_dir": job_dir},
    doc_md=__doc__,
    tags=["llm", "training", "fsdp", "spot", "airflow-dtrain"],
    # The form is generated from the fields' own declarations (types, bounds, titles, help,
    # sections): only this DAG's defaults are given here.
    params=trigger_params(
        [
            "job",
            "flavor",
            "init_from",
            "dataset",
            "text_field",
            "on_bad_row",
            "steps",
            "global_batch_size",
            "micro_batch_size",
            "seq_len",
            "lr",
            "backend",
            "num_nodes",
            "min_nodes",
            "procs_per_node",
            "max_preemptions",
            "checkpoint_uri",
            "checkpoint_every",
            "simulate_preemption_at_step",
            "registry_uri",
            "budget_usd",
            "max_price",
            "max_wait_s",
            "step_time_estimate_s",
            "local_spot_price",
            "local_on_demand_price",
            "instance_types",
            "availability_zones",
            "kubernetes",
            "interruption_queue_url",
        ],
        defaults={
            "job": "train-llama",
            "budget_usd": 5.0,
            "num_nodes": 2,
            "steps": 60,
            "checkpoint_uri": None,
            "checkpoint_every": 20,
            "simulate_preemption_at_step": 30,
        },
        descriptions={
            "dataset": '"builtin" (the generated demo corpus), a token store, or text to prepare: '
            "a .txt, .jsonl "
            "or .parquet file, a directory of such files or a glob (e.g. /data/c4/*.parquet), or a Hugging "
            "Face "
            "datasets directory, local or s3://. Text is tokenised by the "
            "prepare_data task with init_from's tokenizer (byte-level without init_from).",
            "checkpoint_uri": "Where checkpoints go: an absolute path, file://... or s3://bucket/prefix. "
            "Empty: the job's directory, $AIRFLOW_HOME/dtrain/checkpoints/train_llama/<job>.",
            "registry_uri": "Where the best model is recorded and exported (a path or s3://). Empty: "
            + REGISTRY
            + ".",
        },
        schemas={
            "checkpoint_uri": {"pattern": URI_PATTERN},
            "init_from": {"pattern": URI_PATTERN},
            "dataset": {"pattern": DATASET_PATTERN},
            # a job is always named: its checkpoints, ledger and models are found, and owned, by it
            "job": {"pattern": r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$", "minLength": 1},
            "registry_uri": {"pattern": URI_PATTERN},
            **form_limits(LIMITS),
        },
    ),
) as dag:
    prepare_data = PrepareDataOperator(
        task_id="prepare_data",
        dataset="{{ params.dataset or 'builtin' }}",
        tokenizer="{{ params.init_from or '' }}",  # the model's own tokenizer
        text_field="{{ params.text_field or 'text' }}",
        on_bad_row="{{ params.on_bad_row or 'error' }}",
        # a held-out split of at least one sequence, or a refusal naming the counts
        seq_len="{{ params.seq_len }}",
        output_root=DATA_ROOT,
    )

    spot_price = SpotPriceSensor(
        task_id="spot_price",
        instance_types="{{ params.instance_types }}",
        availability_zones="{{ params.availability_zones or None }}",
        max_price="{{ None if " + LOCAL + " else params.max_price }}",
        fixed_price_per_hour="{{ params.local_spot_price if " + LOCAL + " else None }}",
        fixed_on_demand_price="{{ params.local_on_demand_price if " + LOCAL + " else None }}",
        poke_interval=60,
        timeout=1800,
        mode="reschedule",
        soft_fail=True,  # no acceptable offer in time: the budget decides between waiting and on-demand
    )

    budget = BudgetBranchOperator(
        task_id="budget",
        spot_task_id=["train_spot", "spot_watch"],
        on_demand_task_id="train_on_demand",
        wait_task_id="wait",
        stop_task_id="stop",
        price_task_id="spot_price",
        checkpoint_uri=CHECKPOINT_URI,
        job="{{ params.job }}",
        limits=LIMITS,
        total_steps="{{ params.steps }}",
        budget_usd="{{ params.budget_usd }}",
        step_time_estimate_s="{{ params.step_time_estimate_s }}",
        num_nodes="{{ params.num_nodes }}",
        min_nodes="{{ params.min_nodes }}",
        max_spot_price="{{ params.max_price }}",
        max_wait_s="{{ params.max_wait_s }}",
        **({} if INTERRUPTION_RATE is None else {"interruption_rate_per_hour": INTERRUPTION_RATE}),
        trigger_rule=TriggerRule.NONE_FAILED,
    )

    def train(capacity: Capacity, price: str, ceiling: str | None = None) -> FSDPTrainOperator:
        return FSDPTrainOperator(
            task_id=f"train_{capacity.branch_suffix}",
            backend="{{ params.backend }}",
            flavor="{{ params.flavor }}",
            init_from="{{ params.init_from }}",
            dataset="{{ ti.xcom_pull(task_ids='prepare_data') }}",
            num_nodes="{{ params.num_nodes }}",
            min_nodes="{{ params.min_nodes }}",
            procs_per_node="{{ params.procs_per_node }}",
            steps="{{ params.steps }}",
            global_batch_size="{{ params.global_batch_size }}",
            micro_batch_size="{{ params.micro_batch_size }}",
            seq_len="{{ params.seq_len }}",
            lr="{{ params.lr }}",
            checkpoint_uri=CHECKPOINT_URI,
            checkpoint_every="{{ params.checkpoint_every }}",
            simulate_preemption_at_step="{{ params.simulate_preemption_at_step }}",
            max_preemptions="{{ params.max_preemptions }}",
            job="{{ params.job }}",
            capacity=capacity.value,
            price_per_node_hour="{{ (ti.xcom_pull(task_ids='budget', key='decision') or {}).get('offer', "
            "{}).get('" + price + "') or 0.0 }}",
            # the pods land where the price was chosen (spot prices are per zone; on-demand ones are not)
            zone=(
                "{{ (ti.xcom_pull(task_ids='budget', key='decision') or {}).get('offer', "
                "{}).get('availability_zone') if params.backend == 'kubernetes' else None }}"
                if capacity == Capacity.SPOT
                else None
            ),
            instance_type="{{ (ti.xcom_pull(task_ids='budget', key='decision') or {}).get('offer', "
            "{}).get('instance_type') if params.backend == 'kubernetes' else None }}",
            # EC2 never bills spot above on-demand: the cap projects spot time at the on-demand price.
            price_ceiling_per_node_hour=ceiling,
            budget_usd="{{ params.budget_usd }}",
            kubernetes=KUBERNETES or None,
            kubernetes_overrides=KUBERNETES_CHOICE,
            limits=LIMITS,
            log_every=10,
            poll_interval=1.0,
        )

    train_spot = train(
        Capacity.SPOT,
        "spot_price",
        ceiling="{{ None if " + LOCAL + " else (ti.xcom_pull(task_ids='budget', key='decision') or {})"
        ".get('offer', {}).get('on_demand_price') }}",
    )
    train_on_demand = train(Capacity.ON_DEMAND, "on_demand_price")

    spot_watch = SpotInterruptionSensor(
        task_id="spot_watch",
        train_task_id="train_spot",
        backend="{{ params.backend }}",
        # the run's namespace, checked like the train task's against the pods' allowed_namespaces and the
        # admin's
        kubernetes=KUBERNETES or None,
        namespace="{{ params.kubernetes.get('namespace') or '" + (KUBERNETES.get("namespace") or "") + "' }}",
        sqs_queue_url="{{ params.interruption_queue_url or None }}",
        deferrable=True,
        poke_interval=5,
    )

    @task(task_id="wait")
    def wait(ti=None) -> dict:
        """No acceptable spot price now: end this run. The next scheduled run of the same job looks again
        and continues the job from its checkpoints, with its spend ledger (one directory per job)."""
        decision = ti.xcom_pull(task_ids="budget", key="decision") or {}
        print(f"Waiting for a better price: {decision.get('reason')}")
        return decision

    @task(task_id="stop")
    def stop(ti=None) -> dict:
        """Over budget (or nothing left to do): training is skipped."""
        decision = ti.xcom_pull(task_ids="budget", key="decision") or {}
        print(f"Stopped, training skipped: {decision.get('reason')}")
        return decision

    validate = CheckpointValidationOperator(
        task_id="validate",
        checkpoint_uri=CHECKPOINT_URI,
        fallback_to_valid=True,
        trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS,
    )

    evaluate = EvaluateCheckpointOperator(
        task_id="evaluate",
        checkpoint_uri=CHECKPOINT_URI,
        step="{{ ti.xcom_pull(task_ids='validate')['step'] }}",
        registry_uri="{{ params.registry_uri or '" + REGISTRY + "' }}",
        job="{{ params.job }}",
        limits=LIMITS,
        asset=BEST_MODEL,
        backend="{{ params.backend }}",
        kubernetes=KUBERNETES or None,
        kubernetes_overrides=KUBERNETES_CHOICE,
        batches=10,
    )

    (
        check_conf(LIMITS)
        >> prepare_data
        >> spot_price
        >> budget
        >> [train_spot, spot_watch, train_on_demand, wait(), stop()]
    )
    [train_spot, train_on_demand] >> validate >> evaluate


with DAG(
    dag_id="publish_llama",
    description="Publish the model each time train_llama promotes a better checkpoint",
    schedule=[BEST_MODEL],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    doc_md="Runs when `train_llama` promotes a checkpoint (asset `train_llama_best_model`): copies the "
    "export that "
    "the registry's own record of the job's best model on its evaluation set names to `published/latest` "
    "beside "
    "it, and writes a model card.",
    tags=["llm", "airflow-dtrain"],
) as publish_dag:

    @task
    def publish(triggering_asset_events=None) -> dict:
        """Publish what the registry itself holds for the promoted job and evaluation set: its best.json, and
        the export it names inside that entry. The event names only the registry's root (under the storage
        roots), the job and the evaluation set; no path is copied from it."""
        import json
        import re

        import fsspec

        from airflow_dtrain.trust.limits import limits_for
        from airflow_dtrain.trust.ownership import OWNER_FILE
        from trainer.checkpoint.directory import REGISTRY_BEST

        event = triggering_asset_events[BEST_MODEL][-1]
        info = dict(event.extra)
        registry = str(info.get("registry") or REGISTRY).rstrip("/")
        limits_for(LIMITS).check_uri("registry", registry)
        for key in ("job", "evaluation_set"):
            if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,62}", str(info.get(key) or "")):
                raise ValueError(f"the promotion event's {key} is not a name: {info.get(key)!r}")
        # where the job's entry lies below the registry: <job> (the DAG owner's) or owners/<owner>/<job>
        key = str(info.get("entry") or info["job"])
        if not re.fullmatch(r"(owners/[A-Za-z0-9._-]{1,80}/)?" + re.escape(info["job"]), key):
            raise ValueError(f"the promotion event's entry is not the job's: {key!r}")
        entry = f"{registry}/{key}/{info['evaluation_set']}"
        fs, entry_path = fsspec.core.url_to_fs(entry, skip_instance_cache=True)
        owner_path = f"{entry_path.rsplit('/', 1)[0]}/{OWNER_FILE}"
        if not fs.exists(owner_path) or json.loads(fs.cat_file(owner_path)).get("job") != info["job"]:
            raise ValueError(f"{registry}/{key}: not a registry entry of job {info['job']!r}")
        best = json.loads(fs.cat_file(f"{entry_path}/{REGISTRY_BEST}"))
        export = str(best.get("export") or "")
        _, export_path = fsspec.core.url_to_fs(export) if export else (None, "")
        if not export_path.startswith(entry_path + "/") or ".." in export_path.split("/"):
            raise ValueError(f"{entry}/{REGISTRY_BEST}: its export {export!r} is not inside the entry")
        target_path = f"{entry_path}/published/latest"
        if fs.exists(target_path):
            fs.rm(target_path, recursive=True)
        fs.makedirs(target_path, exist_ok=True)
        for path in fs.ls(export_path, detail=False):  # config.json, the tokenizer and the safetensors
            with fs.open(path, "rb") as src, fs.open(f"{target_path}/{path.rsplit('/', 1)[-1]}", "wb") as dst:
                while chunk := src.read(8 << 20):
                    dst.write(chunk)
        with fs.open(f"{target_path}/MODEL_CARD.md", "w") as card:
            card.write(
                f"# train_llama: job {best['job']}\n\nHeld-out loss {best['loss']:.4f} (perplexity "
                f"{best['perplexity']:.2f}) at step {best['step']}, evaluation set "
                f"{best['evaluation_set']}.\n\n"
                f"Checkpoint: `{best['checkpoint']}`\n"
            )
        target = f"{entry}/published/latest"
        print(json.dumps({"published": target, **best}))
        return {"published": target, **best}

    publish()
