"""A stateful fake Kubernetes API server on 127.0.0.1, for tests (there is no cluster here).

The real kubernetes client talks to it over HTTP, through a kubeconfig that points at
it, exactly as it would to a cluster. It keeps namespaces, ConfigMaps, Services, Pods
and batch/v1 Jobs, answers list calls with label selectors, serves pod logs (with
``timestamps``, ``sinceSeconds`` and ``tailLines``), applies JSON merge patches, and
deletes with the propagation policies of the real garbage collector (Jobs default to
orphaning, as ``batch/v1`` does).

It also plays a small Job controller: an Indexed Job gets one Pod per completion index;
tests then drive the pods (``run``, ``log``, ``exit``, ``disrupt``, ``unschedulable``) and
the nodes they run on (``add_node``, ``taint``)
and the fake applies the Job's ``podFailurePolicy`` rules, completion, suspension and
replacement pods the way the real controller does for the fields the launcher uses.

It acts on its own, as a cluster does with nobody calling it (a thread, and before every
request): a Job past its ``activeDeadlineSeconds`` since its ``startTime`` fails with reason
``DeadlineExceeded`` and its running pods are deleted, and a finished Job past its
``ttlSecondsAfterFinished`` is deleted with its dependents (the TTL controller's foreground
deletion). ``advance(seconds)`` moves the fake's clock forward for both. Its scheduler check:
``run(nodes=...)`` refuses a node that the pod's nodeSelector or required node affinity excludes.

``pods/exec`` speaks the real protocol (a WebSocket upgrade, then ``v4.channel.k8s.io``
frames: stdout on channel 1, stderr on 2, the exit status on 3). Nothing is executed: the
test's ``exec_handler(namespace, pod, container, command) -> (stdout, stderr, exit_code)``
answers, and every exec is recorded in ``execs``.

A busy or failing API server is played with ``fail_next(method, path, code)``: the next
matching requests are answered with that status (and ``Retry-After``, if given) before the
fake looks at them.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
import secrets
import threading
import time
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from struct import pack
from typing import Any
from urllib.parse import parse_qs, urlparse

_ROUTES = [
    (re.compile(r"^/api/v1/namespaces$"), "namespaces", False),
    (re.compile(r"^/api/v1/namespaces/(?P<name>[^/]+)$"), "namespaces", False),
    (re.compile(r"^/api/v1/nodes$"), "nodes", False),
    (re.compile(r"^/api/v1/nodes/(?P<name>[^/]+)$"), "nodes", False),
    (re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>pods|services|configmaps)$"), None, True),
    (re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>pods|services|configmaps)/(?P<name>[^/]+)(?P<sub>/log|/status)?$"), None, True),
    (re.compile(r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>jobs)$"), None, True),
    (re.compile(r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>jobs)/(?P<name>[^/]+)(?P<sub>/status)?$"), None, True),
]  # fmt: skip
_KIND = {"pods": ("v1", "Pod"), "services": ("v1", "Service"), "configmaps": ("v1", "ConfigMap"),
         "jobs": ("batch/v1", "Job"), "namespaces": ("v1", "Namespace"), "nodes": ("v1", "Node")}  # fmt: skip


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _time(stamp: str | None) -> float | None:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else None


def _selects(term: dict[str, Any], labels: dict[str, str]) -> bool:
    """A nodeSelectorTerm's expressions (ANDed) against a node's labels."""
    for expression in term.get("matchExpressions") or ():
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        present = key in labels
        if not {"In": present and labels.get(key) in values, "NotIn": not present or labels[key] not in values,
                "Exists": present, "DoesNotExist": not present}[operator]:  # fmt: skip
            return False
    return True


def scheduling_problem(pod: dict[str, Any], node: dict[str, Any]) -> str | None:
    """Why the scheduler would not bind ``pod`` to ``node`` (its nodeSelector, its required node affinity)."""
    labels = node["metadata"].get("labels") or {}
    for key, value in (pod["spec"].get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return f"nodeSelector {key}={value}: the node has {labels.get(key)!r}"
    required = (((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})  # fmt: skip
    terms = required.get("nodeSelectorTerms") or []
    if terms and not any(_selects(term, labels) for term in terms):
        return f"no required node affinity term matches the node's labels {labels}: {terms}"
    return None


def _nano(at: float) -> str:
    whole = datetime.fromtimestamp(int(at), timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{int(round((at % 1) * 1e9)):09d}Z"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def matches(labels: dict[str, str], selector: str) -> bool:
    """Equality-based label selectors: ``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``, comma-separated."""
    for term in filter(None, (t.strip() for t in (selector or "").split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _image(pod: dict[str, Any]) -> dict[str, str]:
    """A container status's image fields, as the kubelet reports them (required by the typed client)."""
    image = pod["spec"]["containers"][0]["image"]
    return {"image": image, "imageID": f"{image}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"}


def _ws_frame(opcode: int, payload: bytes) -> bytes:
    """One unmasked, final WebSocket frame (RFC 6455), as a server sends it."""
    n = len(payload)
    size = (
        bytes([n])
        if n < 126
        else bytes([126]) + pack(">H", n)
        if n < 1 << 16
        else bytes([127]) + pack(">Q", n)
    )
    return bytes([0x80 | opcode]) + size + payload


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.headers = code, reason, message, headers or {}


class FakeKubernetesApiServer:
    """A fake Kubernetes API server with a fake Job controller; see the module docstring."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.pod_logs: dict[tuple[str, str], list[tuple[float, str]]] = {}
        self.requests: list[tuple[str, str]] = []
        self.execs: list[tuple[str, str, str, list[str]]] = []  # (namespace, pod, container, command)
        self.exec_handler = None  # (namespace, pod, container, command) -> (stdout, stderr, exit_code)
        self.faults: list[dict[str, Any]] = []  # see fail_next
        self._accounted: dict[str, set[str]] = {}  # failed pods the Job controller has counted, per Job uid
        self._version = 0
        self._server: ThreadingHTTPServer | None = None
        self.clock_offset = 0.0  # seconds the fake's controllers run ahead of the wall clock (advance)
        self._stopped = threading.Event()

    # -- server ------------------------------------------------------------------------------
    def start(self) -> FakeKubernetesApiServer:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def _handle(self) -> None:
                url = urlparse(self.path)
                if self.headers.get("Upgrade", "").lower() == "websocket":
                    fake._exec(self, url)
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers: dict[str, str] = {}
                try:
                    code, payload = fake.handle(
                        self.command,
                        url.path,
                        parse_qs(url.query),
                        body,
                        self.headers.get("Content-Type", ""),
                    )
                except ApiError as err:
                    headers = err.headers
                    code, payload = err.code, {
                        "kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "message": err.message, "reason": err.reason, "code": err.code,
                    }  # fmt: skip
                if isinstance(payload, str):
                    data, ctype = payload.encode(), "text/plain"
                else:
                    data, ctype = json.dumps(payload).encode(), "application/json"
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        threading.Thread(target=self._controllers, daemon=True).start()
        self.reset()
        return self

    def _controllers(self) -> None:
        """The cluster's own clockwork, whether or not anybody calls the API."""
        while not self._stopped.wait(0.1):
            self.tick()

    def _clock(self) -> str:
        """Now on the fake's clock: the Job controller's own times (start, completion, failure) follow ``advance``."""
        return datetime.fromtimestamp(time.time() + self.clock_offset, timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )

    def advance(self, seconds: float) -> None:
        """Move the fake's clock ``seconds`` forward (deadlines and TTLs fall due), and act on it now."""
        with self.lock:
            self.clock_offset += seconds
            self.tick()

    def tick(self) -> None:
        """The Job controller's activeDeadlineSeconds and the TTL-after-finished controller, at the fake's time."""
        with self.lock:
            now = time.time() + self.clock_offset
            for (kind, ns, name), job in list(self.objects.items()):
                if (
                    kind != "jobs"
                    or (kind, ns, name) not in self.objects
                    or job["metadata"].get("deletionTimestamp")
                ):
                    continue
                status = job.get("status") or {}
                ended = {c["type"]: c for c in status.get("conditions") or [] if c.get("status") == "True"}
                deadline, started = job["spec"].get("activeDeadlineSeconds"), _time(status.get("startTime"))
                if (deadline and started and not job["spec"].get("suspend")
                        and not ({"Complete", "Failed"} & set(ended)) and now >= started + deadline):  # fmt: skip
                    self._fail_job(
                        ns, job, "DeadlineExceeded", "Job was active longer than specified deadline"
                    )
                    continue
                ttl = job["spec"].get("ttlSecondsAfterFinished")
                end = ended.get("Complete") or ended.get("Failed")
                finished = _time(status.get("completionTime")) or _time((end or {}).get("lastTransitionTime"))
                if ttl is not None and end and finished is not None and now >= finished + ttl:
                    self._delete("jobs", ns, name, "Foreground")

    _EXEC = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/exec$")

    def _exec(self, handler: BaseHTTPRequestHandler, url) -> None:
        """pods/exec over a WebSocket, answered by exec_handler (see the module docstring)."""
        match = self._EXEC.match(url.path)
        query = parse_qs(url.query)
        with self.lock:
            self.requests.append(("EXEC", url.path))
            pod = self.objects.get(("pods", match["ns"], match["name"])) if match else None
            running = pod is not None and pod["status"].get("phase") == "Running"
        if not running:
            message = json.dumps({"kind": "Status", "status": "Failure", "code": 400 if pod else 404,
                                  "message": f"pod {url.path} is not running"}).encode()  # fmt: skip
            handler.send_response(400 if pod else 404)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(message)))
            handler.end_headers()
            handler.wfile.write(message)
            return
        container, command = query.get("container", [""])[0], query.get("command", [])
        self.execs.append((match["ns"], match["name"], container, command))
        answer = self.exec_handler or (lambda *_: ("", "this fake executes nothing: set exec_handler", 126))
        stdout, stderr, code = answer(match["ns"], match["name"], container, command)
        key = handler.headers["Sec-WebSocket-Key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
        handler.send_response(101, "Switching Protocols")
        handler.send_header("Upgrade", "websocket")
        handler.send_header("Connection", "Upgrade")
        handler.send_header(
            "Sec-WebSocket-Accept", base64.b64encode(hashlib.sha1(key.encode()).digest()).decode()
        )
        handler.send_header("Sec-WebSocket-Protocol", "v4.channel.k8s.io")
        handler.end_headers()
        status = {"metadata": {}, "status": "Success"} if code == 0 else {
            "metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
            "message": f"command terminated with non-zero exit code: {code}",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}  # fmt: skip
        for channel, text in ((1, stdout), (2, stderr), (3, json.dumps(status))):
            if text:
                handler.wfile.write(_ws_frame(0x2, bytes([channel]) + text.encode()))
        handler.wfile.write(_ws_frame(0x8, pack(">H", 1000)))  # close: normal
        handler.wfile.flush()
        handler.close_connection = True

    def stop(self) -> None:
        self._stopped.set()
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}],
        }  # fmt: skip
        path.write_text(json.dumps(config))
        return path

    def reset(self) -> None:
        with self.lock:
            self.objects.clear()
            self.pod_logs.clear()
            self.requests.clear()
            self.execs.clear()
            self.exec_handler = None
            self.faults.clear()
            self._accounted.clear()
            self.clock_offset = 0.0
            self._create("namespaces", "", {"metadata": {"name": "default"}})

    # -- the API -------------------------------------------------------------------------------
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

    # -- the fake Job controller ---------------------------------------------------------------
    def _job_pods(self, ns: str, job: dict[str, Any]) -> list[dict[str, Any]]:
        uid = job["metadata"]["uid"]
        pods = [o for (k, n, _), o in self.objects.items() if k == "pods" and n == ns
                and any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])]  # fmt: skip
        return sorted(pods, key=lambda p: p["metadata"]["resourceVersion"])

    def _sync_owner(self, pod: dict[str, Any]) -> None:
        for ref in pod["metadata"].get("ownerReferences") or []:
            if (
                ref.get("kind") == "Job"
                and ("jobs", pod["metadata"]["namespace"], ref["name"]) in self.objects
            ):
                self._sync_job(pod["metadata"]["namespace"], ref["name"])

    def _create_pod(self, ns: str, job: dict[str, Any], index: int) -> None:
        template = copy.deepcopy(job["spec"]["template"])
        name = job["metadata"]["name"]
        meta = template.get("metadata") or {}
        labels = {**(meta.get("labels") or {}), "batch.kubernetes.io/job-name": name, "job-name": name,
                  "batch.kubernetes.io/controller-uid": job["metadata"]["uid"],
                  "batch.kubernetes.io/job-completion-index": str(index)}  # fmt: skip
        annotations = {
            **(meta.get("annotations") or {}),
            "batch.kubernetes.io/job-completion-index": str(index),
        }
        pod = {
            "metadata": {
                "name": f"{name}-{index}-{secrets.token_hex(3)[:5]}", "labels": labels, "annotations": annotations,
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                     "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": {**template["spec"], "hostname": f"{name}-{index}"},
        }  # fmt: skip
        created = self._create("pods", ns, pod)
        self.objects[("pods", ns, created["metadata"]["name"])]["status"] = {"phase": "Pending"}

    def _sync_job(self, ns: str, name: str) -> None:
        job = self.objects[("jobs", ns, name)]
        status = job.setdefault("status", {})
        terminal = {c["type"] for c in status.get("conditions", []) if c.get("status") == "True"}
        if (
            terminal & {"Complete", "Failed"}
            or job["spec"].get("suspend")
            or job["metadata"].get("deletionTimestamp")
        ):
            return
        pods = self._job_pods(ns, job)
        accounted = self._accounted.setdefault(job["metadata"]["uid"], set())
        for pod in pods:
            uid = pod["metadata"]["uid"]
            if pod["status"].get("phase") != "Failed" or uid in accounted:
                continue
            accounted.add(uid)
            action, rule, code = self._match_failure_policy(job, pod)
            if action == "Ignore":
                continue
            status["failed"] = status.get("failed", 0) + 1
            if action == "FailJob":
                message = (f"Container trainer for pod {ns}/{pod['metadata']['name']} failed with exit code "
                           f"{code} matching FailJob rule at index {rule}")  # fmt: skip
                return self._fail_job(ns, job, "PodFailurePolicy", message)
            if status["failed"] > job["spec"].get("backoffLimit", 6):
                return self._fail_job(
                    ns, job, "BackoffLimitExceeded", "Job has reached the specified backoff limit"
                )
        succeeded = {self._index(p) for p in pods if p["status"].get("phase") == "Succeeded"}
        status["succeeded"] = len(succeeded)
        completions = job["spec"].get("completions", 1)
        if len(succeeded) >= completions:
            status["conditions"] = [
                {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": self._clock()},
                {"type": "Complete", "status": "True", "lastTransitionTime": self._clock()},
            ]
            status["completionTime"] = self._clock()
            status["active"] = 0
            return
        active = {self._index(p) for p in pods if p["status"].get("phase") in ("Pending", "Running")}
        for index in range(completions):
            if index not in active and index not in succeeded:
                self._create_pod(ns, job, index)  # first pod, or the replacement of an ignored failure
        status["active"] = len({self._index(p) for p in self._job_pods(ns, job)
                                if p["status"].get("phase") in ("Pending", "Running")})  # fmt: skip

    def _match_failure_policy(
        self, job: dict[str, Any], pod: dict[str, Any]
    ) -> tuple[str, int | None, int | None]:
        code = None
        for status in pod["status"].get("containerStatuses", []):
            code = (status.get("state", {}).get("terminated") or {}).get("exitCode", code)
        conditions = {(c["type"], c["status"]) for c in pod["status"].get("conditions", [])}
        for i, rule in enumerate((job["spec"].get("podFailurePolicy") or {}).get("rules", [])):
            on_codes = rule.get("onExitCodes")
            if on_codes and code not in (None, 0):
                inside = code in on_codes["values"]
                if inside == (on_codes["operator"] == "In"):
                    return rule["action"], i, code
            for cond in rule.get("onPodConditions", []):
                if (cond["type"], cond.get("status", "True")) in conditions:
                    return rule["action"], i, code
        return "Count", None, code

    def _fail_job(self, ns: str, job: dict[str, Any], reason: str, message: str) -> None:
        job["status"]["conditions"] = [
            {"type": "FailureTarget", "status": "True", "reason": reason, "message": message, "lastTransitionTime": self._clock()},
            {"type": "Failed", "status": "True", "reason": reason, "message": message, "lastTransitionTime": self._clock()},
        ]  # fmt: skip
        job["status"]["active"] = 0
        for pod in self._job_pods(ns, job):  # the controller deletes the pods still running
            if pod["status"].get("phase") in ("Pending", "Running"):
                self._delete("pods", ns, pod["metadata"]["name"], "Background")

    def _on_suspend(self, ns: str, name: str, suspended: bool) -> None:
        job = self.objects[("jobs", ns, name)]
        if {c["type"] for c in job["status"].get("conditions", []) if c.get("status") == "True"} & {
            "Complete",
            "Failed",
        }:
            return  # the controller leaves a finished Job alone: suspending it changes nothing
        if suspended:
            for pod in self._job_pods(ns, job):
                if pod["status"].get("phase") in ("Pending", "Running"):
                    self._delete("pods", ns, pod["metadata"]["name"], "Background")
            job["status"]["conditions"] = [
                {"type": "Suspended", "status": "True", "lastTransitionTime": _now()}
            ]
            job["status"]["active"] = 0
        else:
            job["status"]["conditions"] = []
            job["status"]["startTime"] = self._clock()
            self._sync_job(ns, name)

    @staticmethod
    def _index(pod: dict[str, Any]) -> int:
        return int(pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])

    # -- what tests drive ----------------------------------------------------------------------
    def jobs(self, namespace: str = "default") -> list[str]:
        with self.lock:
            self.tick()
            return sorted(n for k, ns, n in self.objects if k == "jobs" and ns == namespace)

    def names(self, kind: str, namespace: str = "default") -> list[str]:
        with self.lock:
            return sorted(n for k, ns, n in self.objects if k == kind and ns == namespace)

    def get(self, kind: str, name: str, namespace: str = "default") -> dict[str, Any] | None:
        with self.lock:
            self.tick()
            obj = self.objects.get((kind, namespace, name))
            return copy.deepcopy(obj) if obj else None

    def pod(self, job: str, index: int, namespace: str = "default") -> dict[str, Any]:
        """The newest pod of ``index`` of Job ``job``."""
        with self.lock:
            pods = [o for (k, n, _), o in self.objects.items() if k == "pods" and n == namespace
                    and o["metadata"]["labels"].get("batch.kubernetes.io/job-name") == job
                    and self._index(o) == index]  # fmt: skip
            if not pods:
                raise KeyError(f"no pod of index {index} of Job {job}")
            return max(pods, key=lambda p: int(p["metadata"]["resourceVersion"]))

    def _update_pod(self, job: str, index: int, namespace: str, change) -> None:
        with self.lock:
            pod = self.pod(job, index, namespace)
            change(pod)
            self._version += 1
            pod["metadata"]["resourceVersion"] = str(self._version)
            self._sync_owner(pod)

    def unschedulable(self, job: str, index: int, message: str, namespace: str = "default") -> None:
        def change(pod):
            pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                            "message": message, "lastTransitionTime": _now()}]  # fmt: skip

        self._update_pod(job, index, namespace, change)

    def add_node(
        self,
        name: str,
        instance_id: str,
        zone: str = "us-east-1a",
        *,
        instance_type: str | None = None,
        capacity: str | None = None,
    ) -> None:
        """An EC2-backed Node (``spec.providerID`` ``aws:///<zone>/<instance id>``), labelled with its zone and,
        if given, its instance type and Karpenter capacity type (``spot``, ``on-demand``)."""
        labels = {"topology.kubernetes.io/zone": zone, "kubernetes.io/hostname": name}
        if instance_type:
            labels["node.kubernetes.io/instance-type"] = instance_type
        if capacity:
            labels["karpenter.sh/capacity-type"] = capacity
        with self.lock:
            self._create("nodes", "", {"metadata": {"name": name, "labels": labels},
                                       "spec": {"providerID": f"aws:///{zone}/{instance_id}"}})  # fmt: skip

    def taint(self, node: str, key: str, effect: str = "NoSchedule") -> None:
        """A taint on a node, as aws-node-termination-handler or Karpenter put one."""
        with self.lock:
            obj = self.objects[("nodes", "", node)]
            obj["spec"].setdefault("taints", []).append({"key": key, "effect": effect, "timeAdded": _now()})
            self._version += 1
            obj["metadata"]["resourceVersion"] = str(self._version)

    def run(
        self,
        job: str,
        indexes: list[int] | None = None,
        namespace: str = "default",
        nodes: dict[int, str] | None = None,
    ) -> None:
        """Pods scheduled (onto ``nodes[index]`` when given) and their trainer container started."""
        spec = self.get("jobs", job, namespace)
        for index in indexes if indexes is not None else range(spec["spec"]["completions"]):

            def change(pod, index=index):
                if nodes and index in nodes:
                    node = self.objects.get(("nodes", "", nodes[index]))
                    problem = scheduling_problem(pod, node) if node else None
                    if problem:  # what the real scheduler would never do
                        raise ValueError(
                            f"pod {pod['metadata']['name']} cannot run on node {nodes[index]}: {problem}"
                        )
                    pod["spec"]["nodeName"] = nodes[index]
                pod["status"].update(
                    phase="Running", startTime=_now(), podIP=f"10.0.0.{index + 10}",
                    conditions=[{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
                    containerStatuses=[{"name": "trainer", "ready": True, "restartCount": 0, **_image(pod),
                                        "state": {"running": {"startedAt": _now()}}}],
                )  # fmt: skip

            self._update_pod(job, index, namespace, change)

    def log(self, job: str, index: int, *lines: str, namespace: str = "default") -> None:
        with self.lock:
            pod = self.pod(job, index, namespace)
            entries = self.pod_logs.setdefault((namespace, pod["metadata"]["name"]), [])
            entries.extend((time.time(), line) for line in lines)

    def exit(
        self, job: str, index: int, code: int, namespace: str = "default", disruption: str | None = None
    ) -> None:
        """The trainer container of pod ``index`` exits ``code``; ``disruption``: the DisruptionTarget reason."""

        def change(pod):
            phase = "Succeeded" if code == 0 else "Failed"
            conditions = [c for c in pod["status"].get("conditions", []) if c["type"] != "Ready"]
            if disruption:
                conditions.append({"type": "DisruptionTarget", "status": "True", "reason": disruption,
                                   "message": "the node is being reclaimed", "lastTransitionTime": _now()})  # fmt: skip
            pod["status"].update(phase=phase, conditions=conditions, containerStatuses=[{
                "name": "trainer", "ready": False, "restartCount": 0, **_image(pod),
                "state": {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                         "startedAt": _now(), "finishedAt": _now()}},
            }])  # fmt: skip

        self._update_pod(job, index, namespace, change)
