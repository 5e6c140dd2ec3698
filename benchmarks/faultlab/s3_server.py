"""An S3 API that fails on demand: moto in server mode on 127.0.0.1 (as tests/trainer/conftest.py starts it),
behind a fault-injecting front that answers chosen writes with 500 InternalError or 503 SlowDown.

The front is a WSGI layer inside moto's own HTTP server (moto has no fault switch of its own): a request it
fails never reaches moto, so nothing of it is stored, exactly as when S3 refuses a PUT. A rule matches
``PUT``/``POST`` requests whose path matches a regular expression, and fails the next ``count`` of them (a
transient burst: botocore's retries should absorb it) or every one until cleared (``count=None``: a
persistent outage). Reads and deletes always go through.
"""

from __future__ import annotations

import re
import threading
import uuid
from dataclasses import dataclass

BUCKET = "dtrain-faults"

_ERRORS = {
    500: (
        "500 Internal Server Error",
        "InternalError",
        "We encountered an internal error. Please try again.",
    ),
    503: ("503 Slow Down", "SlowDown", "Please reduce your request rate."),
}


@dataclass
class Rule:
    """Fail the next ``count`` matching writes (None: all of them) with ``status``."""

    pattern: re.Pattern
    status: int
    count: int | None
    methods: tuple[str, ...] = ("PUT", "POST")


class S3Faults:
    """The rules the front applies, and what it did: ``injected`` lists (method, path, status) it failed."""

    def __init__(self):
        self._lock = threading.Lock()
        self.rules: list[Rule] = []
        self.injected: list[tuple[str, str, int]] = []

    def fail(self, pattern: str, status: int, count: int | None = None) -> Rule:
        """Fail writes to paths matching ``pattern`` with ``status`` (500, 503): ``count`` of them, or all."""
        if status not in _ERRORS:
            raise ValueError(f"status: expected one of {sorted(_ERRORS)}, got {status!r}")
        rule = Rule(re.compile(pattern), status, count)
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        """No more failures (what was injected stays counted)."""
        with self._lock:
            self.rules.clear()

    def verdict(self, method: str, path: str) -> int | None:
        """The status to fail this request with, or None to pass it to moto."""
        with self._lock:
            for rule in self.rules:
                if method in rule.methods and rule.pattern.search(path) and rule.count != 0:
                    if rule.count is not None:
                        rule.count -= 1
                    self.injected.append((method, path, rule.status))
                    return rule.status
        return None


class FaultFront:
    """The WSGI layer in front of moto's application."""

    def __init__(self, app, faults: S3Faults):
        self.app, self.faults = app, faults

    def __call__(self, environ, start_response):
        status = self.faults.verdict(environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""))
        if status is None:
            return self.app(environ, start_response)
        length = int(environ.get("CONTENT_LENGTH") or 0)
        if length:  # the body is read, so that the connection can carry the client's retry
            environ["wsgi.input"].read(length)
        line, code, message = _ERRORS[status]
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
            f"<RequestId>{uuid.uuid4().hex[:16]}</RequestId></Error>"
        ).encode()
        start_response(line, [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
        return [body]


def _quiet_handler():
    """moto's request handler without a log line per request (a trial makes thousands)."""
    from moto.moto_server.werkzeug_app import MotoRequestHandler

    class Quiet(MotoRequestHandler):
        def log_request(self, *args, **kwargs) -> None:
            pass

    return Quiet


class FaultyS3:
    """The moto server with its fault front, on a free loopback port; ``env`` points a client at it."""

    def __init__(self):
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        self.faults = S3Faults()  # the server moto's ThreadedMotoServer runs, with the front added
        app = FaultFront(DomainDispatcherApplication(create_backend_app), self.faults)
        self._server = make_server("127.0.0.1", 0, app, True, request_handler=_quiet_handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        host, port = self._server.server_address[:2]
        self.env = {
            "AWS_ENDPOINT_URL_S3": f"http://{host}:{port}",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def create_bucket(self, name: str = BUCKET) -> None:
        import boto3

        boto3.client(
            "s3", endpoint_url=self.env["AWS_ENDPOINT_URL_S3"], **_credentials(self.env)
        ).create_bucket(Bucket=name)

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=10)


def _credentials(env: dict) -> dict:
    return {
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        "region_name": env["AWS_DEFAULT_REGION"],
    }
