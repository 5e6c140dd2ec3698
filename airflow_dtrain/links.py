"""The train task's extra links: its run on the Grafana dashboard, and where its checkpoints are.

Airflow 3 calls ``get_link`` when the task ends (and ``FSDPTrainOperator`` once more when it starts
training) and keeps the URL in XCom, which the UI's link buttons read; an empty URL is no button.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperatorLink, conf

from airflow_dtrain.job.naming import group_base_name
from airflow_dtrain.templating import is_template

if TYPE_CHECKING:
    from datetime import datetime

    from airflow.models.taskinstancekey import TaskInstanceKey

DASHBOARD_UID = "dtrain-training"
"""uid of docker/grafana/dtrain-dashboard.json."""


class TrainingDashboardLink(BaseOperatorLink):
    """The train task's link to the Grafana dashboard (``[dtrain] grafana_url``), showing this run's job
    over the run's time range; no link when no Grafana is configured."""

    name = "Training dashboard"

    def get_link(self, operator, *, ti_key: TaskInstanceKey) -> str:
        base = conf.get("dtrain", "grafana_url", fallback="").strip().rstrip("/")
        if not base:
            return ""  # Airflow offers no link for an empty one
        start, end = _run_time_range(ti_key)
        return dashboard_url(base, dag_id=ti_key.dag_id, run_id=ti_key.run_id, job=_job_of(operator, ti_key),
                             start=start, end=end)  # fmt: skip


class TrainingReportLink(BaseOperatorLink):
    """Where the job's checkpoints, ``summary.json`` and ``report.png`` are: the S3 console for an
    ``s3://`` checkpoint URI, a ``file://`` URL of a directory (shown, if not opened, by the browser)."""

    name = "Checkpoints and report"

    def get_link(self, operator, *, ti_key: TaskInstanceKey) -> str:
        session = getattr(operator, "_session", None)
        uri = session.spec.train.checkpoint.uri if session is not None else operator.checkpoint_uri
        return browsable_url(uri) if uri and not is_template(uri) else ""


def dashboard_url(
    base: str, *, dag_id: str, run_id: str, job: str | None, start: datetime | None, end: datetime | None
) -> str:
    """The dashboard with its ``dag``/``run``/``job`` variables set, from a minute before ``start`` to a
    minute after ``end`` (None: now; no start: Grafana's default range)."""
    from urllib.parse import urlencode

    query = [("orgId", "1"), ("var-dag", dag_id), ("var-run", run_id)]
    if job:
        query.append(("var-job", job))
    if start is not None:
        query.append(("from", str(int(start.timestamp() * 1000) - 60_000)))
        query.append(("to", str(int(end.timestamp() * 1000) + 60_000) if end is not None else "now"))
    return f"{base}/d/{DASHBOARD_UID}/airflow-dtrain?{urlencode(query)}"


def browsable_url(uri: str) -> str:
    """A URL a person can open for a checkpoint URI: S3 console, or file:// ("" for other schemes)."""
    from urllib.parse import quote, urlsplit

    parts = urlsplit(uri)
    if parts.scheme == "s3":
        prefix = parts.path.strip("/")
        return (f"https://s3.console.aws.amazon.com/s3/buckets/{quote(parts.netloc)}"
                f"?prefix={quote(prefix + '/' if prefix else '')}")  # fmt: skip
    if parts.scheme in ("", "file"):
        return "file://" + quote(os.path.abspath(parts.path if parts.scheme else uri))
    return ""


_FINISHED = {"success", "failed", "skipped", "upstream_failed", "removed"}


def _run_time_range(ti: Any) -> tuple[datetime | None, datetime | None]:
    """(the run's start, the task's end) of a running task instance (the Task SDK's); end None while it
    runs or is deferred. A bare TaskInstanceKey has neither."""
    start = None
    try:
        start = ti.get_template_context()["dag_run"].start_date
    except Exception:  # a bare key, a test's stand-in: the task's own start, if any
        pass
    start = start or getattr(ti, "start_date", None)
    state = getattr(ti, "state", None)
    finished = str(getattr(state, "value", state)) in _FINISHED
    return start, getattr(ti, "end_date", None) if finished else None


def _job_of(operator: Any, ti: Any) -> str | None:
    """The job tag of the task's metrics: its job, else its group's base name (None: not rendered yet)."""
    if operator.job:
        return None if is_template(operator.job) else str(operator.job)
    return group_base_name(ti.dag_id, ti.run_id, ti.task_id, getattr(ti, "map_index", -1))
