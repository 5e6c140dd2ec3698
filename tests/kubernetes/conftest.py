"""Fixtures of the kubernetes backend tests: a fake API server the real client talks to over HTTP."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from airflow_dtrain.kubernetes.launcher import KubernetesLauncher
from airflow_dtrain.job.spec import JobSpec
from tests.kubernetes.fakeapi import FakeKubernetesApiServer


@pytest.fixture(scope="session")
def _fake_server():
    server = FakeKubernetesApiServer().start()
    yield server
    server.stop()


@pytest.fixture
def fake(_fake_server: FakeKubernetesApiServer, tmp_path: Path, monkeypatch) -> FakeKubernetesApiServer:
    """An empty fake cluster; the ``kubernetes_default`` connection points at it (kubeconfig path)."""
    _fake_server.reset()
    kubeconfig = _fake_server.write_kubeconfig(tmp_path / "kubeconfig")
    monkeypatch.setenv(
        "AIRFLOW_CONN_KUBERNETES_DEFAULT",
        json.dumps({"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}),
    )
    return _fake_server


def launch_debug_group(
    name: str, tmp_path: Path, *, nodes: int = 2, namespace: str | None = None, **kubernetes: Any
) -> KubernetesLauncher:
    """A debug-flavour group of ``nodes`` × 1 launched on the fake cluster (checkpoints on a PVC at
    tmp_path)."""
    spec = JobSpec.from_arguments(
        flavor="debug",
        steps=10,
        global_batch_size=nodes,
        micro_batch_size=1,
        num_nodes=nodes,
        procs_per_node=1,
        backend="kubernetes",
        checkpoint_uri=str(tmp_path / name),
        kubernetes={
            "image": "ghcr.io/acme/dtrain:test",
            "volumes": [{"claim": "ckpt", "mount_path": str(tmp_path)}],
            **({"namespace": namespace} if namespace else {}),
            **kubernetes,
        },
    )
    launcher = KubernetesLauncher(namespace=namespace)
    launcher.launch(name, spec)
    return launcher


class Background:
    """Run ``fn`` in a thread (an operator's execute, a trigger) while the test drives the fake cluster."""

    def __init__(self, fn, *args: Any, **kwargs: Any) -> None:
        self._outcome: dict[str, Any] = {}

        def target():
            try:
                self._outcome["value"] = fn(*args, **kwargs)
            except BaseException as err:  # noqa: BLE001 - handed to the test
                self._outcome["error"] = err

        self._thread = threading.Thread(target=target, daemon=True)
        self._thread.start()

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float = 30) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"still running after {timeout}s"
        if "error" in self._outcome:
            raise self._outcome["error"]
        return self._outcome["value"]

    def error(self, timeout: float = 30) -> BaseException:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"still running after {timeout}s"
        assert "error" in self._outcome, f"expected an error, got {self._outcome.get('value')!r}"
        return self._outcome["error"]
