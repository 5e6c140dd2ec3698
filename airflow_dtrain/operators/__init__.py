"""Operators of airflow-dtrain."""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "BudgetBranchOperator": "airflow_dtrain.operators.budget_branch",
    "CheckpointValidationOperator": "airflow_dtrain.operators.checkpoint_validation",
    "EvaluateCheckpointOperator": "airflow_dtrain.operators.evaluate_checkpoint",
    "FSDPTrainOperator": "airflow_dtrain.operators.fsdp_train",
    "PrepareDataOperator": "airflow_dtrain.operators.prepare_data",
}
__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'airflow_dtrain.operators' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
