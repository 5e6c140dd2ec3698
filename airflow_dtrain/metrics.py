"""Orchestration metrics: what the operators, sensors and triggers report to statsd.

One naming scheme for the whole project, ``<prefix>.<area>.<name>`` (prefix ``dtrain``
unless configured), units in the names (bytes, seconds, dollars). The trainer reports the
training side (``trainer/report/metrics.py: TRAINING_METRICS``); this module reports the orchestration
side. Both lists are what the Grafana dashboard in ``docker/grafana/`` is built on, and a test
checks the dashboard uses no other name.

Every line carries DogStatsD tags (``trainer/base/statsd.py``, which says why that form): the task
instance that sent it (``dag_id``, ``run_id``, ``task_id``, ``map_index``) and the ``job``, so two
runs at once, or two members of a sweep, are separate series. A caller that knows them passes
``tags``; otherwise they are read from the running task's context (a worker), and whatever is
unknown there (a triggerer without tags handed to it) is ``none``.

Where metrics go: ``[dtrain] statsd_host`` / ``statsd_port`` / ``statsd_prefix``
(env ``AIRFLOW__DTRAIN__STATSD_HOST`` ...). Empty host: metrics are off.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

from trainer.base.statsd import RUN_TAGS, UNKNOWN, Sender, parse_tags

log = logging.getLogger(__name__)

# name -> (statsd type, description). Names with {decision} expand to each decision.
ORCHESTRATION_METRICS: dict[str, tuple[str, str]] = {
    "spot.price_dollars_per_hour": (
        "gauge",
        "spot dollars per node-hour of the option SpotPriceSensor chose",
    ),
    "spot.on_demand_price_dollars_per_hour": (
        "gauge",
        "on-demand dollars per node-hour of that instance type",
    ),
    "spot.interruption_warning": ("counter", "spot interruption warnings for a group's instances"),
    "spot.rebalance_recommendation": ("counter", "rebalance recommendations for a group's instances"),
    "spot.node_disruption": (
        "counter",
        "other notices that a group's node is going away (Karpenter, ASG, maintenance)",
    ),
    "budget.decision.spot": ("counter", "BudgetBranchOperator chose to train on spot"),
    "budget.decision.on_demand": ("counter", "BudgetBranchOperator chose on-demand"),
    "budget.decision.wait": ("counter", "BudgetBranchOperator chose to wait for a better price"),
    "budget.decision.stop": ("counter", "BudgetBranchOperator stopped: over budget"),
    "budget.remaining_dollars": ("gauge", "budget left when the decision was made"),
    "budget.estimate_dollars": ("gauge", "estimated cost of the remaining work on the chosen capacity"),
    "group.launches": ("counter", "pod groups launched (first launches and relaunches)"),
    "group.preemptions": ("counter", "pod groups that ended preempted"),
    "group.failures": ("counter", "pod groups that failed"),
    "group.recovery_seconds": ("timer", "from a preemption noticed to the relaunched group training again"),
    "group.nodes": ("gauge", "nodes of an elastic group billed from now on, sent at each change of its size"),
    "group.resizes": ("counter", "size changes of a running elastic group (a node lost, or one joining)"),
    "cost.dollars": ("gauge", "the job's dollars so far, from the ledger (the trainer sends it too, live)"),
    "cost.gpu_hours": ("gauge", "the job's GPU-hours so far, from the ledger (the trainer sends it too)"),
    "eval.loss": ("gauge", "held-out loss of the evaluated checkpoint"),
    "eval.perplexity": ("gauge", "held-out perplexity of the evaluated checkpoint"),
    "eval.tokens_per_s": ("gauge", "evaluation throughput"),
    "checkpoint.promotions": ("counter", "checkpoints promoted as the best so far"),
    "checkpoint.validation_failures": ("counter", "checkpoints that failed validation"),
}


@functools.lru_cache(maxsize=1)
def _client() -> tuple[Sender, str] | None:
    from airflow.sdk import conf

    host = conf.get("dtrain", "statsd_host", fallback="")
    if not host:
        return None
    port = conf.getint("dtrain", "statsd_port", fallback=8125)
    return Sender(host, port), conf.get("dtrain", "statsd_prefix", fallback="dtrain")


def task_tags(context: Mapping[str, Any] | None = None, *, job: str | None = None) -> dict[str, str]:
    """The tags of a task instance's metrics: its ids and the job.

    :param context: the task's context (``execute``'s); None: the running task's, if any.
    :param job: the job's name; None: the task's ``job`` argument, else the run's ``params.job``.
    """
    if context is None:
        try:
            from airflow.sdk import get_current_context

            context = get_current_context()
        except Exception:  # not inside a task: a triggerer, a test, a script
            context = {}
    ti = context.get("ti")
    tags = dict.fromkeys(RUN_TAGS, UNKNOWN)
    if ti is not None:  # (a stand-in without some of them: those stay unknown; a metric never fails a task)
        tags.update(
            {key: str(getattr(ti, key)) for key in ("dag_id", "run_id", "task_id") if hasattr(ti, key)}
        )
        tags["map_index"] = str(getattr(ti, "map_index", -1))
    if job is None:
        params = context.get("params") or {}
        job = getattr(context.get("task"), "job", None)
        job = job or (params.get("job") if hasattr(params, "get") else None)
    if job:
        tags["job"] = str(job)
    return tags


def job_tags(spec: Any) -> dict[str, str] | None:
    """The tags a ``JobSpec``'s trainer sends with (``metrics.statsd_tags``, which FSDPTrainOperator
    fills), for the orchestration metrics of the same job; None when it has none."""
    text = spec.train.metrics.statsd_tags
    return {**dict.fromkeys(RUN_TAGS, UNKNOWN), **parse_tags(text)} if text else None


def _send(kind: str, name: str, value: Any, tags: Mapping[str, str] | None) -> None:
    if name not in ORCHESTRATION_METRICS:
        raise KeyError(f"undocumented metric {name!r}: add it to ORCHESTRATION_METRICS")
    try:
        client = _client()
        if client is None:
            return
        sender, prefix = client
        # the same keys on every line: one label set per metric
        labels = {**dict.fromkeys(RUN_TAGS, UNKNOWN), **(task_tags() if tags is None else tags)}
        sender.send(f"{prefix}.{name}" if prefix else name, value, kind, labels)
    except Exception:  # metrics must never fail a task
        log.warning("could not send metric %s", name, exc_info=True)


def gauge(name: str, value: float, *, tags: Mapping[str, str] | None = None) -> None:
    _send("g", name, value, tags)


def incr(name: str, count: int = 1, *, tags: Mapping[str, str] | None = None) -> None:
    _send("c", name, count, tags)


def timing(name: str, seconds: float, *, tags: Mapping[str, str] | None = None) -> None:
    """A statsd timer, in milliseconds as statsd expects (statsd_exporter exposes seconds)."""
    _send("ms", name, seconds * 1000.0, tags)


def reset() -> None:
    """Forget the client (tests change the configuration)."""
    _client.cache_clear()
