"""
### sweep_llama

A learning-rate sweep of the `debug` (or any) flavour: one FSDPTrainOperator per config
through dynamic task mapping, behind one budget check that covers the whole sweep
(steps × configs), then the config with the lowest final loss.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, Param, TriggerRule, task

from airflow_dtrain import BudgetBranchOperator, FSDPTrainOperator

_HOME = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
SWEEP_ROOT = os.path.join(_HOME, "dtrain", "checkpoints", "sweep_llama")

with DAG(
    dag_id="sweep_llama",
    description="A learning-rate sweep with one budget check for the whole sweep",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    render_template_as_native_obj=True,
    doc_md=__doc__,
    tags=["llm", "training", "sweep", "airflow-dtrain"],
    params={
        "flavor": Param("debug", type="string", enum=["debug", "llama3_1b", "llama3_3b", "llama3_8b"]),
        "learning_rates": Param([1e-3, 3e-3], type="array", items={"type": "number", "exclusiveMinimum": 0},
                                minItems=1, description="One training per learning rate."),  # fmt: skip
        "steps": Param(20, type="integer", minimum=1),
        "num_nodes": Param(1, type="integer", minimum=1),
        "procs_per_node": Param(1, type="integer", minimum=1),
        "global_batch_size": Param(4, type="integer", minimum=1),
        "micro_batch_size": Param(2, type="integer", minimum=1),
        "seq_len": Param(64, type="integer", minimum=8),
        "budget_usd": Param(5.0, type="number", minimum=0, description="Budget of the whole sweep."),
        "price_per_hour": Param(0.5, type="number", minimum=0, description="$/node-hour (local backend)."),
        "step_time_estimate_s": Param(0.5, type="number", exclusiveMinimum=0),
        "sweep_root": Param("", type="string", description="Where the sweep's checkpoints go (empty: under $AIRFLOW_HOME)."),
    },
) as dag:

    @task
    def configs(params=None, run_id=None) -> list[dict]:
        root = os.path.join(params["sweep_root"] or SWEEP_ROOT, run_id.replace(":", "-").replace("+", "-"))
        return [{"lr": lr, "checkpoint_uri": os.path.join(root, f"lr-{lr:g}")} for lr in params["learning_rates"]]

    sweep = configs()

    budget = BudgetBranchOperator(
        task_id="budget",
        spot_task_id="train",
        on_demand_task_id="train",
        stop_task_id="over_budget",
        # the whole sweep: every config's steps, on the same nodes
        total_steps="{{ params.steps * (params.learning_rates | length) }}",
        num_nodes="{{ params.num_nodes }}",
        budget_usd="{{ params.budget_usd }}",
        step_time_estimate_s="{{ params.step_time_estimate_s }}",
        spot_price="{{ params.price_per_hour }}",
        on_demand_price="{{ params.price_per_hour }}",
    )

    train = FSDPTrainOperator.partial(
        task_id="train",
        flavor="{{ params.flavor }}",
        steps="{{ params.steps }}",
        num_nodes="{{ params.num_nodes }}",
        procs_per_node="{{ params.procs_per_node }}",
        global_batch_size="{{ params.global_batch_size }}",
        micro_batch_size="{{ params.micro_batch_size }}",
        seq_len="{{ params.seq_len }}",
        log_every=5,
        poll_interval=1.0,
    ).expand_kwargs(sweep)

    @task(task_id="over_budget")
    def over_budget(ti=None) -> None:
        print("Sweep not started:", (ti.xcom_pull(task_ids="budget", key="decision") or {}).get("reason"))

    @task(trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS)
    def best(summaries, configs) -> dict:
        runs = [{**c, **s} for c, s in zip(configs, summaries)]
        winner = min(runs, key=lambda r: r["final_loss"])
        print(f"Best: lr={winner['lr']} final loss {winner['final_loss']:.4f} ({winner['latest_checkpoint']})")
        return {"best": winner, "runs": runs}

    sweep >> budget >> [train, over_budget()]
    best(train.output, sweep)
