"""End to end: `python -m trainer` and `python -m trainer.launch ... -m trainer` as real processes on
CPU/gloo.

What a user (or the Airflow operator) sees: exit codes, the JSON event lines, progress.json,
committed checkpoints. Stopping and resuming (and changing nothing about the result):
test_trainer_stop_resume.py.
"""

import contextlib
import xxhash
import json
import math
import socket
import subprocess
import sys

import pytest

from trainer.report.metrics import TRAINING_METRICS
from trainer.base.statsd import RUN_TAGS, parse_line
from conftest import (
    FAST,
    REPO,
    read_json,
    run_trainer,
    trainer_env,
)

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


def _run_six_steps_with_statsd(data_dir: str, ckpt):
    """Six steps, a checkpoint every 2 (keeping 2), gauges to a real UDP listener standing in for statsd:
    the run and the gauges it sent."""
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
    statsd.setblocking(False)
    gauges = []
    with contextlib.suppress(BlockingIOError):
        while True:
            gauges.append(statsd.recv(1024).decode())
    statsd.close()
    return run, gauges


def _assert_the_events(run) -> None:
    """stdout is JSON lines: one train event per step, the checkpoints, and done."""
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


def _assert_retention_and_the_manifest(ckpt) -> None:
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


def _assert_progress(ckpt, run) -> None:
    """progress.json says completed, with the run's last loss and checkpoint."""
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


def _assert_the_gauges(gauges: list[str], run) -> None:
    """The losses, the checkpoint timing, the run's tags on every line, and one naming scheme."""
    lines = [parse_line(g) for g in gauges]
    losses = [value for name, value, _, _ in lines if name == "dtrain.train.loss"]
    assert losses == [e["loss"] for e in run.of("train")]
    assert any(name == "dtrain.checkpoint.seconds" for name, *_ in lines)
    [startup] = [value for name, value, _, _ in lines if name == "dtrain.startup.seconds"]
    assert startup == pytest.approx(run.of("startup")[0]["total_s"])  # once, at the first step
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


def test_run_completes_with_events_progress_committed_checkpoints_and_statsd(data_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    run, gauges = _run_six_steps_with_statsd(data_dir, ckpt)
    assert run.returncode == 0, run
    _assert_the_events(run)
    _assert_retention_and_the_manifest(ckpt)
    _assert_progress(ckpt, run)
    _assert_the_gauges(gauges, run)

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
