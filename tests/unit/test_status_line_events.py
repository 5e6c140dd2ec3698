"""The status line and the session read a local group's events from its events files, a pod's from its
logs."""

import json
from unittest import mock

from airflow_dtrain.launchers.local import LocalLauncher
from airflow_dtrain.status_line import StatusLine, events_in, group_events, has_trained
from trainer.events import EventLog


def test_a_local_groups_events_come_from_its_files_each_once_whatever_its_log_says(tmp_path):
    launcher = LocalLauncher(tmp_path / "groups")
    log = EventLog(launcher.events_dir("job-r1"), rank=0, stdout=False)
    log.emit("resume", from_step=40, path="p")
    log.emit("train", step=42, tokens_per_s=1000.0)
    merged = ['[node0][rank0]:{"event": "train", "step": 99}[rank1]: noise']  # what group.log may hold
    events, cursor = group_events(launcher, "job-r1", merged, None)
    assert [e["event"] for e in events] == ["resume", "train"] and has_trained(events)
    status = StatusLine(steps=100, tokens_per_step=10)
    status.feed(merged, now=0.0, events=events)
    assert (status.step, status.checkpoint_step, status.tokens_per_s) == (42, 40, 1000.0)
    assert group_events(launcher, "job-r1", merged, json.loads(json.dumps(cursor))) == ([], cursor)
    log.emit("checkpoint", step=50)
    [event], _ = group_events(launcher, "job-r1", [], cursor)
    assert event == {"event": "checkpoint", "step": 50}


def test_a_backend_without_events_files_has_its_events_read_from_the_groups_output_lines():
    pod = mock.MagicMock()  # a Kubernetes launcher, or a test's mock: no events() of its own class
    lines = [
        '[node0][rank0]:{"event": "train", "step": 3}',
        "[node1][rank1]: hello",
        '{"event": "resume", "from',
    ]
    events, cursor = group_events(pod, "job-r0", lines, None)
    assert events == events_in(lines) == [{"event": "train", "step": 3}] and cursor is None
    assert has_trained(events) and not has_trained([{"event": "checkpoint", "step": 1}])
    pod.events.assert_not_called()
