"""The train task's links: the shipped dashboard filtered to the run, its job and time range (none
without a configured Grafana), and where its checkpoints and report are."""

from __future__ import annotations

import json
import types
from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qs, urlsplit

import pytest

from airflow_dtrain import FSDPTrainOperator
from airflow_dtrain.get_provider_info import get_provider_info
from airflow_dtrain.links import DASHBOARD_UID, TrainingDashboardLink, TrainingReportLink, browsable_url
from airflow_dtrain.job.naming import group_base_name
from tests.conftest import REPO

RUN_ID = "manual__2026-05-01T09:30:00+00:00"
RUN_START = datetime(2026, 5, 1, 9, 30, 5, tzinfo=timezone.utc)
TASK_END = RUN_START + timedelta(hours=2, minutes=17)


def _ti(state: str, end: datetime | None = None, map_index: int = -1):
    """What Airflow hands get_link when the task ends: the Task SDK's task instance, the parts we read."""
    dag_run = types.SimpleNamespace(start_date=RUN_START)
    return types.SimpleNamespace(
        dag_id="train_llama", run_id=RUN_ID, task_id="train", map_index=map_index, state=state,
        start_date=RUN_START + timedelta(minutes=3), end_date=end,
        get_template_context=lambda: {"dag_run": dag_run},
    )  # fmt: skip


def _link(cls, op, ti) -> str:
    (link,) = [link for link in op.operator_extra_links if isinstance(link, cls)]
    return link.get_link(op, ti_key=ti)


def _ms(t: datetime) -> str:
    return str(int(t.timestamp() * 1000))


def test_the_dashboard_link_opens_the_shipped_dashboard_on_this_run_its_job_and_time_range(
    monkeypatch, tmp_path
):
    monkeypatch.setenv("AIRFLOW__DTRAIN__GRAFANA_URL", "https://grafana.example.com/")
    op = FSDPTrainOperator(task_id="train", job="demo", local_state_dir=str(tmp_path))
    url = _link(TrainingDashboardLink, op, _ti("success", TASK_END))

    dashboard = json.loads((REPO / "docker" / "grafana" / "dtrain-dashboard.json").read_text())
    assert DASHBOARD_UID == dashboard["uid"]
    parts = urlsplit(url)
    assert (
        f"{parts.scheme}://{parts.netloc}{parts.path}"
        == f"https://grafana.example.com/d/{dashboard['uid']}/airflow-dtrain"
    )
    query = {k: v for k, [v] in parse_qs(parts.query).items()}
    # the dashboard's own variables, set to this run (its ':' and '+' survive the URL)
    assert {v["name"] for v in dashboard["templating"]["list"]} >= {"dag", "run", "job"}
    assert (query["var-dag"], query["var-run"], query["var-job"]) == ("train_llama", RUN_ID, "demo")
    # from a minute before the run started to a minute after the task ended, in Grafana's epoch ms
    assert (query["from"], query["to"]) == (
        _ms(RUN_START - timedelta(minutes=1)),
        _ms(TASK_END + timedelta(minutes=1)),
    )


def test_while_the_task_runs_or_is_deferred_the_range_ends_now(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW__DTRAIN__GRAFANA_URL", "https://grafana.example.com")
    op = FSDPTrainOperator(task_id="train", local_state_dir=str(tmp_path))
    for state in ("running", "deferred"):
        query = parse_qs(urlsplit(_link(TrainingDashboardLink, op, _ti(state, map_index=2))).query)
        assert query["from"] == [_ms(RUN_START - timedelta(minutes=1))] and query["to"] == ["now"]
        # no job: the job tag is the task instance's group name, as the trainer's metrics carry it
        assert query["var-job"] == [group_base_name("train_llama", RUN_ID, "train", 2)]


def test_no_dashboard_link_without_a_configured_grafana(monkeypatch, tmp_path):
    monkeypatch.delenv("AIRFLOW__DTRAIN__GRAFANA_URL", raising=False)
    op = FSDPTrainOperator(task_id="train", local_state_dir=str(tmp_path))
    assert (
        _link(TrainingDashboardLink, op, _ti("success", TASK_END)) == ""
    )  # the API shows an empty link as none
    defaults = get_provider_info()["config"]["dtrain"]["options"]["grafana_url"]
    assert defaults["default"] == ""  # the provider's own default configures none either


def test_the_report_link_opens_the_checkpoint_directory(tmp_path):
    op = FSDPTrainOperator(
        task_id="train", checkpoint_uri=str(tmp_path / "ckpt"), local_state_dir=str(tmp_path)
    )
    assert _link(TrainingReportLink, op, _ti("success", TASK_END)) == f"file://{tmp_path}/ckpt"
    assert (
        browsable_url("s3://ml-ckpt/jobs/demo")
        == "https://s3.console.aws.amazon.com/s3/buckets/ml-ckpt?prefix=jobs/demo/"
    )
    assert browsable_url("gs://elsewhere/x") == ""  # nothing to open: no link


def test_the_provider_registers_both_links():
    links = get_provider_info()["extra-links"]
    assert "airflow_dtrain.links.TrainingDashboardLink" in links
    assert "airflow_dtrain.links.TrainingReportLink" in links


@pytest.mark.torchrun
def test_a_real_run_stores_the_link_that_the_api_serves(airflow_home, monkeypatch, tmp_path):
    """dag.test() runs the task through the Task SDK: its end writes each link to XCom, which is what
    the API server's extra-links endpoint reads."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.sdk import DAG

    from tests.integration.helpers import SMALL

    monkeypatch.setenv("AIRFLOW__DTRAIN__GRAFANA_URL", "https://grafana.example.com")
    with DAG(dag_id="links_demo", schedule=None, start_date=RUN_START) as dag:
        FSDPTrainOperator(task_id="train", **{**SMALL, "steps": 2}, job="links-demo",
                          checkpoint_uri=str(tmp_path / "ckpt"), local_state_dir=str(tmp_path / "groups"),
                          poll_interval=0.5)  # fmt: skip
    bag = DagBag(dag_folder=str(tmp_path / "no-dags"))
    bag.bag_dag(dag)
    DagBundlesManager().sync_bundles_to_db()
    sync_bag_to_db(bag, "dags-folder", None)  # dag.test() runs serialised DAGs only
    run = dag.test()
    ti = run.get_task_instance("train")
    assert ti.state == "success", ti.state
    url = ti.xcom_pull(task_ids="train", key=TrainingDashboardLink().xcom_key)
    query = {k: v for k, [v] in parse_qs(urlsplit(url).query).items()}
    assert (query["var-dag"], query["var-run"], query["var-job"]) == ("links_demo", run.run_id, "links-demo")
    assert int(query["from"]) == int(run.start_date.timestamp() * 1000) - 60_000
    assert int(query["from"]) < int(query["to"]) and int(query["to"]) >= int(ti.end_date.timestamp() * 1000)
    report = ti.xcom_pull(task_ids="train", key=TrainingReportLink().xcom_key)
    assert report == f"file://{tmp_path}/ckpt"
