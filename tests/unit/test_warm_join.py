"""A node's warm-up before it joins (trainer/elastic/warm_join.py): the shapes it trains, what its agent says
when the
warm-up fails or a host ends, and that the agent never waits for a host that is gone. (A real join through
torchrun, compiled, with 0 graphs compiled in the group's round: tests/integration/test_elastic_local.py.)"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer.elastic import warm_join

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "global_batch, micro, rank, world, rows",
    [
        (8, 4, 0, 2, [4]),  # the even split: one micro-batch
        (8, 3, 1, 2, [3, 1]),  # a share cut into micro-batches, the last one short
        (7, 4, 0, 2, [3]),  # uneven shares (parallel.uneven_batch): rank 0 has 3, rank 1 has 4
        (7, 4, 1, 2, [4]),
        (12, 4, 5, 8, [2]),  # a world whose share is smaller than the micro-batch
    ],
)
def test_the_warm_up_trains_the_micro_batches_a_rank_of_the_full_world_trains(
    global_batch, micro, rank, world, rows
):
    assert warm_join.micro_batch_rows(global_batch, micro, rank, world) == rows
    # the union over the ranks is the global batch (trainer.data.loader's split), whatever the world
    assert (
        sum(sum(warm_join.micro_batch_rows(global_batch, micro, r, world)) for r in range(world))
        == global_batch
    )


def test_a_warm_up_that_fails_is_said_and_the_node_joins(tmp_path):
    warm_join.warm_up_and_tell(str(tmp_path), 0, 2, ["--set", "no-equals-sign"], free=lambda: None)
    outcome = json.loads((tmp_path / "0.warm").read_text())
    assert "ConfigError" in outcome["not_warmed"] and "no-equals-sign" in outcome["not_warmed"]
    said = warm_join.wait_for_the_hosts(str(tmp_path), 1, ended=lambda: False, timeout_s=5)
    assert said.startswith("joins without warming up (ConfigError: --set: expected dotted.key=value")


def test_a_bad_flag_is_said_too_not_a_host_that_exits(tmp_path):
    """argparse exits (SystemExit): the host must still tell its agent, or the agent would wait its bound."""
    warm_join.warm_up_and_tell(str(tmp_path), 0, 2, ["--no-such-flag"], free=lambda: None)
    assert json.loads((tmp_path / "0.warm").read_text())["not_warmed"] == "SystemExit: 2"


def test_the_agent_does_not_wait_for_a_host_that_ended(tmp_path):
    (tmp_path / "0.warm").write_text(json.dumps({"warm_s": 0.1, "took_s": 1.0}))  # local rank 1 never says
    said = warm_join.wait_for_the_hosts(str(tmp_path), 2, ended=lambda: True, timeout_s=600)
    assert said == "joins without warming up: a training process ended while it warmed up"


def test_the_agent_waits_at_most_its_bound(tmp_path):
    said = warm_join.wait_for_the_hosts(str(tmp_path), 1, ended=lambda: False, timeout_s=0.2)
    assert said == "joins before its training processes have warmed up (waited 0 s)"


def test_warmed_hosts_are_said_with_their_step(tmp_path):
    for rank, step in ((0, 0.25), (1, 0.5)):
        (tmp_path / f"{rank}.warm").write_text(json.dumps({"warm_s": step, "took_s": 2.0}))
    said = warm_join.wait_for_the_hosts(str(tmp_path), 2, ended=lambda: False)
    assert said.startswith("its training processes built the model and ran a step in a world of their own")
    assert "one step 0.50 s" in said


def test_off_with_the_environment(monkeypatch):
    monkeypatch.setenv(warm_join.WARM_ENV, "0")
    assert not warm_join.enabled()
    monkeypatch.delenv(warm_join.WARM_ENV)
    assert warm_join.enabled()


def test_a_node_preempted_while_it_warms_up_exits_as_preempted(tmp_path):
    """A spot reclaim before the node joined: exit 75 (its group absorbs it), said, not killed by SIGTERM."""
    waiting = subprocess.Popen(
        [sys.executable, "-c", "import sys; from trainer.elastic import warm_join; "
         f"warm_join.wait_for_the_hosts({str(tmp_path)!r}, 1, ended=lambda: False); print('joined')"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    time.sleep(1.0)  # it waits: no host has said anything
    assert waiting.poll() is None
    waiting.send_signal(signal.SIGTERM)
    out, _ = waiting.communicate(timeout=30)
    assert waiting.returncode == 75, out
    assert "exit 75: SIGTERM while this node warmed up, before it joined: nothing to save" in out
    assert "joined" not in out.replace("before it joined", "")
