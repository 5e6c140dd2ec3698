"""
### train_llama

Continued pre-training of a Llama-family model with PyTorch FSDP2, as a pod group of
`num_nodes` × `procs_per_node` processes under torchrun.

With its defaults this DAG runs on this machine (the `local` backend: one torchrun
agent per node, gloo on CPU) with the tiny `debug` flavour, so it works with no cloud
and no cluster. `simulate_preemption_at_step` sends the group a SIGTERM once at that
step, as a spot reclaim would: every rank saves a checkpoint of the step it is on,
and the operator relaunches the group from it, losing no steps.

Trigger it from the UI's trigger form or with `airflow dags trigger train_llama`.
The train task returns a summary (XCom `return_value`): final step, tokens seen,
final loss, latest checkpoint, wall time, preemptions and steps lost; the same
summary is written as `summary.json` next to the checkpoints.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param

from airflow_dtrain import FSDPTrainOperator

FLAVORS = ["debug", "llama3_1b", "llama3_3b", "llama3_8b"]

with DAG(
    dag_id="train_llama",
    description="FSDP2 training of a Llama model as a pod group, surviving preemption",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    render_template_as_native_obj=True,
    doc_md=__doc__,
    tags=["llm", "training", "fsdp", "airflow-dtrain"],
    params={
        "backend": Param("local", type="string", enum=["local"], description="Where the pod group runs."),
        "flavor": Param("debug", type="string", enum=FLAVORS, description="Model flavour."),
        "num_nodes": Param(2, type="integer", minimum=1, description="Nodes (torchrun agents) in the group."),
        "procs_per_node": Param(1, type="integer", minimum=1, description="Training processes per node."),
        "steps": Param(60, type="integer", minimum=1, description="Optimizer steps."),
        "global_batch_size": Param(8, type="integer", minimum=1, description="Sequences per step, all ranks."),
        "micro_batch_size": Param(2, type="integer", minimum=1, description="Sequences per rank per pass."),
        "seq_len": Param(128, type="integer", minimum=8, description="Tokens per sequence."),
        "lr": Param(3e-3, type="number", exclusiveMinimum=0, description="Peak learning rate."),
        "checkpoint_uri": Param(
            "",
            type="string",
            description="Where checkpoints go (path or file://). Empty: $AIRFLOW_HOME/dtrain/checkpoints/<run>.",
        ),
        "checkpoint_every": Param(20, type="integer", minimum=0, description="Save every N steps (0: end only)."),
        "simulate_preemption_at_step": Param(
            30, type="integer", minimum=0, description="SIGTERM the group once at this step (0: never)."
        ),
        "max_preemptions": Param(3, type="integer", minimum=0, description="Relaunches after preemption."),
    },
) as dag:
    train = FSDPTrainOperator(
        task_id="train",
        backend="{{ params.backend }}",
        flavor="{{ params.flavor }}",
        num_nodes="{{ params.num_nodes }}",
        procs_per_node="{{ params.procs_per_node }}",
        steps="{{ params.steps }}",
        global_batch_size="{{ params.global_batch_size }}",
        micro_batch_size="{{ params.micro_batch_size }}",
        seq_len="{{ params.seq_len }}",
        lr="{{ params.lr }}",
        checkpoint_uri="{{ params.checkpoint_uri }}",
        checkpoint_every="{{ params.checkpoint_every }}",
        simulate_preemption_at_step="{{ params.simulate_preemption_at_step }}",
        max_preemptions="{{ params.max_preemptions }}",
        log_every=10,
        poll_interval=1.0,
    )
