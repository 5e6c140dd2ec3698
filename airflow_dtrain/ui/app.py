"""The Training jobs app, mounted on Airflow's api-server at ``/dtrain`` (``plugin.py``): read-only pages and
their JSON, behind Airflow's own authentication and its auth manager's DAG permissions.

Every request is of a user Airflow knows (its token cookie or bearer header, ``get_user``); a job is shown
only to users who may read its DAG, and a request for another is refused with 403 before any of its files is
read. A job is named in a URL by its DAG and its index entry (``jobs_index.ENTRY``): its paths come from the
entry, never from the request. Nothing here writes, and nothing reaches the job's processes or pods.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from airflow_dtrain import jobs_index
from airflow_dtrain.ui.read import RowCache, job_detail

STATIC = Path(__file__).parent / "static"
Sort = Literal[
    "dag_id",
    "owner",
    "job",
    "state",
    "step",
    "spent_usd",
    "preemptions",
    "steps_lost",
    "resizes",
    "checkpoint_at",
    "updated_at",
]
"""What the jobs page sorts by: a column of its rows."""
MAX_PER_PAGE = 200


def _user() -> Any:
    from airflow.api_fastapi.core_api.security import get_user

    return Depends(get_user)


def readable_dags(user: Any) -> set[str]:
    """The DAGs ``user`` may read, as Airflow's auth manager says (teams included)."""
    from airflow.api_fastapi.app import get_auth_manager

    return set(get_auth_manager().get_authorized_dag_ids(user=user, method="GET"))


def _allowed(user: Any, dag_id: str) -> None:
    if not jobs_index.DAG_ID.fullmatch(dag_id) or dag_id not in readable_dags(user):
        raise HTTPException(status_code=403, detail=f"you may not read DAG {dag_id!r}")


def _sort_key(name: str):
    def key(row: dict[str, Any]) -> tuple:
        value = row.get(name)
        return (value is None, value if value is not None else 0)

    return key


def jobs_page_of(
    rows: list[dict[str, Any]],
    *,
    owner: str | None,
    dag_id: str | None,
    state: str | None,
    sort: str,
    desc: bool,
    page: int,
    per_page: int,
) -> dict[str, Any]:
    """One page of ``rows``: filtered by owner, DAG and state, sorted (None last), with every owner and DAG
    there is to filter by."""
    owners, dag_ids = sorted({r["owner"] for r in rows}), sorted({r["dag_id"] for r in rows})
    rows = [
        r
        for r in rows
        if (owner is None or r["owner"] == owner)
        and (dag_id is None or r["dag_id"] == dag_id)
        and (state is None or r["state"] == state)
    ]
    rows.sort(key=_sort_key(sort), reverse=desc)
    start = (page - 1) * per_page
    return {
        "total": len(rows),
        "page": page,
        "per_page": per_page,
        "rows": rows[start : start + per_page],
        "owners": owners,
        "dags": dag_ids,
        "states": list(jobs_index.STATES),
    }


def create_app(cache: RowCache | None = None) -> FastAPI:
    """The app (built on the api-server's first request of it: ``plugin.LazyApp``); ``cache``: where the
    jobs page keeps its rows (default a new ``RowCache``)."""
    app = FastAPI(title="Training jobs (airflow-dtrain)", docs_url=None, redoc_url=None, openapi_url=None)
    cache = cache if cache is not None else RowCache()
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/jobs", include_in_schema=False)
    def jobs_page(user: Any = _user()) -> FileResponse:
        return FileResponse(STATIC / "jobs.html")

    @app.get("/jobs/{dag_id}/{entry}", include_in_schema=False)
    def job_page(dag_id: str, entry: str, user: Any = _user()) -> FileResponse:
        _allowed(user, dag_id)
        return FileResponse(STATIC / "job.html")

    @app.get("/ti/{dag_id}/{run_id}/{task_id}", include_in_schema=False)
    def task_instance(dag_id: str, run_id: str, task_id: str, user: Any = _user()) -> Any:
        _allowed(user, dag_id)
        entry = jobs_index.find_task(dag_id, run_id, task_id)
        if entry is None:
            return FileResponse(STATIC / "no_job.html")
        return RedirectResponse(f"../../../jobs/{dag_id}/{entry}", status_code=307)

    @app.get("/api/jobs")
    def jobs(
        user: Any = _user(),
        owner: str | None = None,
        dag_id: str | None = None,
        state: str | None = None,
        sort: Sort = "updated_at",
        desc: bool = True,
        page: int = Query(1, ge=1),
        per_page: int = Query(50, ge=1, le=MAX_PER_PAGE),
    ) -> dict[str, Any]:
        """One page of the jobs of the DAGs the user may read, filtered and sorted."""
        dags = sorted(readable_dags(user) & set(jobs_index.list_dags()))
        rows = [r.to_dict() for r in cache.rows(dags)]
        return jobs_page_of(
            rows, owner=owner, dag_id=dag_id, state=state, sort=sort, desc=desc, page=page, per_page=per_page
        )

    @app.get("/api/jobs/{dag_id}/{entry}")
    def job(dag_id: str, entry: str, user: Any = _user()) -> dict[str, Any]:
        """One job: everything its page shows."""
        _allowed(user, dag_id)  # before anything of the job is read
        found = jobs_index.read_entry(dag_id, entry)
        if found is None:
            raise HTTPException(
                status_code=404, detail=f"no job {entry!r} of DAG {dag_id!r} in the job index"
            )
        return job_detail(found)

    return app
