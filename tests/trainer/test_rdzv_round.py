"""An elastic group's resize round closes once every survivor is back (trainer/elastic/rdzv_round.py), on
torch's own
rendezvous state and join: not at the first round, not with a survivor still in the wait list, not before
the platform's capacity is in, and torch's last call where it says so."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from torch.distributed.elastic.rendezvous import dynamic_rendezvous
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    RendezvousSettings,
    RendezvousTimeout,
    _Action,
    _NodeDesc,
    _RendezvousContext,
    _RendezvousJoinOp,
    _RendezvousState,
)

from trainer import torch_private

from trainer.elastic import rdzv_round

LAST_CALL = timedelta(seconds=600)
NOW = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc)
A, B, C = (_NodeDesc("10.0.0.1", 100 + i, 0) for i in range(3))


def _settings(min_nodes: int = 1, max_nodes: int = 3) -> RendezvousSettings:
    return RendezvousSettings(
        "job", min_nodes, max_nodes, RendezvousTimeout(last_call=LAST_CALL), timedelta(seconds=5), 3
    )


def _round(participants, wait_list=(), round_no: int = 1, quorum_s_ago: float = 2.0) -> _RendezvousState:
    """An open round: ``participants`` in it, ``wait_list`` waiting, min_nodes in ``quorum_s_ago`` seconds
    ago (torch sets its deadline to that plus the last call)."""
    state = _RendezvousState()
    state.round, state.participants = round_no, dict.fromkeys(participants, 0)
    state.wait_list = set(wait_list)
    state.deadline = NOW - timedelta(seconds=quorum_s_ago) + LAST_CALL
    for node in (*participants, *wait_list):
        state.last_heartbeats[node] = NOW
    return state


def test_a_resize_round_with_every_survivor_in_closes_without_its_last_call():
    # node C was lost: A and B, the survivors, are both in; nothing says more nodes are coming
    assert rdzv_round.all_are_in(_round([A, B]), _settings(), A, NOW, expected=0)


@pytest.mark.parametrize(
    ("state", "min_nodes", "expected", "why"),
    [
        (_round([A, B], round_no=0), 1, 0, "the group's launch: nodes start at different times"),
        (_round([A], wait_list=[B]), 1, 0, "survivor B has not joined the round yet"),
        (_round([A, B], quorum_s_ago=0.1), 1, 0, "within the grace"),
        (_round([A, B]), 1, 3, "the platform runs 3: the replacement starts at once"),
        (_round([A]), 2, 0, "fewer than min_nodes"),
    ],
    ids=["first-round", "wait-list", "grace", "capacity", "min-nodes"],
)
def test_a_round_waits_its_last_call(state, min_nodes, expected, why):
    assert not rdzv_round.all_are_in(state, _settings(min_nodes), A, NOW, expected), why


def test_the_capacity_file_says_how_many_a_round_awaits(tmp_path):
    capacity = tmp_path / "capacity.json"
    env = {rdzv_round.CAPACITY_FILE_ENV: str(capacity)}
    assert rdzv_round.expected_nodes(3, env) == 3  # a local group with no capacity written: all of it
    capacity.write_text(json.dumps({"nodes": 1}))
    assert rdzv_round.expected_nodes(3, env) == 1
    capacity.write_text(json.dumps({"nodes": 8}))
    assert rdzv_round.expected_nodes(3, env) == 3  # never more than max_nodes
    assert rdzv_round.expected_nodes(3, {}) == 0  # Kubernetes: none awaited


def test_the_patched_join_marks_the_round_complete_and_torchs_rule_stays_on_request(monkeypatch):
    monkeypatch.setattr(_RendezvousJoinOp, "__call__", _RendezvousJoinOp.__call__)  # undone after the test
    monkeypatch.setattr(dynamic_rendezvous, "_delay", dynamic_rendezvous._delay)
    state = _round([A, B], quorum_s_ago=5.0)
    state.deadline = datetime.now(timezone.utc) - timedelta(seconds=5) + LAST_CALL
    ctx = _RendezvousContext(A, state, _settings())
    far = 1e12  # the operation's own deadline (monotonic): not reached
    before = _RendezvousJoinOp()(ctx, far)
    assert before in (_Action.KEEP_ALIVE, _Action.SYNC)  # torch waits its last call

    assert not rdzv_round.close_the_round_once_all_are_in({torch_private.OFF_ENV: "rdzv_close_round"})
    assert _RendezvousJoinOp()(ctx, far) == before

    assert rdzv_round.close_the_round_once_all_are_in({})
    assert _RendezvousJoinOp()(ctx, far) == _Action.MARK_RENDEZVOUS_COMPLETE
    assert rdzv_round.close_the_round_once_all_are_in({})  # patched twice: wraps torch's join, not itself
    assert _RendezvousJoinOp.__call__.__wrapped__.__module__.startswith("torch.")


def test_a_torch_whose_round_state_differs_keeps_its_own_rule_and_says_so(monkeypatch, capsys):
    """Best effort on torch's private state: a state without what the check reads (a later torch) leaves the
    round to torch's last call, said once on stderr, instead of failing the agent's rendezvous."""
    monkeypatch.setattr(_RendezvousJoinOp, "__call__", _RendezvousJoinOp.__call__)  # undone after the test
    monkeypatch.setattr(dynamic_rendezvous, "_delay", dynamic_rendezvous._delay)
    monkeypatch.setattr(torch_private, "_taken", {})  # this process's fallbacks, and those it said
    monkeypatch.setattr(torch_private, "_said", set())
    state = _round([A, B], quorum_s_ago=5.0)
    state.deadline = datetime.now(timezone.utc) - timedelta(seconds=5) + LAST_CALL
    ctx = _RendezvousContext(A, state, _settings())
    before = _RendezvousJoinOp()(ctx, 1e12)
    assert rdzv_round.close_the_round_once_all_are_in({})
    monkeypatch.delattr(_RendezvousState, "wait_list", raising=False)
    del state.wait_list  # what a torch that renamed it would hand the patched join
    assert _RendezvousJoinOp()(ctx, 1e12) == before
    assert _RendezvousJoinOp()(ctx, 1e12) == before
    assert capsys.readouterr().err.count("rendezvous rounds wait their last call (replace_timeout_s)") == 1
    # said on the trainer's first line and in summary.json from then on (trainer/torch_private)
    assert "AttributeError" in torch_private.fallbacks_in_force({})["rdzv_close_round"]


def test_a_resize_round_is_polled_ten_times_a_second_and_the_launch_as_torch_polls(monkeypatch):
    """Between two polls of a round's state torch's executor sleeps 1 s (``_delay(seconds=1)``): a resize
    round's survivors would see it close up to a second late, each at its own time. Patched, a resize round
    waits RESIZE_POLL_S; the group's launch (round 0) and torch's other delays are left as they were."""
    slept: list = []
    monkeypatch.setattr(_RendezvousJoinOp, "__call__", _RendezvousJoinOp.__call__)
    monkeypatch.setattr(dynamic_rendezvous, "_delay", slept.append)  # torch's delay, recorded
    assert rdzv_round.close_the_round_once_all_are_in({})
    far = 1e12
    for round_no in (0, 1):
        state = _round([A], wait_list=[B], round_no=round_no)  # B not in yet: A polls again
        now = datetime.now(timezone.utc)
        state.deadline, state.last_heartbeats = now + LAST_CALL, {A: now, B: now}
        assert _RendezvousJoinOp()(_RendezvousContext(A, state, _settings()), far) == _Action.SYNC
        dynamic_rendezvous._delay(seconds=1)  # as the executor does after a SYNC
        dynamic_rendezvous._delay(seconds=(0, 0.3))  # the first round's random skew: not a poll
    assert slept == [1, (0, 0.3), rdzv_round.RESIZE_POLL_S, (0, 0.3)]
    assert rdzv_round.RESIZE_POLL_S <= 0.1 < rdzv_round.REJOIN_GRACE_S

    slept.clear()  # $DTRAIN_RDZV_POLL_S sets it; patched again, it wraps torch's delay, not itself
    assert rdzv_round.close_the_round_once_all_are_in({rdzv_round.POLL_ENV: "0.5"})
    dynamic_rendezvous._delay(seconds=1)
    assert slept == [0.5]


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan"])
def test_a_poll_interval_that_is_not_seconds_polls_as_the_default_and_says_so(value, capsys):
    assert rdzv_round._poll_s(value) == rdzv_round.RESIZE_POLL_S  # never a busy loop or a crashed agent
    assert f"DTRAIN_RDZV_POLL_S={value!r} is not seconds > 0" in capsys.readouterr().err
