"""The fake Kubernetes API server: an HTTP server on 127.0.0.1 over the store, controllers and driver."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.kubernetes.fakeapi.controller import JobController
from tests.kubernetes.fakeapi.driver import TestDriver
from tests.kubernetes.fakeapi.exec import PodExec
from tests.kubernetes.fakeapi.store import ApiStore
from tests.kubernetes.fakeapi.wire import ApiError


def _handler_class(fake: FakeKubernetesApiServer) -> type[BaseHTTPRequestHandler]:
    """The request handler of ``fake``'s HTTP server: every request goes to ``fake.handle``."""

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

    return Handler


class FakeKubernetesApiServer(ApiStore, JobController, TestDriver, PodExec):
    """A fake Kubernetes API server with a fake Job controller; see the package docstring."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.pod_logs: dict[tuple[str, str], list[tuple[float, str]]] = {}
        self.requests: list[tuple[str, str]] = []
        self.execs: list[tuple[str, str, str, list[str]]] = []  # (namespace, pod, container, command)
        self.exec_handler = None  # (namespace, pod, container, command) -> (stdout, stderr, exit_code)
        self.faults: list[dict[str, Any]] = []  # see fail_next
        self._accounted: dict[str, set[str]] = {}  # failed pods the Job controller has counted, per Job uid
        self._indexes: dict[str, dict[str, Any]] = {}  # per-index failures and backoffs, per Job uid
        self._version = 0
        self._server: ThreadingHTTPServer | None = None
        self.clock_offset = 0.0  # seconds the fake's controllers run ahead of the wall clock (advance)
        self._stopped = threading.Event()

    # -- server ------------------------------------------------------------------------------
    def start(self) -> FakeKubernetesApiServer:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_class(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        threading.Thread(target=self._controllers, daemon=True).start()
        self.reset()
        return self

    def _controllers(self) -> None:
        """The cluster's own clockwork, whether or not anybody calls the API."""
        while not self._stopped.wait(0.1):
            self.tick()

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
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [
                {"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}
            ],
        }
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
            self._indexes.clear()
            self.clock_offset = 0.0
            self._create("namespaces", "", {"metadata": {"name": "default"}})
