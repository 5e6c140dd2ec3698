"""End to end, stopped and resumed: `python -m trainer.launch ... -m trainer` on CPU/gloo, two ranks against
one process, SIGTERM, SIGUSR1 and simulated preemptions, a non-finite loss and a hung rank.

Stopping and resuming changes nothing about the result: every run here is compared with ``uninterrupted``.
Split from test_trainer_train.py (a normal run and configuration errors stay there).
"""

import json
import os
import signal
import time

import pytest
import torch

from conftest import (
    FAST,
    load_checkpoint_tensors,
    read_json,
    run_and_signal,
    run_trainer,
    run_with_signals,
    sigterm,
    worker_pids,
)

# Steps of the 2-rank runs compared with each other: enough that a signal sent at step 2-3 lands well
# before the end, on a loaded machine too.
STEPS = 30


@pytest.fixture(scope="module")
def uninterrupted(data_dir, tmp_path_factory):
    """A 2-rank run of STEPS steps that nothing interrupts: the reference."""
    ckpt = tmp_path_factory.mktemp("uninterrupted")
    run = run_trainer([*FAST, "--steps", str(STEPS), "--checkpoint-uri", str(ckpt)], data_dir, nproc=2)
    assert run.returncode == 0, run
    return run, ckpt


# --------------------------------------------------------------------------- distributed


@pytest.mark.torchrun
def test_two_ranks_follow_the_same_loss_trajectory_as_one_process(uninterrupted, data_dir, tmp_path):
    two, _ = uninterrupted
    one = run_trainer([*FAST, "--steps", str(STEPS)], data_dir)
    assert one.returncode == 0, one
    assert one.losses().keys() == two.losses().keys() == set(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert one.losses()[step] == pytest.approx(two.losses()[step], rel=1e-3), step


@pytest.mark.torchrun
def test_sigterm_to_the_agent_exits_75_and_resuming_is_bitwise_identical(uninterrupted, data_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    args = [*FAST, "--steps", str(STEPS), "--checkpoint-uri", str(ckpt)]
    stopped = run_and_signal(args, data_dir, nproc=2, when_step=3, send=sigterm)

    assert stopped.returncode == 75, stopped
    assert "[trainer.launch] exit 75: agent received SIGTERM" in stopped.stderr
    [preempted] = stopped.of("preempted")
    s = preempted["step"]
    assert 3 <= s < STEPS and preempted["seconds_to_save"] < 110
    assert [(e["step"], e["reason"]) for e in stopped.of("checkpoint")] == [(s, "preemption")]
    manifest = read_json(ckpt / f"step-{s:08d}" / "manifest.json")
    assert manifest["step"] == s and manifest["world_size"] == 2
    progress = read_json(ckpt / "progress.json")
    assert (progress["status"], progress["step"], progress["attempt"]) == ("preempted", s, 1)

    launched = time.time()
    resumed = run_trainer(args, data_dir, nproc=2)
    assert resumed.returncode == 0, resumed
    assert resumed.of("resume") == [{"event": "resume", "from_step": s, "path": str(ckpt / f"step-{s:08d}")}]
    assert min(resumed.losses()) == s + 1
    # Where each attempt's start went, once its first step is done: the resumed one loaded a checkpoint.
    [fresh], [again] = stopped.of("startup"), resumed.of("startup")
    # (the fresh one's "load" is its look for a checkpoint: about 0, a millisecond on a busy machine)
    assert not stopped.of("resume") and fresh["step"] == 1 and again["step"] == s + 1
    assert fresh["load_s"] < again["load_s"]
    assert launched < again["started_at"] < time.time()
    phases = ("imports_s", "process_group_s", "build_s", "load_s", "first_step_s")
    assert sum(again[p] for p in phases) == pytest.approx(again["total_s"], abs=0.01), again
    assert f"[trainer] started in {again['total_s']:.1f} s: imports" in resumed.stderr
    startup_s = read_json(ckpt / "progress.json")["startup_s"]  # both attempts' starts, summed
    assert startup_s == pytest.approx(fresh["total_s"] + again["total_s"], abs=0.002)
    progress = read_json(ckpt / "progress.json")
    assert (
        progress["status"],
        progress["step"],
        progress["attempt"],
        progress["resumed_from_step"],
        progress["steps_lost"],
    ) == ("completed", STEPS, 2, s, 0)

    # The stop/resume is invisible in the result: weights and optimizer state are bitwise equal.
    _, reference_ckpt = uninterrupted
    ours = load_checkpoint_tensors(ckpt / f"step-{STEPS:08d}")
    theirs = load_checkpoint_tensors(reference_ckpt / f"step-{STEPS:08d}")
    weights = [k for k in theirs if k.startswith(("model.", "optim."))]
    assert len(weights) > 30 and weights == [k for k in ours if k.startswith(("model.", "optim."))]
    for k in weights:
        assert torch.equal(ours[k], theirs[k]), k
    assert resumed.losses()[STEPS] == uninterrupted[0].losses()[STEPS]


@pytest.mark.torchrun
def test_sigterm_to_one_rank_stops_all_ranks_at_the_same_step(uninterrupted, data_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    args = [*FAST, "--steps", str(STEPS), "--checkpoint-uri", str(ckpt)]
    stopped = run_and_signal(
        args,
        data_dir,
        nproc=2,
        when_step=2,
        send=lambda proc: os.kill(worker_pids(proc.pid)[1], signal.SIGTERM),
    )

    assert stopped.returncode == 75, stopped
    assert "every failed worker exited 75" in stopped.stderr
    s = stopped.of("preempted")[0]["step"]
    files = read_json(ckpt / f"step-{s:08d}" / "manifest.json")["files"]
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(files)  # both ranks saved the same step

    # A different world size resumes from it (DCP reshards) and ends where the 2-rank run ends.
    resumed = run_trainer(args, data_dir)
    assert resumed.returncode == 0, resumed
    assert resumed.of("resume")[0]["from_step"] == s
    assert resumed.losses()[STEPS] == pytest.approx(uninterrupted[0].losses()[STEPS], rel=1e-3)


@pytest.mark.torchrun
def test_one_process_trains_a_plain_module_whose_checkpoint_two_ranks_resume_and_back(
    uninterrupted, data_dir, tmp_path
):
    """One CPU process has nothing to shard: it trains the model without FSDP2, whose copies and hooks cost 8
    % of a step there (benchmarks/RESULTS.md), and saves plain tensors. A 2-rank group resumes that checkpoint
    as DTensors, one process resumes theirs, and the job ends where the uninterrupted 2-rank run ends."""
    ckpt = tmp_path / "ckpt"
    args = [*FAST, "--steps", str(STEPS), "--checkpoint-uri", str(ckpt)]
    one = run_trainer([*args, "--set", "simulate_preemption_at_step=8"], data_dir)
    assert one.returncode == 75 and one.of("checkpoint")[-1]["step"] == 8, one
    assert "one process on a CPU: the model is not wrapped with FSDP2" in one.stderr, one
    two = run_trainer([*args, "--set", "simulate_preemption_at_step=16"], data_dir, nproc=2)
    assert two.returncode == 75 and two.of("resume")[0]["from_step"] == 8, two
    assert {"__0_0.distcp", "__1_0.distcp"} <= set(
        read_json(ckpt / "step-00000016" / "manifest.json")["files"]
    )
    assert "not wrapped with FSDP2" not in two.stderr, two
    back = run_trainer(args, data_dir)
    assert back.returncode == 0 and back.of("resume")[0]["from_step"] == 16, back
    assert back.losses()[STEPS] == pytest.approx(uninterrupted[0].losses()[STEPS], rel=1e-3)


@pytest.mark.torchrun
def test_simulated_preemption_sends_sigterm_to_the_agent_once(data_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    args = [*FAST, "--steps", "6", "--checkpoint-uri", str(ckpt), "--set", "simulate_preemption_at_step=3"]
    first = run_trainer(args, data_dir, nproc=2)
    assert first.returncode == 75, first
    assert [(e["step"], e["reason"]) for e in first.of("checkpoint")] == [(3, "preemption")]
    assert max(first.losses()) == 3  # stopped right at step 3

    second = run_trainer(args, data_dir, nproc=2)
    assert second.returncode == 0, second  # resumed at step 3 >= 3: not preempted again
    assert second.of("preempted") == [] and second.of("resume")[0]["from_step"] == 3
    progress = read_json(ckpt / "progress.json")
    assert (progress["status"], progress["attempt"], progress["steps_lost"]) == ("completed", 2, 0)


# ---------------------------------------------------------------------- signals and failures, one process


def test_sigusr1_saves_and_carries_on_then_sigterm_exits_75_and_a_restart_resumes(data_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    # Enough steps that the run cannot end before the async checkpoint-now save commits and
    # is reported (on a loaded machine that took 38 debug steps once); SIGTERM ends it early.
    args = [*FAST, "--steps", "2000", "--checkpoint-uri", str(ckpt)]
    stopped = run_with_signals(
        args,
        data_dir,
        [
            (
                lambda e: e["event"] == "train" and e["step"] >= 2,
                lambda proc: proc.send_signal(signal.SIGUSR1),
            ),
            (lambda e: e["event"] == "checkpoint", sigterm),
        ],
    )
    assert stopped.returncode == 75, stopped
    [now, preemption] = stopped.of("checkpoint")
    assert now["reason"] == "checkpoint-now" and preemption["reason"] == "preemption"
    s = stopped.of("preempted")[0]["step"]
    assert now["step"] < s == preemption["step"] < 2000  # trained on after SIGUSR1, stopped after SIGTERM
    assert max(stopped.losses()) == s
    for step in (now["step"], s):
        assert (ckpt / f"step-{step:08d}" / "manifest.json").exists()
    progress = read_json(ckpt / "progress.json")
    assert (progress["status"], progress["step"], progress["latest_checkpoint"]) == (
        "preempted",
        s,
        str(ckpt / f"step-{s:08d}"),
    )

    # Pretend the attempt got 3 steps past its checkpoint before dying without saving.
    first_wall = progress["wall_time_s"]
    (ckpt / "progress.json").write_text(json.dumps({**progress, "step": s + 3, "status": "failed"}))
    resumed = run_trainer([*FAST, "--steps", str(s + 2), "--checkpoint-uri", str(ckpt)], data_dir)
    assert resumed.returncode == 0, resumed
    assert resumed.of("resume")[0]["from_step"] == s and sorted(resumed.losses()) == [s + 1, s + 2]
    progress = read_json(ckpt / "progress.json")
    assert (
        progress["status"],
        progress["attempt"],
        progress["steps_lost"],
        progress["resumed_from_step"],
    ) == ("completed", 2, 3, s)
    assert progress["wall_time_s"] > first_wall  # summed over both attempts


@pytest.mark.torchrun
def test_non_finite_loss_fails_naming_step_and_rank_and_launch_exits_1(data_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    run = run_trainer(
        [
            *FAST,
            "--steps",
            "5",
            "--checkpoint-uri",
            str(ckpt),
            "--set",
            "optim.lr=1e30",
            "--set",
            "optim.warmup_steps=0",
        ],
        data_dir,
        nproc=2,
    )
    assert run.returncode == 1, run
    assert "step 2, rank 0: non-finite loss" in run.stderr or "step 2, rank 1: non-finite loss" in run.stderr
    # The first failing rank exits 1; torchrun may SIGTERM the other before it does.
    assert "[trainer.launch] exit 1: workers failed with exit codes [" in run.stderr
    assert read_json(ckpt / "progress.json")["status"] == "failed"
    assert not list(ckpt.glob("step-*"))


@pytest.mark.torchrun
@pytest.mark.fault_trial  # slow fault injection: `make test-faults` (and .ci/run), not `make test`
def test_a_hung_rank_times_its_peers_out_and_the_node_exits_lost_then_resumes(data_dir, tmp_path):
    """A peer that stops answering (SIGSTOP: a hung process, a frozen node) makes the next collective
    time out after parallel.collective_timeout_s: the node exits 76 (lost, resumable from the last
    checkpoint) instead of 1, and the relaunch finishes."""
    ckpt = tmp_path / "ckpt"
    args = [*FAST, "--steps", "24", "--checkpoint-uri", str(ckpt), "--set", "checkpoint.every=2",
            "--set", "parallel.collective_timeout_s=5", "--set", "checkpoint.grace_period_s=5"]  # fmt: skip
    hung: list[int] = []

    def freeze(proc) -> None:
        hung.append(worker_pids(proc.pid)[1])
        os.kill(hung[0], signal.SIGSTOP)

    try:
        # A stopped worker cannot act on the agent's SIGTERM: the agent SIGKILLs it after its shutdown
        # timeout (trainer.launch's default: 120 s); keep that short here so a loaded machine stays in time.
        # Freeze only once a save has been reported committed: async saves commit a few steps after their
        # step, and on a loaded machine rank 1 was once frozen before step 2's save had committed.
        lost = run_with_signals(
            args,
            data_dir,
            [(lambda e: e["event"] == "checkpoint", freeze)],
            nproc=2,
            env={"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "10"},
        )
    finally:
        for pid in hung:  # never leave a stopped process behind
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert lost.returncode == 76, lost
    assert "[trainer] lost a peer, exit 76" in lost.stderr and "[trainer.launch] exit 76" in lost.stderr
    committed = sorted(int(p.name[5:]) for p in ckpt.glob("step-*") if (p / "manifest.json").exists())
    assert committed and committed[-1] >= 2

    resumed = run_trainer(args, data_dir, nproc=2)
    assert resumed.returncode == 0, resumed
    assert resumed.of("resume")[0]["from_step"] == committed[-1]
    assert read_json(ckpt / "progress.json")["status"] == "completed"
