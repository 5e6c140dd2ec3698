"""Checkpoint-now without pods/exec: the node's agent (python -m trainer.launch, real torchrun) follows the
pod's annotations file, as the kubelet writes it from a downward-API volume, and sends each new request to
its workers as SIGUSR1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from trainer.elastic.checkpoint_requests import CHECKPOINT_NOW_ANNOTATION, read_annotation

pytestmark = pytest.mark.torchrun

WORKER = """
import os, pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1]) / f"rank{os.environ['RANK']}"
out.write_text("0")
signal.signal(signal.SIGUSR1, lambda *_: out.write_text(str(int(out.read_text()) + 1)))
done = pathlib.Path(sys.argv[1]) / "done"
deadline = time.monotonic() + 90
while not done.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def write_annotations(path: Path, annotations: dict[str, str]) -> None:
    """As the kubelet does: the whole file replaced at once (it swaps a symlink), key="value" lines."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(f"{k}={json.dumps(v)}" for k, v in sorted(annotations.items())))
    os.replace(tmp, path)


def _wait(predicate, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_new_annotation_value_reaches_every_worker_once(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    annotations = tmp_path / "annotations"
    # an old request (set before this pod's agent started) is not acted on
    write_annotations(
        annotations, {"batch.kubernetes.io/job-completion-index": "0", CHECKPOINT_NOW_ANNOTATION: "1"}
    )
    env = {**os.environ, "DTRAIN_REQUESTS_FILE": str(annotations), "PYTHONPATH": str(REPO)}
    agent = subprocess.Popen(
        [sys.executable, "-m", "trainer.launch", "--standalone", "--nproc-per-node", "2", str(worker),
         str(tmp_path)],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    counts = lambda: [(tmp_path / f"rank{r}").read_text() if (tmp_path / f"rank{r}").exists() else None  # noqa: E731
                      for r in (0, 1)]  # fmt: skip
    try:
        _wait(lambda: counts() == ["0", "0"], "both workers to start")
        time.sleep(2)  # the watch has read the old value by now
        assert counts() == ["0", "0"]
        write_annotations(annotations, {"batch.kubernetes.io/job-completion-index": "0",
                                        CHECKPOINT_NOW_ANNOTATION: "2"})  # fmt: skip
        _wait(lambda: counts() == ["1", "1"], "the request to reach both workers")
        time.sleep(2)
        assert counts() == ["1", "1"]  # once per request, not once per look
        write_annotations(annotations, {CHECKPOINT_NOW_ANNOTATION: "3"})
        _wait(lambda: counts() == ["2", "2"], "the second request")
    finally:
        (tmp_path / "done").write_text("")
        _, stderr = agent.communicate(timeout=60)
    assert agent.returncode == 0, stderr
    assert "checkpoint-now request 2: SIGUSR1 to 2 worker(s)" in stderr


def test_the_annotations_file_is_read_as_the_kubelet_writes_it(tmp_path):
    path = tmp_path / "annotations"
    write_annotations(path, {CHECKPOINT_NOW_ANNOTATION: "1732400000123", "other": 'a "quoted" value'})
    assert read_annotation(str(path), CHECKPOINT_NOW_ANNOTATION) == "1732400000123"
    assert read_annotation(str(path), "other") == 'a "quoted" value'
    assert read_annotation(str(path), "missing") is None
    assert read_annotation(str(tmp_path / "absent"), CHECKPOINT_NOW_ANNOTATION) is None
