"""What whoever deploys the bundled DAGs sets for them (``[dtrain]`` options), and what their author allows a
run.

Read at DAG-parse time; a bad value fails the parse, naming the option.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def deployed_kubernetes() -> dict[str, Any]:
    """The bundled DAGs' pod settings: ``[dtrain] kubernetes`` (``AIRFLOW__DTRAIN__KUBERNETES``), a JSON
    ``KubernetesSpec`` set by whoever deploys the DAGs; ``{}`` when unset. A bad value fails the DAG's
    parse, naming the option."""
    import json

    from airflow.sdk import conf

    raw = conf.get("dtrain", "kubernetes", fallback="") or ""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError as err:
        raise ValueError(f"[dtrain] kubernetes: not JSON ({err}), got {raw!r}") from None
    from airflow_dtrain.kubernetes.spec import KubernetesSpec

    KubernetesSpec.from_value(value)  # a bad setting fails here, naming the field
    return value


BUNDLED_LIMITS: dict[str, Any] = {
    "max_nodes": 8,
    "max_procs_per_node": 8,
    "max_steps": 1_000_000,
    "max_sweep_members": 16,
}
"""What the bundled DAGs' author allows a run (train_llama and sweep_llama alike), within the platform admin's
``[dtrain] limits`` (``airflow_dtrain.trust.limits.limits_for``)."""


def form_limits(author: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """The trigger form's maxima from the limits a DAG's runs live within (the admin's narrowed by
    ``author``), so the form shows and refuses what the tasks would refuse again."""
    from airflow_dtrain.trust.limits import limits_for

    return limits_for(author).form_maxima()


def deployed_storage_roots() -> tuple[str, ...] | None:
    """``[dtrain] storage_roots`` (``AIRFLOW__DTRAIN__STORAGE_ROOTS``): comma-separated directories or s3://
    prefixes the bundled DAGs' checkpoint_uri, dataset and init_from must lie under; unset: anywhere."""
    from airflow.sdk import conf

    raw = conf.get("dtrain", "storage_roots", fallback="") or ""
    roots = tuple(r.strip() for r in raw.split(",") if r.strip())
    return roots or None


def deployed_interruption_rate() -> float | None:
    """``[dtrain] interruption_rate_per_hour`` (``AIRFLOW__DTRAIN__INTERRUPTION_RATE_PER_HOUR``): how often a
    spot group is interrupted, per hour, on the market the bundled train_llama runs on, for its budget task
    (``BudgetBranchOperator(interruption_rate_per_hour=...)``); None when unset (the operator's default). Set
    by whoever deploys the DAG, from their own history; a bad value fails the DAG's parse, naming the
    option."""
    from airflow.sdk import conf

    raw = (conf.get("dtrain", "interruption_rate_per_hour", fallback="") or "").strip()
    if not raw:
        return None
    try:
        rate = float(raw)
    except ValueError:
        rate = math.nan
    if not (math.isfinite(rate) and rate >= 0):
        raise ValueError(
            "[dtrain] interruption_rate_per_hour: expected interruptions per hour, a number >= 0, got "
            f"{raw!r}"
        )
    return rate
