"""
### sweep_llama

A learning-rate sweep of the `debug` (or any) flavour: one FSDPTrainOperator per config
through dynamic task mapping, behind one budget check that covers the whole sweep
(steps × configs), then the config with the lowest final loss.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, TriggerRule, task

from airflow_dtrain import BudgetBranchOperator, FSDPTrainOperator
from airflow_dtrain.job.naming import default_checkpoint_uri
from airflow_dtrain.params import check_conf, trigger_params
from airflow_dtrain.deployed import BUNDLED_LIMITS, form_limits
from airflow_dtrain.trust.ownership import job_dir, run_key
from airflow_dtrain.trust.limits import limits_for

_HOME = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
SWEEP_ROOT = default_checkpoint_uri(os.path.join(_HOME, "dtrain"), "sweep_llama")
# This run's directory: one subdirectory per member, and the sweep's one spend ledger (spend/). run_key maps
# run
# ids to directory names one-to-one (two run ids never share one).
# The default root carries the run's owner unless it is the DAG's own
# (airflow_dtrain.trust.ownership.job_dir).
SWEEP_DIR = (
    "{{ (params.sweep_root ~ '/' ~ run_key(run_id)) if params.sweep_root else dtrain_job_dir('"
    + SWEEP_ROOT
    + "', run_key(run_id), dag_run, dag) }}"
)
# The train_llama limits (nodes, processes, steps, tokens, prices, roots, runtime), and at most this many
# members.
LIMITS = BUNDLED_LIMITS

with DAG(
    dag_id="sweep_llama",
    description="A learning-rate sweep with one budget check for the whole sweep",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    render_template_as_native_obj=True,
    user_defined_macros={"run_key": run_key, "dtrain_job_dir": job_dir},
    doc_md=__doc__,
    tags=["llm", "training", "sweep", "airflow-dtrain"],
    params=trigger_params(
        [
            "flavor",
            "learning_rates",
            "steps",
            "global_batch_size",
            "micro_batch_size",
            "seq_len",
            "num_nodes",
            "procs_per_node",
            "sweep_root",
            "budget_usd",
            "price_per_hour",
            "step_time_estimate_s",
        ],
        defaults={"steps": 20, "global_batch_size": 4, "seq_len": 64, "budget_usd": 5.0},
        descriptions={"budget_usd": "Dollar budget of the whole sweep (every member's steps)."},
        schemas={
            "sweep_root": {"pattern": r"^$|^/|^file://.+|^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?$"},
            **form_limits(LIMITS),
        },
    ),
) as dag:

    @task(templates_dict={"root": SWEEP_DIR})
    def configs(params=None, templates_dict=None) -> list[dict]:
        """One member per learning rate, each in its own directory, all on the sweep's spend ledger."""
        rates = params["learning_rates"]
        limits_for(LIMITS).check_sweep(
            len(rates)
        )  # the form says so too; a conf that bypasses it is refused here
        repeated = sorted({f"{lr:g}" for lr in rates if sum(f"{x:g}" == f"{lr:g}" for x in rates) > 1})
        if repeated:  # two members would write one directory
            raise ValueError(
                f"learning_rates: each rate once, got {rates!r} (repeated: {', '.join(repeated)})"
            )
        root = templates_dict["root"]
        return [
            {
                "lr": lr,
                "checkpoint_uri": os.path.join(root, f"lr-{lr:g}"),
                "config": {"cost": {"ledger_uri": root}},
            }
            for lr in rates
        ]

    sweep = configs()
    check_conf(LIMITS) >> sweep

    budget = BudgetBranchOperator(
        task_id="budget",
        spot_task_id="train",
        on_demand_task_id="train",
        stop_task_id="over_budget",
        checkpoint_uri=SWEEP_DIR,  # its spend/ is every member's: the sweep's one ledger
        limits=LIMITS,
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
        # the cap holds for the sweep as a whole: every member counts every member's spend
        budget_usd="{{ params.budget_usd }}",
        price_per_node_hour="{{ params.price_per_hour }}",
        limits=LIMITS,
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
        print(
            f"Best: lr={winner['lr']} final loss {winner['final_loss']:.4f} ({winner['latest_checkpoint']})"
        )
        return {"best": winner, "runs": runs}

    sweep >> budget >> [train, over_budget()]
    best(train.output, sweep)
