"""Checkpoint now: ask every running pod of a group to save at its next step and carry on.

Two deliveries (the Job's ``airflow-dtrain/checkpoint-now`` annotation chooses): a pod annotation the
kubelet writes into the pod's downward-API volume (needs only ``pods: patch``), or SIGUSR1 through
``pods/exec`` at once.
"""

from __future__ import annotations

import time

from airflow_dtrain.kubernetes.api import _MERGE_PATCH, KubernetesApi
from airflow_dtrain.kubernetes.names import (
    ANNOTATION_CHECKPOINT_DELIVERY,
    CHECKPOINT_NOW_ANNOTATION,
    CONTAINER,
    LABEL_GROUP,
)
from airflow_dtrain.launchers.torchrun import LAUNCH_MODULE

# SIGUSR1 to the training processes of the group's torchrun agent (trainer.elastic.workers.worker_pids),
# whatever
# program they run (the bundled trainer or your own), never the agent itself (for which it is fatal), its
# fork server, nor the workers' own children (data loader workers would die of it). It runs in the pod,
# under the image's python, with the trainer package the agent runs from (trainer.elastic.workers: stdlib
# only).
_SIGNAL_WORKERS = (
    """
import os, signal, sys
from trainer.elastic.workers import worker_pids
tag = b"DTRAIN_GROUP_NAME=" + sys.argv[1].encode()
agents = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
        if tag in open(f"/proc/{pid}/environ", "rb").read().split(b"\\0") and b"%s" in argv:
            agents.append(int(pid))
    except OSError:
        pass
asked = 0
for pid in (worker for agent in agents for worker in worker_pids(agent)):
    try:
        os.kill(pid, signal.SIGUSR1)
        asked += 1
    except OSError:
        pass
print(asked)
"""
    % LAUNCH_MODULE
)


class CheckpointNow(KubernetesApi):
    """The launcher's ``checkpoint_now``."""

    def checkpoint_now(self, name: str) -> int:
        """Ask every running pod of ``name`` to checkpoint at its next step and carry on.

        By default (the Job's ``checkpoint-now`` annotation says ``annotation``) a new value of the pod
        annotation ``dtrain.io/checkpoint-now``: the kubelet writes the pod's annotations into its
        downward-API volume and the node agent (trainer/launch.py) sends its workers SIGUSR1; returns how
        many pods were asked. Needs only ``pods: patch``. With ``exec``: SIGUSR1 through ``pods/exec`` at
        once; returns how many processes were signalled."""
        job = self._job(name)
        delivery = ((job or {}).get("metadata", {}).get("annotations") or {}).get(
            ANNOTATION_CHECKPOINT_DELIVERY
        )
        if delivery == "exec":
            return self._checkpoint_now_exec(name)
        request = str(time.time_ns())
        asked = 0
        for pod in self._pods(f"{LABEL_GROUP}={name}"):
            if pod["status"].get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
                continue
            patch = {"metadata": {"annotations": {CHECKPOINT_NOW_ANNOTATION: request}}}
            self._api(self._core.patch_namespaced_pod, pod["metadata"]["name"], self.namespace, patch,
                      _content_type=_MERGE_PATCH)  # fmt: skip
            asked += 1
        self.log.info("checkpoint-now %s: annotated %d running pod(s) of %s", request, asked, name)
        return asked

    def _checkpoint_now_exec(self, name: str) -> int:
        """SIGUSR1 to the training processes of every running pod (``pods/exec``); returns how many
        were signalled. A pod where the exec fails is logged (with the command's stderr) and skipped."""
        from kubernetes.stream import stream
        from kubernetes.stream.ws_client import STDERR_CHANNEL, STDOUT_CHANNEL

        asked = 0
        for pod in self._pods(f"{LABEL_GROUP}={name}"):
            if pod["status"].get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
                continue
            pod_name = pod["metadata"]["name"]
            client = stream(
                self._core.connect_get_namespaced_pod_exec, pod_name, self.namespace,
                container=CONTAINER, command=["python", "-c", _SIGNAL_WORKERS, name],
                stdout=True, stderr=True, stdin=False, tty=False, _preload_content=False,
            )  # fmt: skip
            try:
                client.run_forever(timeout=30)
                stdout, stderr = client.read_channel(STDOUT_CHANNEL), client.read_channel(STDERR_CHANNEL)
                code = client.returncode
            finally:
                client.close()
            lines = stdout.strip().splitlines()
            if code != 0 or not lines or not lines[-1].isdigit():
                why = (stderr or stdout).strip()[-500:] or "no output"
                self.log.warning("checkpoint-now in pod %s/%s failed (exit code %s): %s", self.namespace,
                                 pod_name, code, why)  # fmt: skip
                continue
            asked += int(lines[-1])
        return asked
