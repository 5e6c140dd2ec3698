"""The fake's API: create, get, list, patch, delete and pod logs over a dict of objects, and injected faults.

Deletes follow the propagation policies of the real garbage collector (Jobs default to orphaning, as
``batch/v1`` does). A busy or failing API server is played with ``fail_next(method, path, code)``.
"""

from __future__ import annotations

import copy
import json
import secrets
import time
import uuid
from typing import Any

from tests.kubernetes.fakeapi.wire import _KIND, _ROUTES, ApiError, _nano, _now, matches, merge_patch


class ApiStore:
    """The fake's objects behind the API's verbs; mixed into ``FakeKubernetesApiServer``."""

    _REASONS = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}

    def fail_next(
        self, method: str, path: str, code: int, *, times: int = 1, retry_after: int | None = None
    ) -> None:
        """Answer the next ``times`` ``method`` requests whose path ends with ``path`` with ``code``."""
        with self.lock:
            self.faults.append({"method": method, "path": path, "code": code, "left": times,
                                "retry_after": retry_after})  # fmt: skip

    def _inject_fault(self, method: str, path: str) -> None:
        for fault in self.faults:
            if fault["left"] and fault["method"] == method and path.endswith(fault["path"]):
                fault["left"] -= 1
                code = fault["code"]
                headers = (
                    {"Retry-After": str(fault["retry_after"])} if fault["retry_after"] is not None else {}
                )
                raise ApiError(
                    code, self._REASONS.get(code, "Failure"), f"injected {code} for {method} {path}", headers
                )

    def handle(self, method: str, path: str, query: dict, body: bytes, content_type: str) -> tuple[int, Any]:
        with self.lock:
            self.tick()  # what the controllers did since the last look, as a cluster would have
            self.requests.append((method, path))
            self._inject_fault(method, path)
            for pattern, fixed_kind, namespaced in _ROUTES:
                match = pattern.match(path)
                if match:
                    break
            else:
                raise ApiError(404, "NotFound", f"the server could not find the requested resource {path}")
            parts = match.groupdict()
            kind = fixed_kind or parts["kind"]
            ns = parts.get("ns", "") if namespaced else ""
            name, sub = parts.get("name"), parts.get("sub")
            if namespaced and ("namespaces", "", ns) not in self.objects and method != "DELETE":
                raise ApiError(404, "NotFound", f'namespaces "{ns}" not found')
            data = json.loads(body) if body else None
            if name is None:
                if method == "GET":
                    return 200, self._list(kind, ns, query.get("labelSelector", [""])[0])
                if method == "POST":
                    return 201, self._create(kind, ns, data)
            elif sub == "/log":
                return 200, self._log(ns, name, query)
            elif method == "GET":
                return 200, self._get(kind, ns, name)
            elif method == "PATCH":
                if "json-patch" in content_type and not isinstance(data, list):
                    # what a real API server says to a dict sent as a JSON patch
                    raise ApiError(
                        400,
                        "BadRequest",
                        "json: cannot unmarshal object into Go value of type jsonpatch.Patch",
                    )
                if "json-patch" in content_type:
                    raise ApiError(415, "UnsupportedMediaType", "the fake supports merge patches only")
                return 200, self._patch(kind, ns, name, data)
            elif method == "DELETE":
                policy = (data or {}).get("propagationPolicy") or query.get("propagationPolicy", [None])[0]
                self._delete(kind, ns, name, policy)
                return 200, {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Success",
                    "details": {"name": name},
                }
            raise ApiError(405, "MethodNotAllowed", f"{method} {path}")

    def _list(self, kind: str, ns: str, selector: str) -> dict[str, Any]:
        api_version, kind_name = _KIND[kind]
        items = [
            copy.deepcopy(o) for (k, n, _), o in sorted(self.objects.items())
            if k == kind and (n == ns or not ns) and matches(o["metadata"].get("labels") or {}, selector)
        ]  # fmt: skip
        return {"kind": f"{kind_name}List", "apiVersion": api_version,
                "metadata": {"resourceVersion": str(self._version)}, "items": items}  # fmt: skip

    def _get(self, kind: str, ns: str, name: str) -> dict[str, Any]:
        obj = self.objects.get((kind, ns, name))
        if obj is None:
            raise ApiError(404, "NotFound", f'{kind} "{name}" not found')
        return copy.deepcopy(obj)

    def _create(self, kind: str, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        name = meta.get("name")
        if not name:
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        if kind == "jobs":
            self._check_job(obj)
        if (kind, ns, name) in self.objects:
            raise ApiError(409, "AlreadyExists", f'{kind} "{name}" already exists')
        self._version += 1
        api_version, kind_name = _KIND[kind]
        obj.update(apiVersion=api_version, kind=kind_name)
        meta.update(uid=str(uuid.uuid4()), resourceVersion=str(self._version), creationTimestamp=_now())
        if ns:
            meta["namespace"] = ns
        obj.setdefault("status", {})
        self.objects[(kind, ns, name)] = obj
        if kind == "jobs":
            obj["status"] = {"startTime": self._clock()} if not obj["spec"].get("suspend") else {}
            self._sync_job(ns, name)
        return copy.deepcopy(obj)

    def _patch(self, kind: str, ns: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        obj = self._get(kind, ns, name)
        was_suspended = bool(obj.get("spec", {}).get("suspend"))
        obj = merge_patch(obj, patch)
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        self.objects[(kind, ns, name)] = obj
        if kind == "jobs" and bool(obj["spec"].get("suspend")) != was_suspended:
            self._on_suspend(ns, name, bool(obj["spec"].get("suspend")))
        return copy.deepcopy(obj)

    def _delete(self, kind: str, ns: str, name: str, policy: str | None) -> None:
        obj = self._get(kind, ns, name)
        # batch/v1 Jobs orphan their pods unless told otherwise, as the real API does
        policy = policy or ("Orphan" if kind == "jobs" else "Background")
        uid = obj["metadata"]["uid"]
        self.objects[(kind, ns, name)]["metadata"]["deletionTimestamp"] = _now()  # no controller revives it
        for key, dependent in list(self.objects.items()):
            owners = dependent["metadata"].get("ownerReferences") or []
            if any(o.get("uid") == uid for o in owners):
                if policy == "Orphan":
                    dependent["metadata"]["ownerReferences"] = [o for o in owners if o.get("uid") != uid]
                elif key in self.objects:
                    self._delete(key[0], key[1], key[2], policy)
        del self.objects[(kind, ns, name)]
        if kind == "pods":
            self.pod_logs.pop((ns, name), None)
            self._sync_owner(obj)

    def _log(self, ns: str, name: str, query: dict) -> str:
        pod = self._get("pods", ns, name)
        container = (query.get("container") or [pod["spec"]["containers"][0]["name"]])[0]
        states = {s["name"]: s.get("state", {}) for s in pod["status"].get("containerStatuses", [])}
        if "running" not in states.get(container, {}) and "terminated" not in states.get(container, {}):
            raise ApiError(
                400,
                "BadRequest",
                f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating',
            )
        lines = self.pod_logs.get((ns, name), [])
        if "sinceSeconds" in query:
            lines = [entry for entry in lines if entry[0] >= time.time() - int(query["sinceSeconds"][0])]
        if "tailLines" in query:
            lines = lines[-int(query["tailLines"][0]) :] if int(query["tailLines"][0]) else []
        with_time = query.get("timestamps", ["false"])[0].lower() in ("true", "1")  # Go's ParseBool
        return "".join(f"{_nano(at) + ' ' if with_time else ''}{line}\n" for at, line in lines)
