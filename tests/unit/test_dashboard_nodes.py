"""The dashboard shows an elastic group's node count over time and marks each resize, on the metrics the
provider sends (``group.nodes``, ``group.resizes``), filtered to the chosen dag, run and job like every
other query."""

from __future__ import annotations

import json
import re

from airflow_dtrain.metrics import ORCHESTRATION_METRICS
from tests.conftest import REPO

DASHBOARD = REPO / "docker" / "grafana" / "dtrain-dashboard.json"
FILTER = '{dag_id=~"$dag", run_id=~"$run", job=~"$job"}'


def test_the_node_count_and_the_resizes_are_sent_and_on_one_panel():
    assert ORCHESTRATION_METRICS["group.nodes"][0] == "gauge"
    assert ORCHESTRATION_METRICS["group.resizes"][0] == "counter"
    panels = json.loads(DASHBOARD.read_text())["panels"]
    nodes = [p for p in panels if "dtrain_group_nodes" in " ".join(t["expr"] for t in p.get("targets", []))]
    assert [p["title"] for p in nodes] == ["Nodes of the group"]
    exprs = " ".join(t["expr"] for t in nodes[0]["targets"])
    assert f"dtrain_group_nodes{FILTER}" in exprs and f"dtrain_group_resizes{FILTER}" in exprs
    assert nodes[0]["fieldConfig"]["defaults"]["custom"]["lineInterpolation"] == "stepAfter"


def test_each_resize_is_an_annotation_on_the_node_count_filtered_by_the_variables():
    annotations = json.loads(DASHBOARD.read_text())["annotations"]["list"]
    resizes = [a for a in annotations if a["name"] == "Resizes"]
    assert len(resizes) == 1 and resizes[0]["enable"], annotations
    uses = re.findall(r"\b(dtrain_[a-z0-9_]+)(\{[^}]*\})", resizes[0]["expr"])
    assert uses and all(metric == "dtrain_group_nodes" and sel == FILTER for metric, sel in uses), uses
