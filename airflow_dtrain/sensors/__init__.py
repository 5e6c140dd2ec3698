"""Sensors of airflow-dtrain."""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "SpotInterruptionSensor": "airflow_dtrain.sensors.spot_interruption",
    "SpotPriceSensor": "airflow_dtrain.sensors.spot_price",
}
__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'airflow_dtrain.sensors' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
