"""Which launcher a task uses, and with what arguments.

The one place that knows the concrete backends; each is imported only when asked for,
so parsing a DAG imports nothing heavy. ``base`` (the interface) knows none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_dtrain.launchers.state_dir import local_state_dir

if TYPE_CHECKING:
    from airflow_dtrain.launchers.base import PodGroupLauncher


def get_launcher(backend: str, **kwargs: Any) -> PodGroupLauncher:
    """The launcher for ``backend``, built lazily so parsing a DAG imports nothing heavy."""
    if backend == "local":
        from airflow_dtrain.launchers.local import LocalLauncher

        return LocalLauncher(**kwargs)
    if backend == "kubernetes":
        from airflow_dtrain.kubernetes.launcher import KubernetesLauncher

        return KubernetesLauncher(**kwargs)
    raise ValueError(f"backend: unknown backend {backend!r}")


def launcher_kwargs(
    backend: str,
    *,
    kubernetes: Any = None,
    kubernetes_conn_id: str = "kubernetes_default",
    local_state_dir_setting: str | None = None,
) -> dict[str, Any]:
    """get_launcher()'s arguments for ``backend`` from a task's settings: the namespace of its
    ``kubernetes`` dict and its connection, or the local state directory. JSON-serialisable,
    so that a trigger can carry them."""
    if backend == "kubernetes":
        namespace = (
            kubernetes.get("namespace")
            if isinstance(kubernetes, dict)
            else getattr(kubernetes, "namespace", None)
        )
        return {"kubernetes_conn_id": kubernetes_conn_id, "namespace": namespace}
    if backend == "local":
        return {"state_dir": str(local_state_dir(local_state_dir_setting))}
    return {}


def relaunches(launcher: PodGroupLauncher, base: str) -> list[str]:
    """The groups of one task, named ``<base>-r<n>`` (see spec.group_name), oldest first."""
    from airflow_dtrain.job.naming import relaunch_index

    names = [n for n in launcher.find(base) if relaunch_index(base, n) is not None]
    return sorted(names, key=lambda n: relaunch_index(base, n))
