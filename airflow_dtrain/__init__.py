"""airflow-dtrain: an Apache Airflow provider for distributed LLM training.

Public names are exported lazily so that provider discovery and DAG parsing stay
fast: importing this package imports neither torch, boto3 nor the kubernetes client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "BudgetBranchOperator": "airflow_dtrain.operators.budget_branch",
    "CheckpointValidationOperator": "airflow_dtrain.operators.checkpoint_validation",
    "EvaluateCheckpointOperator": "airflow_dtrain.operators.evaluate_checkpoint",
    "FSDPTrainOperator": "airflow_dtrain.operators.fsdp_train",
    "PrepareDataOperator": "airflow_dtrain.operators.prepare_data",
    "JobSpec": "airflow_dtrain.job.spec",
    "SpecError": "airflow_dtrain.errors",
    "SpotInterruptionSensor": "airflow_dtrain.sensors.spot_interruption",
    "SpotPriceSensor": "airflow_dtrain.sensors.spot_price",
}

__all__ = ["__version__", *_LAZY]

if TYPE_CHECKING:
    from airflow_dtrain.operators.budget_branch import BudgetBranchOperator
    from airflow_dtrain.operators.checkpoint_validation import CheckpointValidationOperator
    from airflow_dtrain.operators.evaluate_checkpoint import EvaluateCheckpointOperator
    from airflow_dtrain.operators.fsdp_train import FSDPTrainOperator
    from airflow_dtrain.operators.prepare_data import PrepareDataOperator
    from airflow_dtrain.sensors.spot_interruption import SpotInterruptionSensor
    from airflow_dtrain.sensors.spot_price import SpotPriceSensor
    from airflow_dtrain.job.spec import JobSpec
    from airflow_dtrain.errors import SpecError


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'airflow_dtrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
