"""The Kubernetes API of the launcher: the provider's ``KubernetesHook``, its retries, and a group's reads.

Every API call goes through the cncf.kubernetes provider's ``KubernetesHook`` (its connection, its client
configuration) and its retry policy (``generic_api_retry``: 429 and 5xx answers and dropped connections are
retried with backoff, honouring Retry-After). The hook is built on first use. Importing this module imports
the kubernetes client: only the launcher's modules do.
"""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any

from airflow.providers.cncf.kubernetes.kubernetes_helper_functions import generic_api_retry
from kubernetes.client.exceptions import ApiException

from airflow_dtrain.kubernetes.status import pod_index

_MERGE_PATCH = "application/merge-patch+json"


class Conflict(Exception):
    """The API server answered 409: the object exists. Not an ApiException, so never retried."""


class KubernetesApi:
    """The hook, the namespace and the calls every part of the launcher makes; mixed into its classes.

    Expects ``kubernetes_conn_id`` and ``_namespace`` (set by ``KubernetesLauncher.__init__``).
    """

    kubernetes_conn_id: str
    _namespace: str | None

    @cached_property
    def hook(self):
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        return KubernetesHook(conn_id=self.kubernetes_conn_id)

    @cached_property
    def namespace(self) -> str:
        return self._namespace or self.hook.get_namespace() or "default"

    @generic_api_retry
    def _api(self, method, *args: Any, missing_ok: bool = False, text: bool = False, **kwargs: Any) -> Any:
        """Call ``method`` of one of the hook's clients; the JSON body as plain dicts (``text``: as a string).

        Retried by the provider's ``generic_api_retry``: 429 (after its Retry-After), 5xx and
        dropped connections. A 409 is raised as ``Conflict``: the object exists, asking again
        cannot change that. ``missing_ok``: None for a 404.
        """
        try:
            response = method(*args, _preload_content=False, **kwargs)
        except ApiException as err:
            if err.status == 404 and missing_ok:
                return None
            if err.status == 409:
                raise Conflict(f"{err.status} {err.reason}") from err
            raise
        data = response.data or b""
        return data.decode("utf-8", "replace") if text else json.loads(data or b"null")

    @property
    def _core(self):
        return self.hook.core_v1_client

    @property
    def _batch(self):
        return self.hook.batch_v1_client

    def _job(self, name: str) -> dict[str, Any] | None:
        return self._api(self._batch.read_namespaced_job, name, self.namespace, missing_ok=True)

    def _pods(self, selector: str) -> list[dict[str, Any]]:
        pods = self._api(self._core.list_namespaced_pod, self.namespace, label_selector=selector)["items"]
        return sorted(pods, key=lambda p: (pod_index(p), p["metadata"].get("creationTimestamp", "")))
