"""Orchestration metrics: what the operators, sensors and triggers report to statsd.

One naming scheme for the whole project, ``<prefix>.<area>.<name>`` (prefix ``dtrain``
unless configured). The trainer reports the training side (``trainer/metrics.py: TRAINING_METRICS``);
this module reports the orchestration side. Both lists are what the Grafana dashboard
in ``docker/grafana/`` is built on, and a test checks the dashboard uses no other name.

Where metrics go: ``[dtrain] statsd_host`` / ``statsd_port`` / ``statsd_prefix``
(env ``AIRFLOW__DTRAIN__STATSD_HOST`` ...). Empty host: metrics are off.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

log = logging.getLogger(__name__)

# name -> (statsd type, description). Names with {decision} expand to each decision.
ORCHESTRATION_METRICS: dict[str, tuple[str, str]] = {
    "spot.price_per_hour": ("gauge", "spot $/node-hour of the option SpotPriceSensor chose"),
    "spot.on_demand_price_per_hour": ("gauge", "on-demand $/node-hour of that instance type"),
    "spot.interruption_warning": ("counter", "spot interruption warnings for a group's instances"),
    "spot.rebalance_recommendation": ("counter", "rebalance recommendations for a group's instances"),
    "spot.node_disruption": ("counter", "other notices that a group's node is going away (Karpenter, ASG, maintenance)"),
    "budget.decision.spot": ("counter", "BudgetBranchOperator chose to train on spot"),
    "budget.decision.on_demand": ("counter", "BudgetBranchOperator chose on-demand"),
    "budget.decision.wait": ("counter", "BudgetBranchOperator chose to wait for a better price"),
    "budget.decision.stop": ("counter", "BudgetBranchOperator stopped: over budget"),
    "budget.remaining_usd": ("gauge", "budget left when the decision was made"),
    "budget.estimate_usd": ("gauge", "estimated cost of the remaining work on the chosen capacity"),
    "group.launches": ("counter", "pod groups launched (first launches and relaunches)"),
    "group.preemptions": ("counter", "pod groups that ended preempted"),
    "group.failures": ("counter", "pod groups that failed"),
    "group.recovery_seconds": ("timer", "from a preemption noticed to the relaunched group training again"),
    "cost.dollars_spent": ("gauge", "the job's dollars so far, from the checkpoint manifest's ledger"),
    "cost.gpu_hours": ("gauge", "the job's GPU-hours so far, from the ledger"),
    "eval.loss": ("gauge", "held-out loss of the evaluated checkpoint"),
    "eval.perplexity": ("gauge", "held-out perplexity of the evaluated checkpoint"),
    "eval.tokens_per_s": ("gauge", "evaluation throughput"),
    "checkpoint.promotions": ("counter", "checkpoints promoted as the best so far"),
    "checkpoint.validation_failures": ("counter", "checkpoints that failed validation"),
}


@functools.lru_cache(maxsize=1)
def _client():
    from airflow.sdk import conf

    host = conf.get("dtrain", "statsd_host", fallback="")
    if not host:
        return None
    import statsd

    return statsd.StatsClient(
        host=host,
        port=conf.getint("dtrain", "statsd_port", fallback=8125),
        prefix=conf.get("dtrain", "statsd_prefix", fallback="dtrain") or None,
    )


def _send(kind: str, name: str, value: Any) -> None:
    if name not in ORCHESTRATION_METRICS:
        raise KeyError(f"undocumented metric {name!r}: add it to ORCHESTRATION_METRICS")
    try:
        client = _client()
        if client is None:
            return
        getattr(client, kind)(name, value)
    except Exception:  # metrics must never fail a task
        log.warning("could not send metric %s", name, exc_info=True)


def gauge(name: str, value: float) -> None:
    _send("gauge", name, value)


def incr(name: str, count: int = 1) -> None:
    _send("incr", name, count)


def timing(name: str, seconds: float) -> None:
    """A statsd timer, in milliseconds as statsd expects."""
    _send("timing", name, seconds * 1000.0)


def reset() -> None:
    """Forget the client (tests change the configuration)."""
    _client.cache_clear()
