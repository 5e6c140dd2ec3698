"""``pods/exec`` over the real protocol: a WebSocket upgrade, then ``v4.channel.k8s.io`` frames.

Nothing is executed: the test's ``exec_handler(namespace, pod, container, command) -> (stdout, stderr,
exit_code)`` answers, and every exec is recorded in ``execs``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from http.server import BaseHTTPRequestHandler
from struct import pack
from urllib.parse import parse_qs

from tests.kubernetes.fakeapi.wire import _ws_frame


class PodExec:
    """The fake's ``pods/exec``; mixed into ``FakeKubernetesApiServer``."""

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
