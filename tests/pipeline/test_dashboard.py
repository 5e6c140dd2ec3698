"""The Grafana dashboard and the statsd_exporter mapping refer only to metrics that exist."""

from __future__ import annotations

import fnmatch
import json
import re

import yaml

from airflow_dtrain.metrics import ORCHESTRATION_METRICS
from tests.conftest import REPO
from trainer.metrics import TRAINING_METRICS

PREFIX = "dtrain"
DASHBOARD = REPO / "docker" / "grafana" / "dtrain-dashboard.json"
MAPPING = REPO / "docker" / "statsd_exporter" / "mapping.yml"


def _statsd_names() -> dict[str, str]:
    """Every documented statsd name -> its type."""
    names = {f"{PREFIX}.{n}": "gauge" for n in TRAINING_METRICS}
    names.update({f"{PREFIX}.{n}": kind for n, (kind, _) in ORCHESTRATION_METRICS.items()})
    return names


def _prometheus_name(statsd_name: str, mappings: list[dict]) -> str:
    """What statsd_exporter turns a statsd name into, following the first matching glob mapping."""
    for mapping in mappings:
        pattern = mapping["match"]
        if fnmatch.fnmatchcase(statsd_name, pattern) and statsd_name.count(".") == pattern.count("."):
            groups = re.fullmatch(re.escape(pattern).replace(r"\*", "([^.]+)"), statsd_name).groups()
            name = mapping["name"]
            for i, group in enumerate(groups, 1):
                name = name.replace(f"${{{i}}}", group).replace(f"${i}", group)
            return name
    return statsd_name.replace(".", "_")  # statsd_exporter's default


def _exposed() -> set[str]:
    mappings = yaml.safe_load(MAPPING.read_text())["mappings"]
    exposed = set()
    for name, kind in _statsd_names().items():
        prom = _prometheus_name(name, mappings)
        exposed |= {f"{prom}_sum", f"{prom}_count", f"{prom}_bucket"} if kind == "timer" else {prom}
    return exposed


def _dashboard_metrics() -> dict[str, set[str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    used: dict[str, set[str]] = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            names = set(re.findall(r"\b(dtrain_[a-z0-9_]+)\b", target["expr"]))
            assert names, f"panel {panel['title']!r} has a query on no dtrain metric: {target['expr']}"
            used.setdefault(panel["title"], set()).update(names)
    return used


def test_dashboard_refers_only_to_metrics_that_exist():
    exposed = _exposed()
    for title, names in _dashboard_metrics().items():
        unknown = names - exposed
        assert not unknown, f"panel {title!r} uses {sorted(unknown)}, which nothing emits"


def test_every_documented_metric_is_on_the_dashboard():
    used = set().union(*_dashboard_metrics().values())
    mappings = yaml.safe_load(MAPPING.read_text())["mappings"]
    for name, kind in _statsd_names().items():
        prom = _prometheus_name(name, mappings)
        candidates = {f"{prom}_sum", f"{prom}_count", f"{prom}_bucket"} if kind == "timer" else {prom}
        assert used & candidates, f"{name} ({prom}) is emitted but on no panel"


def test_the_mapping_gives_decisions_one_labelled_counter():
    mappings = yaml.safe_load(MAPPING.read_text())["mappings"]
    assert _prometheus_name("dtrain.budget.decision.spot", mappings) == "dtrain_budget_decisions"
    assert _prometheus_name("dtrain.train.loss", mappings) == "dtrain_train_loss"


def test_readme_documents_every_metric():
    readme = (REPO / "README.md").read_text()
    missing = [n for n in _statsd_names() if f"`{n}`" not in readme]
    assert not missing, f"README's metrics list lacks {missing}"


def test_an_undocumented_orchestration_metric_is_refused():
    import pytest

    from airflow_dtrain import metrics

    with pytest.raises(KeyError, match="undocumented"):
        metrics.gauge("train.not_a_metric", 1.0)
