"""The Grafana dashboard and the statsd_exporter mapping: only metrics that exist, every query filtered to
the chosen dag, run and job, units that match the names, and stale series that expire."""

from __future__ import annotations

import fnmatch
import json
import re

import yaml

from airflow_dtrain.metrics import ORCHESTRATION_METRICS
from tests.conftest import REPO
from trainer.report.metrics import TRAINING_METRICS

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


VARIABLES = {
    "dag": "dag_id",
    "run": "run_id",
    "job": "job",
}  # dashboard variable -> the statsd tag it filters


def _panels() -> list[dict]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def test_the_dashboard_has_dag_run_and_job_variables_over_the_tags():
    variables = {v["name"]: v for v in json.loads(DASHBOARD.read_text())["templating"]["list"]}
    for name, label in VARIABLES.items():
        assert variables[name]["type"] == "query" and variables[name]["includeAll"], variables[name]
        assert re.search(rf",\s*{label}\)$", variables[name]["query"]), variables[name]["query"]


def test_every_panel_query_is_filtered_by_the_dag_run_and_job_variables():
    for panel in _panels():
        assert panel.get("targets"), f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            uses = re.findall(r"\b(dtrain_[a-z0-9_]+)(\{[^}]*\})?", target["expr"])
            assert uses, target["expr"]
            for metric, selector in uses:
                for variable, label in VARIABLES.items():
                    assert f'{label}=~"${variable}"' in selector, (
                        f"panel {panel['title']!r}: {metric} is not filtered by ${variable} "
                        f"in {target['expr']}"
                    )


# What a metric's name says its unit is -> the Grafana unit of a panel that shows it.
UNITS = [
    ("_bytes", "bytes"),
    ("_seconds", "s"),
    ("dollars", "currencyUSD"),
    ("_pct", "percent"),
    ("_w", "watt"),
    ("_c", "celsius"),
    ("_hours", "h"),
    ("_mfu", "percentunit"),
]


def test_units_are_in_the_names_and_panels_show_them_in_those_units():
    for name in _statsd_names():  # bytes, seconds, dollars: no MiB, milliseconds or "usd"
        assert not re.search(r"_(mb|mib|kb|ms|usd|spent)(\.|$|_)", name), name
    for panel in _panels():
        unit = panel["fieldConfig"]["defaults"]["unit"]
        for target in panel["targets"]:
            for metric in re.findall(r"\b(dtrain_[a-z0-9_]+?)(?:_sum|_count|_bucket)?\b", target["expr"]):
                expected = next(
                    (
                        u
                        for suffix, u in UNITS
                        if suffix in metric and (suffix == "dollars" or metric.endswith(suffix))
                    ),
                    None,
                )
                if expected is not None:
                    assert unit == expected, (
                        f"panel {panel['title']!r} shows {metric} as {unit!r}, not {expected!r}"
                    )


def test_the_jobs_spend_has_one_name_on_both_sides_and_a_panel_against_its_budget():
    assert "cost.dollars" in TRAINING_METRICS and "cost.dollars" in ORCHESTRATION_METRICS
    assert [n for n in _statsd_names() if "spent" in n or n.endswith("_usd")] == []
    spend_vs_budget = [
        p
        for p in _panels()
        if {"dtrain_cost_dollars", "dtrain_cost_budget_dollars"}
        <= set(re.findall(r"dtrain_[a-z0-9_]+", " ".join(t["expr"] for t in p["targets"])))
    ]
    assert [p["type"] for p in spend_vs_budget] == ["stat", "timeseries"], [
        p["title"] for p in spend_vs_budget
    ]


def test_the_exporter_mapping_expires_series_of_runs_that_stopped():
    ttl = str(yaml.safe_load(MAPPING.read_text())["defaults"]["ttl"])
    seconds = sum(int(n) * {"s": 1, "m": 60, "h": 3600}[u] for n, u in re.findall(r"(\d+)([smh])", ttl))
    assert re.fullmatch(r"(\d+[smh])+", ttl) and 5 * 60 <= seconds <= 24 * 3600, ttl


def test_the_mapping_gives_decisions_one_labelled_counter():
    mappings = yaml.safe_load(MAPPING.read_text())["mappings"]
    assert _prometheus_name("dtrain.budget.decision.spot", mappings) == "dtrain_budget_decisions"
    assert _prometheus_name("dtrain.train.loss", mappings) == "dtrain_train_loss"


def test_the_metrics_page_documents_every_metric():
    page = (REPO / "docs" / "metrics.md").read_text()
    missing = [n for n in _statsd_names() if f"`{n}`" not in page]
    assert not missing, f"docs/metrics.md's metrics list lacks {missing}"


def test_an_undocumented_orchestration_metric_is_refused():
    import pytest

    from airflow_dtrain import metrics

    with pytest.raises(KeyError, match="undocumented"):
        metrics.gauge("train.not_a_metric", 1.0)
