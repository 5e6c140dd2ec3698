"""End to end: `python -m trainer` and `python -m trainer.launch ... -m trainer` as real processes on CPU/gloo.

What a user (or the Airflow operator) sees: exit codes, the JSON event lines, progress.json,
committed checkpoints, and that stopping and resuming changes nothing about the result.
"""

import contextlib
import xxhash
import json
import math
import os
import signal
import socket
import subprocess
import sys

import pytest
import torch

from trainer.metrics import TRAINING_METRICS
from trainer.statsd import RUN_TAGS, parse_line
from conftest import (
    FAST,
    REPO,
    load_checkpoint_tensors,
    read_json,
    run_and_signal,
    run_trainer,
    run_with_signals,
    sigterm,
    trainer_env,
    worker_pids,
)

STEPS = 30  # of the 2-rank runs compared with each other (enough that a signal sent at step 2-3 lands well before the end, on a loaded machine too)


@pytest.fixture(scope="module")
def uninterrupted(data_dir, tmp_path_factory):
    """A 2-rank run of STEPS steps that nothing interrupts: the reference."""
    ckpt = tmp_path_factory.mktemp("uninterrupted")
    run = run_trainer([*FAST, "--steps", str(STEPS), "--checkpoint-uri", str(ckpt)], data_dir, nproc=2)
    assert run.returncode == 0, run
    return run, ckpt


# --------------------------------------------------------------------------- configuration errors


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["--flavor", "tiny"], {}, "model.flavor: unknown flavour 'tiny'"),
        (["--set", "optim.lrr=1"], {}, "optim.lrr: unknown key"),
        (["--set", "optim.lr=-1"], {}, "optim.lr: must be > 0, got -1.0"),
        (["--checkpoint-uri", "ftp://host/x"], {}, "checkpoint.uri"),
        (["--checkpoint-uri", "s3://x/run"], {}, "checkpoint.uri: s3 URI needs a valid bucket"),
        (
            ["--set", "micro_batch_size=4"],
            {"WORLD_SIZE": "3"},
            "global_batch_size 8 is not divisible by world size 3 × micro_batch_size 4",
        ),
        (["--set", "data.dataset=/no/such/dir"], {}, "data.dataset: '/no/such/dir' is not"),
    ],
)
def test_bad_config_exits_2_naming_the_field_before_training(args, env, message, data_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    p = subprocess.run(
        [sys.executable, "-m", "trainer", *args, "--steps", "3"]
        + ([] if "--checkpoint-uri" in args else ["--checkpoint-uri", str(ckpt)]),
        cwd=REPO,
        env={**trainer_env(data_dir), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert message in p.stderr
    assert not ckpt.exists()  # nothing trained, nothing written
    assert p.stdout == ""


# --------------------------------------------------------------------------- a normal run


def test_run_completes_with_events_progress_committed_checkpoints_and_statsd(data_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    statsd = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # a real UDP listener standing in for statsd
    statsd.bind(("127.0.0.1", 0))
    run = run_trainer(
        [
            *FAST,
            "--steps",
            "6",
            "--checkpoint-uri",
            f"file://{ckpt}",
            "--checkpoint-every",
            "2",
            "--set",
            "checkpoint.keep=2",
            "--set",
            "metrics.statsd_host=127.0.0.1",
            "--set",
            f"metrics.statsd_port={statsd.getsockname()[1]}",
            "--set",
            "metrics.statsd_tags=dag_id:d,run_id:manual__2026-01-01T00:00:00+00:00,job:j",
        ],
        data_dir,
    )
    assert run.returncode == 0, run
    assert all(line.startswith("{") for line in run.stdout.splitlines())  # stdout is pure JSON lines
    # the events come from the run's events file; stdout echoes each of them, line for line
    assert [json.loads(line) for line in run.stdout.splitlines()] == run.events
    assert [e["step"] for e in run.of("train")] == [1, 2, 3, 4, 5, 6]
    first = run.of("train")[0]
    assert set(first) == {"event", "step", "loss", "grad_norm", "lr", "tokens_per_s", "mfu", "peak_mem_mb"}
    assert first["loss"] == pytest.approx(math.log(256), abs=0.3)  # starts near uniform over bytes
    assert [(e["step"], e["reason"]) for e in run.of("checkpoint")] == [
        (2, "interval"),
        (4, "interval"),
        (6, "final"),
    ]
    [done] = run.of("done")
    assert (done["step"], done["tokens_seen"]) == (6, 6 * 8 * 32)
    assert done["loss"] == pytest.approx(run.of("train")[-1]["loss"], abs=1e-5)

    # Retention keeps the last 2; each has a manifest whose hashes match the files.
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "lease",
        "progress.json",
        "spend",
        "step-00000004",
        "step-00000006",
    ]
    manifest = read_json(ckpt / "step-00000006" / "manifest.json")
    assert {k: manifest[k] for k in ("step", "world_size", "flavor", "tokens_seen", "job", "lease")} == {
        "step": 6,
        "world_size": 1,
        "flavor": "debug",
        "tokens_seen": 6 * 8 * 32,
        "job": "",
        "lease": 1,
    }
    assert len(manifest["config_hash"]) == 64 and manifest["wall_time_s"] > 0 and manifest["created_at"] > 0
    assert ".metadata" in manifest["files"]
    for name, entry in manifest["files"].items():
        data = (ckpt / "step-00000006" / name).read_bytes()
        assert entry == {"size": len(data), "xxh3_128": xxhash.xxh3_128(data).hexdigest()}

    progress = read_json(ckpt / "progress.json")
    assert {
        k: progress[k]
        for k in ("status", "step", "steps", "tokens_seen", "resumed_from_step", "steps_lost", "attempt")
    } == {
        "status": "completed",
        "step": 6,
        "steps": 6,
        "tokens_seen": 6 * 8 * 32,
        "resumed_from_step": None,
        "steps_lost": 0,
        "attempt": 1,
    }
    assert progress["latest_checkpoint"] == str(ckpt / "step-00000006")
    assert progress["loss"] == pytest.approx(run.of("train")[-1]["loss"], abs=1e-5)

    statsd.setblocking(False)
    gauges = []
    with contextlib.suppress(BlockingIOError):
        while True:
            gauges.append(statsd.recv(1024).decode())
    statsd.close()
    lines = [parse_line(g) for g in gauges]
    losses = [value for name, value, _, _ in lines if name == "dtrain.train.loss"]
    assert losses == [e["loss"] for e in run.of("train")]
    assert any(name == "dtrain.checkpoint.seconds" for name, *_ in lines)
    # Every line carries the configured tags (DogStatsD: the run_id's ':' and '+' survive), the rest "none".
    assert all(
        {k: t[k] for k in RUN_TAGS}
        == {
            "dag_id": "d",
            "run_id": "manual__2026-01-01T00:00:00+00:00",
            "task_id": "none",
            "map_index": "none",
            "job": "j",
        }
        for *_, t in lines
    )
    # One naming scheme: every gauge is <prefix>.<a name of TRAINING_METRICS>, which the dashboards use.
    names = {name for name, *_ in lines}
    assert {
        f"dtrain.train.{n}" for n in ("loss", "grad_norm", "lr", "tokens_per_s", "peak_memory_bytes", "step")
    } <= names
    assert names <= {f"dtrain.{n}" for n in TRAINING_METRICS}, names - {
        f"dtrain.{n}" for n in TRAINING_METRICS
    }

    # The same directory cannot be resumed by another model: refused before building it.
    other = run_trainer(
        [*FAST, "--steps", "8", "--checkpoint-uri", str(ckpt), "--flavor", "llama3_1b"], data_dir
    )
    assert other.returncode == 2, other
    assert "model.flavor: 'llama3_1b' cannot resume from" in other.stderr and "'debug'" in other.stderr
    assert read_json(ckpt / "progress.json")["status"] == "completed"


def test_loss_falls_and_held_out_evaluation_agrees(data_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    run = run_trainer(
        [
            *FAST,
            "--steps",
            "60",
            "--checkpoint-uri",
            str(ckpt),
            "--set",
            "metrics.log_every=20",
            "--set",
            "micro_batch_size=8",
        ],
        data_dir,
    )
    assert run.returncode == 0, run
    losses = run.losses()
    assert losses[20] < 0.6 * math.log(256), losses
    assert losses[60] < 0.45 * math.log(256), (
        losses
    )  # byte-level English-like grammar: spelling is learnt fast

    p = subprocess.run(
        [sys.executable, "-m", "trainer.evaluate", "--checkpoint-uri", str(ckpt), "--batches", "8"],
        cwd=REPO,
        env=trainer_env(data_dir),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert result["step"] == 60 and result["tokens"] == 8 * 8 * 32
    assert result["perplexity"] == pytest.approx(math.exp(result["loss"]))
    assert result["loss"] < 0.5 * math.log(256)  # generalises to held-out text, not just memorised


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

    resumed = run_trainer(args, data_dir, nproc=2)
    assert resumed.returncode == 0, resumed
    assert resumed.of("resume") == [{"event": "resume", "from_step": s, "path": str(ckpt / f"step-{s:08d}")}]
    assert min(resumed.losses()) == s + 1
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
    """One CPU process has nothing to shard: it trains the model without FSDP2, whose copies and hooks cost 8 %
    of a step there (benchmarks/RESULTS.md), and saves plain tensors. A 2-rank group resumes that checkpoint
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


# --------------------------------------------------------------------------- signals and failures, one process


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
