"""The train task links to the Grafana dashboard the project ships."""

from __future__ import annotations

import json

from airflow_dtrain import FSDPTrainOperator
from airflow_dtrain.get_provider_info import get_provider_info
from airflow_dtrain.operators.fsdp_train import DASHBOARD_UID, TrainingDashboardLink
from tests.conftest import REPO


def test_train_task_links_to_the_shipped_dashboard(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW__DTRAIN__GRAFANA_URL", "https://grafana.example.com/")
    op = FSDPTrainOperator(task_id="train", local_state_dir=str(tmp_path))
    (link,) = [l for l in op.operator_extra_links if isinstance(l, TrainingDashboardLink)]
    url = link.get_link(op, ti_key=None)
    dashboard = json.loads((REPO / "docker" / "grafana" / "dtrain-dashboard.json").read_text())
    assert url.startswith(f"https://grafana.example.com/d/{dashboard['uid']}/")
    assert DASHBOARD_UID == dashboard["uid"]
    assert "airflow_dtrain.operators.fsdp_train.TrainingDashboardLink" in get_provider_info()["extra-links"]
