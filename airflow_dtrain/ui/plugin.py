"""The airflow-dtrain plugin: the Training jobs app on the api-server (``/dtrain``), a "Training jobs" entry
in the UI's navigation, and a "Training job" tab on every task instance (the job the task ran; a task that
ran none says so). Registered by the ``airflow.plugins`` entry point, so ``pip install`` is all it takes.

Cheap to load (every Airflow component loads plugins): the app, FastAPI and the readers are imported on the
api-server's first request of ``/dtrain``.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/dtrain"


class LazyApp:
    """An ASGI app that builds ``airflow_dtrain.ui.app.create_app()`` when it is first called."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self._app is None:
            from airflow_dtrain.ui.app import create_app

            self._app = create_app()
        await self._app(scope, receive, send)


class DtrainPlugin(AirflowPlugin):
    """Training jobs in Airflow's own UI."""

    name = "airflow_dtrain"
    fastapi_apps = [{"app": LazyApp(), "url_prefix": URL_PREFIX, "name": "Training jobs"}]
    external_views = [
        {
            "name": "Training jobs",
            "href": "dtrain/jobs",
            "destination": "nav",
            "category": "browse",
            "url_route": "training-jobs",
        },
        {
            "name": "Training job",
            "href": "dtrain/ti/{DAG_ID}/{RUN_ID}/{TASK_ID}",
            "destination": "task_instance",
            "url_route": "training-job",
        },
    ]
