"""What the fake API server shares: routes, kinds, times, selectors, merge patches and its error."""

from __future__ import annotations

import copy
import hashlib
import re
from datetime import datetime, timezone
from struct import pack
from typing import Any

_ROUTES = [
    (re.compile(r"^/api/v1/namespaces$"), "namespaces", False),
    (re.compile(r"^/api/v1/namespaces/(?P<name>[^/]+)$"), "namespaces", False),
    (re.compile(r"^/api/v1/nodes$"), "nodes", False),
    (re.compile(r"^/api/v1/nodes/(?P<name>[^/]+)$"), "nodes", False),
    (re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>pods|services|configmaps)$"), None, True),
    (
        re.compile(
            r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>pods|services|configmaps)/(?P<name>[^/]+)(?P<sub>/log|/status)?$"
        ),
        None,
        True,
    ),
    (re.compile(r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>jobs)$"), None, True),
    (
        re.compile(
            r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>jobs)/(?P<name>[^/]+)(?P<sub>/status)?$"
        ),
        None,
        True,
    ),
]
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
        holds = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels[key] not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }
        if not holds[operator]:
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
