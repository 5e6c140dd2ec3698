"""The interruption watch's decisions without any I/O: what is new, when the watch is over, its record;
and the instance source a trigger deferred before ``KubernetesGroupNodes`` moved still rebuilds."""

from __future__ import annotations

from airflow_dtrain.launchers.base import GroupState, GroupStatus
from airflow_dtrain.spot.events import DISRUPTION, SPOT_INTERRUPTION, InterruptionNotice
from airflow_dtrain.spot.interruptions import WatchState
from airflow_dtrain.spot.members import deserialize_source

WARNING = InterruptionNotice(kind=SPOT_INTERRUPTION, instance_id="i-0000000000000000a")
TAINT = InterruptionNotice(kind=DISRUPTION, instance_id=None, node_name="ip-10-0-0-1", source="node-taint")


def _status(name: str, state: GroupState) -> GroupStatus:
    return GroupStatus(name=name, state=state)


def test_a_single_shot_watch_ends_with_the_first_notice_and_its_record():
    state = WatchState()
    running = _status("g", GroupState.RUNNING)

    fresh = state.fresh("g", [WARNING])
    record = state.acted("g", running, fresh, asked=2)

    assert fresh == [WARNING]
    assert (
        record["interrupted"],
        record["group"],
        record["group_state"],
        record["checkpoint_requested"],
    ) == (True, "g", "running", 2)
    assert [n["instance_id"] for n in record["notices"]] == [WARNING.instance_id]


def test_a_single_shot_watch_ends_uninterrupted_with_the_group_but_waits_for_one_not_there_yet():
    state = WatchState()

    assert state.group_gone("g", _status("g", GroupState.NOT_FOUND)) is None
    assert state.group_gone("g", _status("g", GroupState.SUCCEEDED)) == {
        "interrupted": False,
        "group": "g",
        "group_state": "succeeded",
        "notices": [],
    }


def test_a_following_watch_acts_once_per_notice_across_relaunches_and_ends_with_all_of_them():
    state = WatchState(follow_relaunches_s=600)

    assert (
        state.acted("g-r0", _status("g-r0", GroupState.RUNNING), state.fresh("g-r0", [WARNING, TAINT]), 1)
        is None
    )
    assert state.fresh("g-r0", [TAINT]) == []  # a taint stays on the node: not acted on twice
    assert state.group_gone("g-r0", _status("g-r0", GroupState.PREEMPTED)) is None  # a relaunch may come
    assert state.fresh("g-r1", [TAINT]) == [TAINT]  # the relaunch is another group
    state.acted("g-r1", _status("g-r1", GroupState.RUNNING), [TAINT], 1)

    record = state.group_gone("g-r1", _status("g-r1", GroupState.SUCCEEDED))

    assert (record["interrupted"], record["group"], record["checkpoint_requested"]) == (True, "g-r1", 2)
    assert [(n["group"], n["kind"]) for n in record["notices"]] == [
        ("g-r0", SPOT_INTERRUPTION),
        ("g-r0", DISRUPTION),
        ("g-r1", DISRUPTION),
    ]


def test_a_following_watch_ends_when_no_relaunch_comes_in_time():
    state = WatchState(follow_relaunches_s=1e-9)

    record = state.group_gone("g-r0", _status("g-r0", GroupState.PREEMPTED))

    assert record == {"interrupted": False, "group": "g-r0", "group_state": "preempted", "notices": []}


def test_a_source_serialised_under_its_old_class_path_still_rebuilds():
    source = deserialize_source(
        "airflow_dtrain.spot.members.KubernetesGroupNodes",
        {"namespace": "train", "label_selector": "app={group}", "kubernetes_conn_id": "k8s"},
    )

    assert source.serialize() == (
        "airflow_dtrain.kubernetes.nodes.KubernetesGroupNodes",
        {"namespace": "train", "label_selector": "app={group}", "kubernetes_conn_id": "k8s"},
    )
