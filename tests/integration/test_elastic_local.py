"""An elastic local group (min_nodes < num_nodes) goes on without a lost node and takes its replacement in:
real torchrun agents re-rendezvous over c10d on 127.0.0.1, the trainer resumes at the new world size."""

from __future__ import annotations

import json
import os
import re
import signal
from collections import defaultdict
from pathlib import Path

import pytest

from airflow_dtrain.launchers.base import GroupState
from airflow_dtrain.launchers.local import LocalLauncher
from airflow_dtrain.job.spec import JobSpec
from tests.conftest import STEP_SLEEP_ENV, slow_steps_env
from tests.integration.helpers import SMALL, group_events, node_pids, wait_for, wait_for_step, wait_terminal
from trainer.data.loader import TRACE_SAMPLES_ENV
from trainer.testing.faults import HOLD_ENV
from trainer.torch_private import OFF_ENV

pytestmark = pytest.mark.torchrun

STEPS = 16
LOSS_RTOL = 1e-4
"""How far a step's loss after a resize may be from the uninterrupted run's (relative): measured up to ~2e-6
on this CPU (gloo, float32); docs/checkpoints.md, "Elastic groups", says why it is not bitwise."""


def _spec(tmp_path: Path, name: str, **overrides) -> JobSpec:
    arguments = {
        **SMALL,
        "log_every": 1,  # every step's loss
        "num_nodes": 2,
        "procs_per_node": 1,
        "steps": STEPS,
        "checkpoint_uri": str(tmp_path / name / "ckpt"),
        "min_nodes": 1,
        "replace_timeout_s": 2,
        **overrides,
    }
    return JobSpec.from_arguments(**arguments)


def _samples_by_step(state_dir: Path, name: str) -> dict[int, list[int]]:
    """Each step's sequences over every rank that trained it (a step trained twice shows them twice)."""
    steps: dict[int, list[int]] = defaultdict(list)
    for event in group_events(state_dir, name, "samples"):
        steps[event["step"]] += event["samples"]
    return {step: sorted(samples) for step, samples in steps.items()}


def _losses(state_dir: Path, name: str) -> dict[int, float]:
    losses: dict[int, float] = {}
    for event in group_events(state_dir, name, "train"):
        assert event["step"] not in losses, f"step {event['step']} was trained twice"
        losses[event["step"]] = event["loss"]
    return losses


def _trained_at(state_dir: Path, name: str) -> list[tuple[int, int]]:
    """(step it started at, nodes) of every attempt of the group's workers ("world" events)."""
    return [(e["step"], e["nodes"]) for e in group_events(state_dir, name, "world")]


def _started_at_one_node(launcher: LocalLauncher, name: str) -> int | None:
    """The step a running group's workers started training at 1 node from, None until then."""
    events, _ = launcher.events(name)
    return next((e["step"] for e in events if e["event"] == "world" and e["nodes"] == 1), None)


def _training_pids(state_dir: Path, name: str, node: int) -> list[int]:
    """The pid of the process that joined each process group on ``node`` (its ``[trainer] rank`` lines)."""
    lines = (state_dir / name / "group.log").read_text().splitlines()
    return [
        int(m[1])
        for line in lines
        if (m := re.match(rf"\[node{node}\](?:\[rank\d+\]:)?\[trainer\] rank .*, pid (\d+)\)", line))
    ]


def _lose_node(launcher: LocalLauncher, state_dir: Path, name: str, lost: int = 1) -> int:
    """SIGTERM to node ``lost``'s agent only (a spot reclaim of that node); returns its peer's agent pid."""
    pids = node_pids(state_dir, name)
    os.kill(pids[lost], signal.SIGTERM)
    return pids[1 - lost]


def _reference(tmp_path: Path, monkeypatch) -> tuple[dict[int, float], dict[int, list[int]]]:
    """An uninterrupted 2-node run of the same job: its loss and sequences per step."""
    monkeypatch.delenv(STEP_SLEEP_ENV)  # nothing to catch in flight: full speed
    launcher = LocalLauncher(tmp_path / "groups")
    launcher.launch("reference-r0", _spec(tmp_path, "reference", min_nodes=None))
    assert wait_terminal(launcher, "reference-r0").state == GroupState.SUCCEEDED
    return _losses(tmp_path / "groups", "reference-r0"), _samples_by_step(tmp_path / "groups", "reference-r0")


@pytest.mark.parametrize("hooks", ["in-force", "all-off"])
def test_two_nodes_down_to_one_and_back_keep_the_data_order_and_the_loss(tmp_path, monkeypatch, hooks):
    """``all-off``: every private torch hook takes its fallback (trainer/torch_private/), as if torch had
    changed: the same tokens, data order and loss; only the resize may take longer."""
    off = hooks == "all-off"
    if off:
        monkeypatch.setenv(OFF_ENV, "all")
    monkeypatch.setenv(TRACE_SAMPLES_ENV, "1")
    slow_steps_env(monkeypatch)  # a window to take a node away in
    state_dir, launcher = tmp_path / "groups", LocalLauncher(tmp_path / "groups", peer_exit_grace_s=5)
    # 3 steps at 1 node, then it waits for the node that joins (it would otherwise end first, the join being
    # whenever that node is ready: trainer/elastic/warm_join.py)
    monkeypatch.setenv(HOLD_ENV, "1:3")
    # a last call of 10 minutes: the survivor goes on once it is back (trainer/elastic/rdzv_round.py), not
    # then;
    # with the hooks off, torch's rule: the round closes at its last call
    launcher.launch("resize-r0", _spec(tmp_path, "resize", replace_timeout_s=5 if off else 600))
    wait_for_step(tmp_path / "resize" / "ckpt", 3)
    launcher.set_capacity("resize-r0", 1)  # no spot node to replace it with
    _lose_node(launcher, state_dir, "resize-r0")
    at_one = wait_for(lambda: _started_at_one_node(launcher, "resize-r0"), 120, "training at 1 node")
    wait_for_step(tmp_path / "resize" / "ckpt", at_one + 2)  # some steps at 1 node (the 3rd held)
    launcher.set_capacity("resize-r0", 2)  # capacity is back: the replacement joins
    status = wait_terminal(launcher, "resize-r0")
    assert status.state == GroupState.SUCCEEDED, status

    attempts = _trained_at(state_dir, "resize-r0")
    assert [n for _, n in attempts] == [2, 1, 2], attempts
    assert attempts[2][0] >= at_one + 2, attempts  # trained at 1 node in between
    assert [n for _, n in launcher.node_changes("resize-r0")] == [2, 1, 2]
    # node 0's training process trained all three worlds: its host outlived both resizes
    # (trainer/elastic/worker_host.py); with the hooks off, a new process each world
    assert len(_training_pids(state_dir, "resize-r0", node=0)) == 3
    assert len(set(_training_pids(state_dir, "resize-r0", node=0))) == (3 if off else 1)
    log = (state_dir / "resize-r0" / "group.log").read_text()
    said = re.findall(r"\[trainer\] torch \S+ \(tested [^)]*\): (.*)", log)  # rank 0's, each world
    assert said, "the trainer's start-up line names torch"
    if off:
        assert all("fallbacks in force: rdzv_close_round: rendezvous rounds wait" in line for line in said), (
            said
        )
    else:
        assert set(said) == {"every private torch hook in force"}, said
    done = group_events(state_dir, "resize-r0", "done")
    assert done[-1]["tokens_seen"] == STEPS * SMALL["global_batch_size"] * SMALL["seq_len"]

    losses, samples = _losses(state_dir, "resize-r0"), _samples_by_step(state_dir, "resize-r0")
    reference_losses, reference_samples = _reference(tmp_path, monkeypatch)
    # every step's global batch is the uninterrupted run's: no sample repeated or skipped, at 2 nodes or 1
    assert samples == reference_samples and sorted(samples) == list(range(1, STEPS + 1))
    assert sorted(losses) == sorted(reference_losses) == list(range(1, STEPS + 1))
    drift = {s: abs(losses[s] - reference_losses[s]) / abs(reference_losses[s]) for s in losses}
    print(f"largest relative loss difference: {max(drift.values()):.2e} (step {max(drift, key=drift.get)})")
    assert max(drift.values()) <= LOSS_RTOL, drift
    # before the first resize the world is the reference's: bitwise
    assert all(losses[s] == reference_losses[s] for s in range(1, attempts[1][0] + 1))


@pytest.mark.parametrize("lost", [1, 0], ids=["node-1", "node-0"])
def test_one_of_two_nodes_preempted_is_replaced_and_its_peer_trains_on(tmp_path, monkeypatch, lost):
    """Node 0 too: the group's rendezvous store is a process of its own, not node 0's agent."""
    monkeypatch.setenv(TRACE_SAMPLES_ENV, "1")
    slow_steps_env(monkeypatch)
    state_dir, launcher = tmp_path / "groups", LocalLauncher(tmp_path / "groups", peer_exit_grace_s=5)
    monkeypatch.setenv(HOLD_ENV, "1:2")  # at 1 node, 2 steps, then it waits for its replacement to join
    launcher.launch("replace-r0", _spec(tmp_path, "replace", steps=10))
    wait_for_step(tmp_path / "replace" / "ckpt", 3)
    peer = _lose_node(launcher, state_dir, "replace-r0", lost)  # capacity stays 2: replaced at once

    status = wait_terminal(launcher, "replace-r0")
    assert status.state == GroupState.SUCCEEDED, status
    result = json.loads((state_dir / "replace-r0" / "result.json").read_text())
    assert result["replacements"] == 1, result
    assert node_pids(state_dir, "replace-r0")[1 - lost] == peer  # the peer's agent was never relaunched
    kept = _training_pids(state_dir, "replace-r0", node=1 - lost)  # nor its training process, in any world
    assert len(kept) >= 2 and len(set(kept)) == 1, kept
    ups = [b for a, b in zip(launcher.node_changes("replace-r0"), launcher.node_changes("replace-r0")[1:])
           if b[1] > a[1]]  # fmt: skip
    assert len(ups) == 1, launcher.node_changes("replace-r0")
    # the peer went on alone while the replacement warmed up (trainer/elastic/warm_join.py), then took it in
    assert [n for _, n in _trained_at(state_dir, "replace-r0")] == [2, 1, 2]
    joined = (state_dir / "replace-r0" / "group.log").read_text()
    assert f"[node{lost}][trainer.launch] this node its training processes built the model" in joined
    # 0 steps lost: the resume starts at the step the preemption saved, and rank 0 trained each step once
    saved = [e["step"] for e in group_events(state_dir, "replace-r0", "preempted")]
    resumed = [e["from_step"] for e in group_events(state_dir, "replace-r0", "resume")]
    assert resumed == saved and saved, (saved, resumed)
    steps = [e["step"] for e in group_events(state_dir, "replace-r0", "samples") if e["rank"] == 0]
    assert steps == list(range(1, 11)), steps


def test_one_of_two_nodes_preempted_with_every_private_torch_hook_off(tmp_path, monkeypatch):
    """As if torch had changed (trainer/torch_private/): the peer waits for the preempted node's heartbeats
    and restarts its training process, the replacement compiles after it joins; the steps are the same, none
    lost, every sequence trained once."""
    monkeypatch.setenv(OFF_ENV, "all")
    monkeypatch.setenv(TRACE_SAMPLES_ENV, "1")
    slow_steps_env(monkeypatch)
    state_dir, launcher = tmp_path / "groups", LocalLauncher(tmp_path / "groups", peer_exit_grace_s=5)
    monkeypatch.setenv(HOLD_ENV, "1:2")
    launcher.launch("replace-r0", _spec(tmp_path, "replace", steps=10))
    wait_for_step(tmp_path / "replace" / "ckpt", 3)
    peer = _lose_node(launcher, state_dir, "replace-r0", 1)

    status = wait_terminal(launcher, "replace-r0")
    assert status.state == GroupState.SUCCEEDED, status
    assert node_pids(state_dir, "replace-r0")[0] == peer  # the peer's agent was never relaunched
    kept = _training_pids(state_dir, "replace-r0", node=0)
    assert len(kept) >= 2 and len(set(kept)) == len(kept), kept  # a new training process each world
    log = (state_dir / "replace-r0" / "group.log").read_text()
    assert "built the model" not in log  # no warm-up: the fake process group is a private name
    assert "rdzv_leave_on_signal forced off" in log and "agent_restarts_only_resumable forced off" in log
    saved = [e["step"] for e in group_events(state_dir, "replace-r0", "preempted")]
    resumed = [e["from_step"] for e in group_events(state_dir, "replace-r0", "resume")]
    assert resumed == saved and saved, (saved, resumed)
    steps = [e["step"] for e in group_events(state_dir, "replace-r0", "samples") if e["rank"] == 0]
    assert steps == list(range(1, 11)), steps
    by_step = _samples_by_step(state_dir, "replace-r0")
    assert sorted(by_step) == list(range(1, 11)), by_step  # each step trained once, its whole batch
    assert all(len(seqs) == SMALL["global_batch_size"] for seqs in by_step.values()), by_step
    every = sum(by_step.values(), [])
    assert len(set(every)) == len(every), "a sequence trained twice"


def test_a_node_that_joins_compiles_before_it_joins(tmp_path, monkeypatch):
    """parallel.compile: a node joining a group that trains at 1 node first builds the model and compiles in a
    world of its own (trainer/elastic/warm_join.py), so the group's first step at 2 nodes compiles no graph
    on any
    rank: the survivor waits for the rendezvous and the load, not for the newcomer's compile."""
    monkeypatch.setenv(HOLD_ENV, "1:2")  # at 1 node, 2 steps, then it waits for the node that joins
    slow_steps_env(monkeypatch)
    state_dir, launcher = tmp_path / "groups", LocalLauncher(tmp_path / "groups", peer_exit_grace_s=5)
    launcher.launch("join-r0", _spec(tmp_path, "join", steps=10, config={"parallel": {"compile": True}}))
    wait_for_step(tmp_path / "join" / "ckpt", 3)
    launcher.set_capacity("join-r0", 1)
    _lose_node(launcher, state_dir, "join-r0")
    wait_for(lambda: _started_at_one_node(launcher, "join-r0"), 120, "training at 1 node")
    launcher.set_capacity("join-r0", 2)  # a node joins: its replacement warms up, then meets the survivor
    status = wait_terminal(launcher, "join-r0")
    assert status.state == GroupState.SUCCEEDED, status

    assert [n for _, n in _trained_at(state_dir, "join-r0")] == [2, 1, 2]
    joined = group_events(state_dir, "join-r0", "startup")[-1]  # the first step at 2 nodes, after the join
    assert joined["graphs_compiled"] == 0, joined
